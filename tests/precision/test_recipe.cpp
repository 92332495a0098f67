// Precision recipes (src/precision/recipe.h): defaults, each recipe's paths, errors that name
// the key, and the per-unit group size.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "precision/recipe.h"

namespace gnmr {
namespace {

using nlohmann::json;

// The message of the std::invalid_argument recipe_from_json throws, or "" if none.
std::string error_of(const json& section) {
  try {
    recipe_from_json(section);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Recipe, DefaultsAreFp32WithNoLowPath) {
  const PrecisionRecipe r = recipe_from_json(json::object());
  EXPECT_EQ(r.name, "fp32");
  EXPECT_FALSE(r.has_low_path);
  EXPECT_EQ(r.recovery.kind, PathKind::kBackendGemm);
  EXPECT_EQ(recipe_defaults().at("recipe"), "fp32");
  EXPECT_EQ(recipe_defaults().at("low_bits"), 4);
}

TEST(Recipe, EachNamedRecipeHasItsDocumentedPaths) {
  const PrecisionRecipe bf16 = recipe_by_name("bf16");
  EXPECT_FALSE(bf16.has_low_path);
  EXPECT_EQ(bf16.recovery.kind, PathKind::kBf16Gemm);

  const PrecisionRecipe actq = recipe_by_name("actq");
  EXPECT_TRUE(actq.has_low_path);
  EXPECT_EQ(actq.low.kind, PathKind::kSavedIntGroupwise);
  EXPECT_EQ(actq.low.saved.bits, 4);
  EXPECT_EQ(actq.low.saved.group_size, 128);
  EXPECT_FALSE(actq.low.saved.stochastic);
  EXPECT_EQ(actq.recovery.kind, PathKind::kSavedIntGroupwise);
  EXPECT_EQ(actq.recovery.saved.bits, 8);

  const PrecisionRecipe fp8mix = recipe_by_name("fp8mix");
  EXPECT_EQ(fp8mix.low.kind, PathKind::kFineGrainedFp);
  EXPECT_EQ(fp8mix.low.format, FpFormat::kE3M2);
  EXPECT_EQ(fp8mix.recovery.format, FpFormat::kE4M3);
  EXPECT_EQ(fp8mix.low.tile, 128);

  const PrecisionRecipe int8 = recipe_by_name("int8");
  EXPECT_EQ(int8.low.kind, PathKind::kInt8Gemm);
  EXPECT_EQ(int8.recovery.kind, PathKind::kBf16Gemm);
}

TEST(Recipe, PathParametersAreConfigurable) {
  const PrecisionRecipe a = recipe_from_json({{"recipe", "actq"},
                                              {"low_bits", 2},
                                              {"low_group_size", 0},
                                              {"recovery_bits", 0},
                                              {"stochastic_rounding", true},
                                              {"seed", 99}});
  EXPECT_EQ(a.low.saved.bits, 2);
  EXPECT_EQ(a.low.saved.group_size, kGroupRow);
  EXPECT_TRUE(a.low.saved.stochastic);
  EXPECT_EQ(a.recovery.kind, PathKind::kBackendGemm);  // recovery_bits 0 = full precision
  EXPECT_EQ(a.seed, 99u);
  EXPECT_EQ(recipe_from_json({{"recipe", "actq"}, {"low_group_size", -1}}).low.saved.group_size,
            kGroupTensor);
  const PrecisionRecipe f =
      recipe_from_json({{"recipe", "fp8mix"}, {"low_format", "e2m1"}, {"tile", 64}});
  EXPECT_EQ(f.low.format, FpFormat::kE2M1);
  EXPECT_EQ(f.recovery.tile, 64);
  EXPECT_EQ(f.low.describe(), "fp e2m1 1x64/64x64");
}

TEST(Recipe, ErrorsNameTheKey) {
  EXPECT_NE(error_of({{"recipe", "fp2"}}).find("\"precision.recipe\""), std::string::npos);
  EXPECT_NE(error_of({{"low_bits", 12}}).find("\"precision.low_bits\""), std::string::npos);
  EXPECT_NE(error_of({{"low_bits", 1.5}}).find("\"precision.low_bits\""), std::string::npos);
  EXPECT_NE(error_of({{"recovery_bits", 1}}).find("\"precision.recovery_bits\""),
            std::string::npos);
  EXPECT_NE(error_of({{"low_bits", 0}}).find("\"precision.low_bits\""), std::string::npos);
  EXPECT_NE(error_of({{"low_group_size", -3}}).find("\"precision.low_group_size\""),
            std::string::npos);
  EXPECT_NE(error_of({{"low_format", "e9m9"}}).find("\"precision.low_format\""), std::string::npos);
  EXPECT_NE(error_of({{"tile", 0}}).find("\"precision.tile\""), std::string::npos);
  EXPECT_NE(error_of({{"seed", -1}}).find("\"precision.seed\""), std::string::npos);
  EXPECT_NE(error_of({{"stochastic_rounding", 1}}).find("\"precision.stochastic_rounding\""),
            std::string::npos);
  EXPECT_NE(error_of({{"low_bitz", 4}}).find("\"precision.low_bitz\""), std::string::npos);
  // A bad key of another recipe still fails, before a long run starts.
  EXPECT_NE(error_of({{"recipe", "fp32"}, {"low_format", "fp4"}}).find("precision.low_format"),
            std::string::npos);
}

// An integer past what its field holds is refused, never wrapped or truncated: 2^32 as an int
// was layer 0 once, and 2^64 - 1 read as int64 is -1.
TEST(Recipe, IntegersTooLargeForTheirFieldAreErrorsNotWraps) {
  EXPECT_EQ(error_of({{"recovery_layers", {4294967296LL}}}),
            "\"precision.recovery_layers\" holds a layer index out of range (got 4294967296)");
  EXPECT_EQ(error_of({{"recovery_layers", {-4294967297LL}}}),
            "\"precision.recovery_layers\" holds a layer index out of range (got -4294967297)");
  EXPECT_EQ(error_of({{"low_bits", json::parse("18446744073709551615")}}),
            "\"precision.low_bits\" is out of range (got 18446744073709551615)");
  EXPECT_EQ(error_of({{"seed", json::parse("9223372036854775808")}}),
            "\"precision.seed\" is out of range (got 9223372036854775808)");
  EXPECT_EQ(recipe_from_json({{"recovery_layers", {0, -1}}}).recovery_layers,
            (std::vector<int>{0, -1}));
}

TEST(Recipe, GroupSizeShrinksToTheLargestDivisorOfTheWidth) {
  const GroupwiseSpec g128{4, 128, false};
  EXPECT_EQ(groupwise_spec_for_width(g128, 512).group_size, 128);
  EXPECT_EQ(groupwise_spec_for_width(g128, 172).group_size, 86);  // tiny ffn_dim
  EXPECT_EQ(groupwise_spec_for_width(g128, 64).group_size, 64);
  EXPECT_EQ(groupwise_spec_for_width(g128, 1376).group_size, 86);  // llama2-60m ffn_dim
  EXPECT_EQ(groupwise_spec_for_width(GroupwiseSpec{4, kGroupRow, false}, 172).group_size,
            kGroupRow);
}

}  // namespace
}  // namespace gnmr
