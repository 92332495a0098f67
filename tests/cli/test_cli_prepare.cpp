// `gnmr prepare` end to end on a JSON Lines + gzip corpus made up here (nobody has seen it).
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <random>

#include "cli_fixture.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace {

// Sentences from a small vocabulary with digits, punctuation and non-ASCII text, so byte
// fallback and digit splitting are exercised.
std::vector<std::string> made_up_documents(int count, uint32_t seed) {
  const std::vector<std::string> words = {"the",     "river", "Ångström", "measured", "1987",
                                          "quietly", "über",  "data,",    "naïve",    "42.5%",
                                          "tokens",  "—",     "zebra",    "café",     "\"quoted\""};
  std::mt19937 rng(seed);
  std::vector<std::string> docs;
  for (int d = 0; d < count; ++d) {
    std::string text;
    int n = 5 + int(rng() % 60);
    for (int w = 0; w < n; ++w) text += (w ? " " : "") + words[rng() % words.size()];
    if (d % 7 == 0) text += "\nSecond line of a multi-line document.";
    docs.push_back(text);
  }
  return docs;
}

void write_jsonl_gz(const std::string& path, const std::vector<std::string>& docs) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string line = nlohmann::json{{"id", i}, {"text", docs[i]}, {"url", "x"}}.dump() + "\n";
    gzwrite(f, line.data(), unsigned(line.size()));
  }
  gzclose(f);
}

}  // namespace

TEST(CliPrepare, JsonlGzCorpusBecomesShardsWithTheRightTokenCounts) {
  std::string dir = gnmr_test::scratch_dir("cli_prepare_jsonl");
  auto docs = made_up_documents(400, 7);
  write_jsonl_gz(dir + "/part-0.jsonl.gz",
                 std::vector<std::string>(docs.begin(), docs.begin() + 250));
  write_jsonl_gz(dir + "/part-1.jsonl.gz",
                 std::vector<std::string>(docs.begin() + 250, docs.end()));
  std::string tokenizer_path = gnmr_test::source_path("data/brown/tokenizer.model");
  auto r = gnmr_test::run_gnmr(
      "prepare --no-progress --threads 2 --val-fraction 0.1 --shard-tokens 3000 --tokenizer " +
      tokenizer_path + " --out " + dir + "/out " + dir + "/part-0.jsonl.gz " + dir +
      "/part-1.jsonl.gz");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  auto tokenizer = gnmr::Tokenizer::load(tokenizer_path);
  int64_t expected = 0;
  for (const auto& d : docs) expected += int64_t(tokenizer.encode(d).size()) + 2;  // BOS + EOS

  auto summary = nlohmann::json::parse(gnmr_test::read_bytes(dir + "/out/prepare.json"));
  int64_t train_tokens = 0, val_tokens = 0, documents = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/out")) {
    std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".bin") continue;
    gnmr::ShardReader shard(entry.path().string());
    EXPECT_EQ(shard.vocab_size(), tokenizer.vocab_size());
    for (int64_t i = 0; i < shard.token_count(); ++i)
      documents += shard.token(i) == tokenizer.bos_id();
    (name.rfind("train_", 0) == 0 ? train_tokens : val_tokens) += shard.token_count();
  }
  EXPECT_EQ(train_tokens + val_tokens, expected);
  EXPECT_EQ(documents, int64_t(docs.size()));
  EXPECT_GT(val_tokens, 0);
  EXPECT_LT(val_tokens, expected / 4);
  EXPECT_EQ(summary["train_tokens"].get<int64_t>(), train_tokens) << summary.dump();
  EXPECT_EQ(summary["val_tokens"].get<int64_t>(), val_tokens) << summary.dump();

  // Running it again into the same directory is refused and loses nothing.
  const std::string before = gnmr_test::read_bytes(dir + "/out/prepare.json");
  auto again = gnmr_test::run_gnmr("prepare --no-progress --tokenizer " + tokenizer_path +
                                   " --out " + dir + "/out " + dir + "/part-0.jsonl.gz");
  EXPECT_EQ(again.exit_code, 4) << again.output;
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/out/prepare.json"), before);
}

