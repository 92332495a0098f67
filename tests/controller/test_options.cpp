// The `gnmr` config section: defaults, round trip, and errors that name the key.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "controller/controller.h"
#include "controller/controller_options.h"
#include "controller/policy.h"

namespace gnmr {
namespace {

using nlohmann::json;

std::string error_of(const json& section) {
  try {
    controller_options_from_json(section);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ControllerOptionsJson, DefaultsParseToTheDefaultStruct) {
  const ControllerOptions parsed = controller_options_from_json(controller_options_defaults());
  EXPECT_EQ(controller_options_to_json(parsed), controller_options_to_json(ControllerOptions{}));
  EXPECT_TRUE(std::isnan(parsed.alpha_final));  // null = same as alpha
  const ControllerOptions empty = controller_options_from_json(json::object());
  EXPECT_EQ(empty.controller, "gnmr");
  EXPECT_EQ(empty.window, 8);
  EXPECT_EQ(empty.lock_steps, 10);
  EXPECT_EQ(empty.warmup_steps, 20);
  EXPECT_EQ(empty.history_start, 0);                                // the paper's whole history
  EXPECT_EQ(controller_options_defaults().at("history_start"), 0);  // so the schema knows it
  EXPECT_EQ(empty.alpha, 1.5);
  EXPECT_EQ(empty.beta, 1.5);
}

TEST(ControllerOptionsJson, EveryKeyRoundTrips) {
  const json section = {{"controller", "random"},
                        {"max_active", 0.25},
                        {"alpha", 2.0},
                        {"beta", 3.0},
                        {"window", 4},
                        {"lock_steps", 0},
                        {"warmup_steps", 5},
                        {"history_start", 40},
                        {"threshold_schedule", "cosine"},
                        {"alpha_final", 1.2},
                        {"beta_final", 1.1},
                        {"schedule_steps", 1000},
                        {"ranking", "sum_ratio"},
                        {"history", "capped"},
                        {"granularity", "group"},
                        {"per_kind_cap", {{"down", 2}, {"q", 0}}},
                        {"seed", 42},
                        {"oracle_same_step", false}};
  const ControllerOptions o = controller_options_from_json(section);
  EXPECT_EQ(controller_options_to_json(o), section);
  EXPECT_EQ(o.per_kind_cap.at("down"), 2);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_EQ(o.history_start, 40);
  EXPECT_EQ(controller_options_from_json(json{{"window", 8.0}}).window, 8);  // integral float
  const json oracle = {{"controller", "oracle"}, {"oracle_same_step", true}};
  EXPECT_TRUE(controller_options_from_json(oracle).oracle_same_step);
  EXPECT_EQ(controller_options_to_json(controller_options_from_json(oracle))["oracle_same_step"],
            true);
}

// The names map to the enums by their position in controller_options.cpp's lists: each name's
// value, spelled out, so a list reordered or an enum grown in one place only fails here.
TEST(ControllerOptionsJson, EachNameParsesToItsOwnEnumValue) {
  const std::pair<const char*, ControllerKind> kinds[] = {
      {"gnmr", ControllerKind::Gnmr},
      {"static_low", ControllerKind::StaticLow},
      {"static_high", ControllerKind::StaticHigh},
      {"random", ControllerKind::Random},
      {"topk_norm", ControllerKind::TopkNorm},
      {"gnmr_no_delta", ControllerKind::GnmrNoDelta},
      {"gnmr_no_lock", ControllerKind::GnmrNoLock},
      {"oracle", ControllerKind::Oracle}};
  for (const auto& [name, kind] : kinds) EXPECT_EQ(parse_controller_kind(name), kind) << name;
  EXPECT_EQ(parse_threshold_schedule("constant"), ThresholdSchedule::Constant);
  EXPECT_EQ(parse_threshold_schedule("linear"), ThresholdSchedule::Linear);
  EXPECT_EQ(parse_threshold_schedule("cosine"), ThresholdSchedule::Cosine);
  EXPECT_EQ(parse_ranking_key("max_ratio"), RankingKey::MaxRatio);
  EXPECT_EQ(parse_ranking_key("sum_ratio"), RankingKey::SumRatio);
  EXPECT_EQ(parse_ranking_key("gnmr"), RankingKey::Gnmr);
  EXPECT_EQ(parse_ranking_key("delta"), RankingKey::Delta);
  EXPECT_EQ(parse_history_mode("raw"), HistoryMode::Raw);
  EXPECT_EQ(parse_history_mode("capped"), HistoryMode::Capped);
  EXPECT_EQ(parse_granularity("projection"), Granularity::Projection);
  EXPECT_EQ(parse_granularity("group"), Granularity::Group);
}

TEST(ControllerOptionsJson, ErrorsNameTheKey) {
  EXPECT_NE(error_of({{"bogus", 1}}).find("gnmr.bogus: unknown key"), std::string::npos);
  EXPECT_EQ(error_of({{"max_active", -1}}), "gnmr.max_active: must be >= 0 (got -1)");
  EXPECT_NE(error_of({{"max_active", 2.5}}).find("gnmr.max_active"), std::string::npos);
  EXPECT_NE(error_of({{"alpha", 0}}).find("gnmr.alpha: must be > 0"), std::string::npos);
  EXPECT_NE(error_of({{"beta", -2}}).find("gnmr.beta"), std::string::npos);
  EXPECT_NE(error_of({{"window", 0}}).find("gnmr.window: must be >= 1"), std::string::npos);
  EXPECT_NE(error_of({{"window", 8.5}}).find("gnmr.window: must be an integer"), std::string::npos);
  EXPECT_NE(error_of({{"window", "8"}}).find("gnmr.window"), std::string::npos);
  EXPECT_NE(error_of({{"lock_steps", -1}}).find("gnmr.lock_steps"), std::string::npos);
  EXPECT_NE(error_of({{"warmup_steps", -3}}).find("gnmr.warmup_steps"), std::string::npos);
  EXPECT_EQ(error_of({{"history_start", -1}}), "gnmr.history_start: must be >= 0 (got -1)");
  EXPECT_NE(error_of({{"history_start", 4.5}}).find("gnmr.history_start: must be an integer"),
            std::string::npos);
  EXPECT_EQ(error_of({{"history_start", 0}}), "");
  ControllerOptions negative_start;
  negative_start.history_start = -1;
  EXPECT_THROW(validate_controller_options(negative_start), std::invalid_argument);
  EXPECT_NE(error_of({{"controller", "gnmrr"}}).find("gnmr.controller: must be one of"),
            std::string::npos);
  EXPECT_NE(error_of({{"ranking", 3}}).find("gnmr.ranking"), std::string::npos);
  EXPECT_NE(error_of({{"threshold_schedule", "linear"}}).find("gnmr.schedule_steps: must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of({{"per_kind_cap", {{"downn", 1}}}}).find("gnmr.per_kind_cap.downn"),
            std::string::npos);
  EXPECT_NE(error_of({{"per_kind_cap", {{"down", -1}}}}).find("gnmr.per_kind_cap.down"),
            std::string::npos);
  EXPECT_NE(error_of({{"per_kind_cap", 2}}).find("gnmr.per_kind_cap"), std::string::npos);
  EXPECT_NE(error_of({{"seed", -1}}).find("gnmr.seed"), std::string::npos);
  EXPECT_NE(error_of({{"controller", "gnmr_no_delta"}, {"ranking", "delta"}}).find("gnmr.ranking"),
            std::string::npos);
  EXPECT_NE(error_of(json::array()).find("gnmr"), std::string::npos);
  EXPECT_EQ(error_of({{"oracle_same_step", true}}),
            "gnmr.oracle_same_step: applies only to controller \"oracle\" (controller is "
            "\"gnmr\")");
  EXPECT_NE(error_of({{"controller", "oracle"}, {"oracle_same_step", 1}})
                .find("gnmr.oracle_same_step: must be true or false"),
            std::string::npos);
}

TEST(ControllerOptionsBudget, FractionsRoundDownAndCountsClampToTheUnitCount) {
  EXPECT_EQ(resolve_budget(0.0, 14), 0);
  EXPECT_EQ(resolve_budget(0.1, 28), 2);  // floor(2.8): the active fraction never exceeds 0.1
  EXPECT_EQ(resolve_budget(0.25, 14), 3);
  EXPECT_EQ(resolve_budget(0.05, 14), 0);
  EXPECT_EQ(resolve_budget(1.0, 14), 1);
  EXPECT_EQ(resolve_budget(3.0, 14), 3);
  EXPECT_EQ(resolve_budget(100.0, 14), 14);
}

TEST(ControllerOptionsBudget, ACountAboveTheModelsUnitsIsRefusedNamingBoth) {
  EXPECT_NO_THROW(validate_budget(14.0, 14));  // every unit: allowed
  EXPECT_NO_THROW(validate_budget(0.99, 14));  // a fraction always fits
  EXPECT_NO_THROW(validate_budget(0.0, 14));
  std::string message;
  try {
    validate_budget(20.0, 14);
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("gnmr.max_active"), std::string::npos) << message;
  EXPECT_NE(message.find("20"), std::string::npos) << message;
  EXPECT_NE(message.find("14 projection units"), std::string::npos) << message;

  ControllerOptions options;
  options.max_active = 15;  // a 2-layer model has 14 units
  EXPECT_THROW(Controller(options, 2), std::invalid_argument);
  options.max_active = 14;
  EXPECT_NO_THROW(Controller(options, 2));
}

TEST(ThresholdSchedule, ConstantLinearAndCosineMoveFromStartToFinal) {
  ControllerOptions o;
  o.alpha = 2.0;
  o.beta = 3.0;
  o.alpha_final = 1.0;
  o.beta_final = 1.0;
  o.schedule_steps = 100;
  EXPECT_EQ(thresholds_at(o, 50).alpha, 2.0);  // constant ignores the finals
  o.threshold_schedule = "linear";
  EXPECT_EQ(thresholds_at(o, 0).alpha, 2.0);
  EXPECT_DOUBLE_EQ(thresholds_at(o, 25).alpha, 1.75);
  EXPECT_DOUBLE_EQ(thresholds_at(o, 50).beta, 2.0);
  EXPECT_EQ(thresholds_at(o, 100).alpha, 1.0);
  EXPECT_EQ(thresholds_at(o, 5000).alpha, 1.0);  // clamped after the schedule
  o.threshold_schedule = "cosine";
  EXPECT_DOUBLE_EQ(thresholds_at(o, 0).alpha, 2.0);
  EXPECT_DOUBLE_EQ(thresholds_at(o, 50).alpha, 1.5);
  EXPECT_DOUBLE_EQ(thresholds_at(o, 100).beta, 1.0);
  EXPECT_GT(thresholds_at(o, 25).alpha, 1.75);  // cosine moves slowly at first
}

}  // namespace
}  // namespace gnmr