TEST(CliTokenizer, TrainsABpeModelThatPrepareAccepts) {
  std::string dir = gnmr_test::scratch_dir("cli_tokenizer");
  std::ofstream text(dir + "/corpus.txt");
  for (int i = 0; i < 400; ++i)
    text << "Line " << i << " of a small corpus about rivers, 1987 and cafés.\n";
  text.close();
  auto r = gnmr_test::run_gnmr("tokenizer train --vocab-size 300 --out " + dir + "/tok " + dir +
                               "/corpus.txt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto tokenizer = gnmr::Tokenizer::load(dir + "/tok.model");
  EXPECT_EQ(tokenizer.vocab_size(), 300);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("Line 7 of a café")), "Line 7 of a café");
  auto prepared = gnmr_test::run_gnmr("prepare --no-progress --tokenizer " + dir +
                                      "/tok.model --out " + dir + "/shards " + dir + "/corpus.txt");
  EXPECT_EQ(prepared.exit_code, 0) << prepared.output;
  auto missing =
      gnmr_test::run_gnmr("tokenizer train --vocab-size 300 --out " + dir + "/x /nonexistent.txt");
  EXPECT_EQ(missing.exit_code, 4) << missing.output;
  // A second training onto the same prefix is refused before it trains, and the model the
  // shards were cut with is left as it was.
  const std::string model_before = gnmr_test::read_bytes(dir + "/tok.model");
  auto again = gnmr_test::run_gnmr("tokenizer train --vocab-size 280 --out " + dir + "/tok " + dir +
                                   "/corpus.txt");
  EXPECT_EQ(again.exit_code, 4) << again.output;
  EXPECT_NE(again.output.find("tok.model already exists"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("training a"), std::string::npos) << again.output;
  EXPECT_EQ(gnmr_test::read_bytes(dir + "/tok.model"), model_before);
}

// SIGTERM (or SIGINT, SIGHUP) in the middle: once it killed prepare where it stood, leaving the
// shards published so far as a dataset that train read without a word, and .tmp files.
TEST(CliPrepare, ASignalMidRunRemovesItsShardsAndEndsTheProcessByThatSignal) {
  namespace fs = std::filesystem;
  const std::string dir = gnmr_test::scratch_dir("cli_prepare_signal");
  const std::string brown = gnmr_test::source_path("data/brown/brown.jsonl.gz");
  std::string inputs;
  for (int i = 0; i < 12; ++i) inputs += " '" + brown + "'";  // ~18M tokens: many seconds
  // The shell waits for the first published shard, so the signal lands mid-run.
  const std::string script = "'" + gnmr_test::gnmr_binary() + "' prepare --tokenizer '" +
                             gnmr_test::source_path("data/brown/tokenizer.model") + "' --out '" +
                             dir + "/out' --threads 1 --shard-tokens 20000 --no-progress" + inputs +
                             " 2>'" + dir + "/stderr' & pid=$!; " +
                             "for i in $(seq 1 1200); do ls '" + dir +
                             "'/out/train_000000.bin >/dev/null 2>&1 && break; sleep 0.05; done; " +
                             "kill -TERM $pid; wait $pid; echo rc=$?";
  std::ofstream(dir + "/run.sh") << script << "\n";
  auto r = gnmr_test::run_command("bash '" + dir + "/run.sh'");
  const std::string stderr_text = gnmr_test::read_bytes(dir + "/stderr");
  EXPECT_NE(r.output.find("rc=143"), std::string::npos) << r.output << stderr_text;  // 128 + 15
  EXPECT_NE(stderr_text.find("prepare: stopped by signal 15; the shards written so far were "
                             "removed"),
            std::string::npos)
      << stderr_text;
  EXPECT_FALSE(fs::exists(dir + "/out")) << "shards, .tmp files or the directory were left";
}
