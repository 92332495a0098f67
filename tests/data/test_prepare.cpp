// prepare: corpus -> shards. On the bundled Brown corpus: counts, BOS/EOS framing, a
// disjoint split, thread-count independence, and a loader over the result. On small
// made-up gz inputs: document boundaries. And the refusals.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "data/document_reader.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "data_test_helpers.h"
#include "test_paths.h"
#include "util/directory_lock.h"

namespace fs = std::filesystem;

namespace {

const std::string kBrownCorpus = "data/brown/brown.jsonl.gz";
const std::string kBrownTokenizer = "data/brown/tokenizer.model";
constexpr int kBrownVocab = 4096;

gnmr::PrepareOptions brown_options(const std::string& out_dir, int threads) {
  gnmr::PrepareOptions options;
  options.tokenizer = gnmr_test::source_path(kBrownTokenizer);
  options.out_dir = out_dir;
  options.inputs = {gnmr_test::source_path(kBrownCorpus)};
  options.val_fraction = 0.05;  // ~25 of 500 documents, so val has several shards' worth
  options.seed = 7;
  options.threads = threads;
  options.shard_tokens = 300'000;  // several train shards from ~1.5M tokens
  options.progress = false;
  return options;
}

std::vector<int32_t> all_tokens(const std::string& path) {
  gnmr::ShardReader reader(path);
  std::vector<int32_t> tokens(reader.token_count());
  reader.copy_tokens(0, reader.token_count(), tokens.data());
  return tokens;
}

// Splits a shard's tokens into documents, checking each is exactly BOS ... EOS.
std::vector<std::vector<int32_t>> documents_of(const std::string& path) {
  const auto tokens = all_tokens(path);
  std::vector<std::vector<int32_t>> documents;
  size_t i = 0;
  while (i < tokens.size()) {
    EXPECT_EQ(tokens[i], 1) << path << ": token " << i << " should open a document with BOS";
    size_t end = i + 1;
    while (end < tokens.size() && tokens[end] != 2) {
      EXPECT_NE(tokens[end], 1) << path << ": BOS inside a document at " << end;
      ++end;
    }
    EXPECT_LT(end, tokens.size()) << path << ": last document has no EOS";
    documents.emplace_back(tokens.begin() + i + 1, tokens.begin() + std::min(end, tokens.size()));
    i = end + 1;
  }
  return documents;
}

class PrepareBrown : public ::testing::Test {
 protected:
  // One prepare run shared by the tests below (the expensive part).
  // ctest runs each test in its own process, several at once: the pid keeps their
  // output directories apart.
  static void SetUpTestSuite() {
    out_dir_ =
        new std::string(gnmr_test::scratch_dir("prepare_brown_t2_" + std::to_string(::getpid())));
    summary_ = new gnmr::PrepareSummary(gnmr::run_prepare(brown_options(*out_dir_, 2)));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*out_dir_);
    delete out_dir_;
    delete summary_;
  }
  static std::string* out_dir_;
  static gnmr::PrepareSummary* summary_;
};
std::string* PrepareBrown::out_dir_ = nullptr;
gnmr::PrepareSummary* PrepareBrown::summary_ = nullptr;

}  // namespace

TEST_F(PrepareBrown, TokenCountsInPrepareJsonEqualTheSumOverShards) {
  const auto record = nlohmann::json::parse(gnmr_test::read_bytes(*out_dir_ + "/prepare.json"));
  EXPECT_EQ(record["documents"].get<int64_t>(), 500);  // one per Brown file
  EXPECT_EQ(record["vocab_size"].get<int>(), kBrownVocab);
  ASSERT_GE(summary_->train_shards.size(), 3u);
  ASSERT_GE(summary_->val_shards.size(), 1u);
  int64_t train_tokens = 0, val_tokens = 0;
  for (const auto& name : record["train_shards"]) {
    gnmr::ShardReader shard(*out_dir_ + "/" + name.get<std::string>());
    EXPECT_EQ(shard.vocab_size(), kBrownVocab);
    train_tokens += shard.token_count();
  }
  for (const auto& name : record["val_shards"]) {
    val_tokens += gnmr::ShardReader(*out_dir_ + "/" + name.get<std::string>()).token_count();
  }
  EXPECT_EQ(record["train_tokens"].get<int64_t>(), train_tokens);
  EXPECT_EQ(record["val_tokens"].get<int64_t>(), val_tokens);
  EXPECT_EQ(summary_->train_tokens, train_tokens);
  EXPECT_EQ(summary_->val_tokens, val_tokens);
  EXPECT_GT(train_tokens, 1'000'000);  // the Brown corpus is ~1M words
}

TEST_F(PrepareBrown, EveryDocumentIsBosTokensEosAndTheSplitIsDisjoint) {
  const auto tokenizer = gnmr::Tokenizer::load(gnmr_test::source_path(kBrownTokenizer));
  std::set<std::string> train_texts, val_texts;
  for (const auto& path : summary_->train_shards) {
    for (const auto& doc : documents_of(path)) train_texts.insert(tokenizer.decode(doc));
  }
  for (const auto& path : summary_->val_shards) {
    for (const auto& doc : documents_of(path)) val_texts.insert(tokenizer.decode(doc));
  }
  EXPECT_EQ(static_cast<int64_t>(train_texts.size()), summary_->train_documents);
  EXPECT_EQ(static_cast<int64_t>(val_texts.size()), summary_->val_documents);
  EXPECT_EQ(summary_->train_documents + summary_->val_documents, 500);
  EXPECT_GT(summary_->val_documents, 5);  // 5% of 500, give or take the hash
  for (const auto& text : val_texts) EXPECT_EQ(train_texts.count(text), 0u) << "leaked: " << text;
  EXPECT_EQ(train_texts.count(""), 0u);
}

TEST_F(PrepareBrown, OutputIsByteIdenticalWithOneThread) {
  const std::string one_thread =
      gnmr_test::scratch_dir("prepare_brown_t1_" + std::to_string(::getpid()));
  gnmr::run_prepare(brown_options(one_thread, 1));
  std::set<std::string> names_two, names_one;
  for (const auto& e : fs::directory_iterator(*out_dir_)) names_two.insert(e.path().filename());
  for (const auto& e : fs::directory_iterator(one_thread)) names_one.insert(e.path().filename());
  EXPECT_EQ(names_one, names_two);
  for (const auto& name : names_two) {
    EXPECT_TRUE(gnmr_test::read_bytes(*out_dir_ + "/" + name) ==
                gnmr_test::read_bytes(one_thread + "/" + name))
        << name << " differs between threads=1 and threads=2";
  }
  fs::remove_all(one_thread);
}

TEST_F(PrepareBrown, LoaderReadsTheShardsItWrote) {
  constexpr int seq_len = 64, micro_batch = 4;
  gnmr::TokenLoader loader(*out_dir_ + "/train_*.bin", seq_len, kBrownVocab, "random", 1, 0, 1);
  EXPECT_EQ(loader.total_tokens(), summary_->train_tokens);
  std::vector<int32_t> tokens(micro_batch * seq_len), targets(micro_batch * seq_len);
  loader.next_batch_at(0, 0, micro_batch, tokens.data(), targets.data());
  for (int r = 0; r < micro_batch; ++r) {
    for (int t = 0; t + 1 < seq_len; ++t) {
      EXPECT_EQ(targets[r * seq_len + t], tokens[r * seq_len + t + 1]);
    }
  }
  gnmr::TokenLoader val(*out_dir_ + "/val_*.bin", seq_len, kBrownVocab, "sequential", 1, 0, 1);
  EXPECT_EQ(val.total_tokens(), summary_->val_tokens);
  EXPECT_GT(val.num_eval_windows(), 0);
}

TEST_F(PrepareBrown, RefusesAnOutDirThatAlreadyHoldsShards) {
  const std::string before = gnmr_test::read_bytes(summary_->train_shards.front());
  gnmr_test::expect_data_error([&] { gnmr::run_prepare(brown_options(*out_dir_, 2)); },
                               {*out_dir_, "already holds"});
  EXPECT_TRUE(gnmr_test::read_bytes(summary_->train_shards.front()) == before);
}

TEST(Prepare, SplitsGzippedPlainTextIntoDocumentsAtBlankLines) {
  const std::string dir = gnmr_test::scratch_dir("prepare_text_gz");
  const std::vector<std::string> documents = {"First document.\nIt has two lines.",
                                              "Second document after three blank lines.",
                                              "Third, with   inner  spaces kept."};
  gnmr_test::write_gzip(dir + "/corpus.txt.gz",
                        documents[0] + "\n\n" + documents[1] + "\n\n\n\n" + documents[2] + "\n\n");
  gnmr::PrepareOptions options;
  options.tokenizer = gnmr_test::source_path(kBrownTokenizer);
  options.out_dir = dir + "/out";
  options.inputs = {dir + "/corpus.txt.gz"};
  options.val_fraction = 0.0;
  options.progress = false;
  const auto summary = gnmr::run_prepare(options);
  EXPECT_EQ(summary.documents, 3);
  EXPECT_EQ(summary.val_tokens, 0);
  EXPECT_TRUE(summary.val_shards.empty());
  ASSERT_EQ(summary.train_shards.size(), 1u);
  const auto tokenizer = gnmr::Tokenizer::load(options.tokenizer);
  const auto decoded = documents_of(summary.train_shards[0]);
  ASSERT_EQ(decoded.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(tokenizer.decode(decoded[i]), documents[i]);
}

TEST(Prepare, ReadsJsonlGzWithAnExplicitSplit) {
  const std::string dir = gnmr_test::scratch_dir("prepare_jsonl_gz");
  std::string jsonl;
  for (int i = 0; i < 60; ++i) {
    jsonl += nlohmann::json{{"text", "Record number " + std::to_string(i) + " says hello."},
                            {"url", "https://example.com/" + std::to_string(i)}}
                 .dump() +
             "\n";
  }
  gnmr_test::write_gzip(dir + "/c4-like.jsonl.gz", jsonl);
  gnmr::PrepareOptions options;
  options.tokenizer = gnmr_test::source_path(kBrownTokenizer);
  options.out_dir = dir + "/out";
  options.inputs = {dir + "/c4-like.jsonl.gz"};
  options.val_fraction = 0.3;
  options.threads = 3;
  options.progress = false;
  const auto summary = gnmr::run_prepare(options);
  EXPECT_EQ(summary.documents, 60);
  EXPECT_GT(summary.val_documents, 5);
  EXPECT_GT(summary.train_documents, 20);
  const auto tokenizer = gnmr::Tokenizer::load(options.tokenizer);
  std::set<std::string> seen;
  for (const auto* shards : {&summary.train_shards, &summary.val_shards}) {
    for (const auto& path : *shards) {
      for (const auto& doc : documents_of(path)) seen.insert(tokenizer.decode(doc));
    }
  }
  EXPECT_EQ(seen.size(), 60u);
  EXPECT_EQ(seen.count("Record number 17 says hello."), 1u);
}

TEST(Prepare, JsonlLineWithoutTextIsADataErrorNamingFileAndLine) {
  const std::string dir = gnmr_test::scratch_dir("prepare_no_text");
  gnmr_test::write_text(dir + "/bad.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n");
  gnmr::PrepareOptions options;
  options.tokenizer = gnmr_test::source_path(kBrownTokenizer);
  options.out_dir = dir + "/out";
  options.inputs = {dir + "/bad.jsonl"};
  options.progress = false;
  gnmr_test::expect_data_error([&] { gnmr::run_prepare(options); },
                               {dir + "/bad.jsonl:2", "\"text\""});
  EXPECT_FALSE(fs::exists(dir + "/out"))
      << "a failed prepare must leave no shards behind, nor the directory it made";
}

TEST(Prepare, MissingInputIsADataErrorNamingIt) {
  const std::string dir = gnmr_test::scratch_dir("prepare_missing");
  gnmr::PrepareOptions options;
  options.tokenizer = gnmr_test::source_path(kBrownTokenizer);
  options.out_dir = dir + "/out";
  options.inputs = {dir + "/nowhere.jsonl.gz"};
  gnmr_test::expect_data_error([&] { gnmr::run_prepare(options); }, {dir + "/nowhere.jsonl.gz"});
}

namespace {

gnmr::PrepareOptions small_options(const std::string& dir, std::vector<std::string> inputs) {
  gnmr::PrepareOptions options;
  options.tokenizer = gnmr_test::source_path(kBrownTokenizer);
  options.out_dir = dir + "/out";
  options.inputs = std::move(inputs);
  options.val_fraction = 0.0;
  options.progress = false;
  return options;
}

}  // namespace

TEST(Prepare, InvalidUtf8IsTokenizedAsReplacementCharactersCountedAndLocated) {
  const std::string dir = gnmr_test::scratch_dir("prepare_invalid_utf8");
  // Line 3 holds a lone continuation byte, line 5 (in the second document) a Latin-1 "é".
  gnmr_test::write_text(dir + "/latin1.txt",
                        "Clean first line.\nStill clean.\nBad \x80 byte.\n\nCaf\xE9 au lait.\n");
  gnmr_test::write_gzip(dir + "/clean.jsonl.gz", "{\"text\": \"All valid: caf\\u00e9.\"}\n");
  auto options = small_options(dir, {dir + "/clean.jsonl.gz", dir + "/latin1.txt"});
  const auto summary = gnmr::run_prepare(options);
  EXPECT_EQ(summary.documents, 3);
  EXPECT_EQ(summary.invalid_utf8_lines, 2);
  EXPECT_EQ(summary.first_invalid_utf8_line, dir + "/latin1.txt:3");
  const auto record = nlohmann::json::parse(gnmr_test::read_bytes(dir + "/out/prepare.json"));
  EXPECT_EQ(record["invalid_utf8_lines"], 2);
  // The shards hold exactly what the tokenizer makes of the text with U+FFFD in place.
  const auto tokenizer = gnmr::Tokenizer::load(options.tokenizer);
  const auto decoded = documents_of(summary.train_shards[0]);
  ASSERT_EQ(decoded.size(), 3u);
  EXPECT_EQ(decoded[1],
            tokenizer.encode("Clean first line.\nStill clean.\nBad \xEF\xBF\xBD byte."));
  EXPECT_EQ(decoded[2], tokenizer.encode("Caf\xEF\xBF\xBD au lait."));
}

TEST(Prepare, APlainFileNamedGzIsADataErrorNamingIt) {
  const std::string dir = gnmr_test::scratch_dir("prepare_not_gzip");
  gnmr_test::write_text(dir + "/corpus.txt.gz", "plain text, not gzip\n");
  gnmr_test::write_text(dir + "/empty.jsonl.gz", "");
  for (const char* name : {"/corpus.txt.gz", "/empty.jsonl.gz"}) {
    auto options = small_options(dir, {dir + name});
    gnmr_test::expect_data_error([&] { gnmr::run_prepare(options); }, {dir + name, "not gzip"});
    EXPECT_FALSE(fs::exists(dir + "/out/prepare.json"));
  }
}

TEST(Prepare, InputsWithoutADocumentAreADataErrorAndWriteNothing) {
  const std::string dir = gnmr_test::scratch_dir("prepare_no_documents");
  gnmr_test::write_text(dir + "/empty.txt", "");
  gnmr_test::write_text(dir + "/blank.txt", "\n  \n\t\n");
  gnmr_test::write_text(dir + "/empty_texts.jsonl", "{\"text\": \"\"}\n\n{\"text\": \"\"}\n");
  for (const char* name : {"/empty.txt", "/blank.txt", "/empty_texts.jsonl"}) {
    auto options = small_options(dir, {dir + name});
    gnmr_test::expect_data_error([&] { gnmr::run_prepare(options); }, {dir + name, "no documents"});
    EXPECT_FALSE(fs::exists(dir + "/out")) << name << ": the output directory it made is left";
  }
}

TEST(Prepare, ANulByteStaysInItsLineAndTheLinesAfterItAreCountedRight) {
  const std::string dir = gnmr_test::scratch_dir("prepare_nul_byte");
  // NUL is valid UTF-8 (U+0000). A reader that measures lines with strlen would cut line 1
  // at it, join "second line" onto "first abc" and number the bad byte's line 4, not 5.
  const char raw[] = "first abc\0after nul\nsecond line\n\nthird doc\nbad \x80 byte\n";
  const std::string text(raw, sizeof(raw) - 1);
  gnmr_test::write_text(dir + "/nul.txt", text);
  auto options = small_options(dir, {dir + "/nul.txt"});
  const auto summary = gnmr::run_prepare(options);
  EXPECT_EQ(summary.documents, 2);
  EXPECT_EQ(summary.first_invalid_utf8_line, dir + "/nul.txt:5");
  const auto tokenizer = gnmr::Tokenizer::load(options.tokenizer);
  const auto decoded = documents_of(summary.train_shards[0]);
  ASSERT_EQ(decoded.size(), 2u);
  const char first[] = "first abc\0after nul\nsecond line";
  EXPECT_EQ(decoded[0], tokenizer.encode(std::string(first, sizeof(first) - 1)));
}

TEST(Prepare, FileNameSuffixesAreReadInAnyLetterCase) {
  const std::string dir = gnmr_test::scratch_dir("prepare_suffix_case");
  gnmr_test::write_text(dir + "/UPPER.JSONL",
                        "{\"text\": \"hello world\", \"url\": \"http://x\"}\n");
  gnmr_test::write_gzip(dir + "/Mixed.JsonL.Gz", "{\"text\": \"second record\"}\n");
  gnmr_test::write_text(dir + "/plain.TXT.GZ", "not gzip\n");
  EXPECT_EQ(gnmr::document_format_for("C4.JSONL.GZ"), gnmr::DocumentFormat::JsonLines);
  auto options = small_options(dir, {dir + "/UPPER.JSONL", dir + "/Mixed.JsonL.Gz"});
  const auto summary = gnmr::run_prepare(options);
  const auto tokenizer = gnmr::Tokenizer::load(options.tokenizer);
  const auto decoded = documents_of(summary.train_shards[0]);
  ASSERT_EQ(decoded.size(), 2u);
  EXPECT_EQ(tokenizer.decode(decoded[0]), "hello world");  // the text field, not the JSON line
  EXPECT_EQ(tokenizer.decode(decoded[1]), "second record");
  auto not_gzip = small_options(dir, {dir + "/plain.TXT.GZ"});
  not_gzip.out_dir = dir + "/out2";
  gnmr_test::expect_data_error([&] { gnmr::run_prepare(not_gzip); },
                               {dir + "/plain.TXT.GZ", "not gzip"});
}

// Shards are a dataset only once prepare.json, written last, describes them. A run that failed
// while writing it (a full disk) once left its shards, which train read as a whole dataset.
TEST(Prepare, AFailureWritingPrepareJsonRemovesTheShards) {
  const std::string dir = gnmr_test::scratch_dir("prepare_json_fails");
  gnmr_test::write_text(dir + "/corpus.txt", "One document.\n\nAnother one.\n\nA third.\n");
  auto options = small_options(dir, {dir + "/corpus.txt"});
  options.shard_tokens = 1;  // a shard per document
  fs::create_directories(options.out_dir);
  // write_file_atomic's temporary file, taken by a directory: its open fails.
  fs::create_directories(options.out_dir + "/prepare.json.tmp." + std::to_string(::getpid()));
  EXPECT_THROW(gnmr::run_prepare(options), gnmr::Error);
  for (const auto& entry : fs::directory_iterator(options.out_dir)) {
    EXPECT_NE(entry.path().extension(), ".bin") << entry.path() << " was left";
  }
}

// gnmr prepare's signal handler sets stop_signal: the run stops after the batch it is
// writing, as a failure, and removes every shard it had published.
TEST(Prepare, AStopSignalRemovesThePublishedShardsAndTheDirectoryItMade) {
  const std::string dir = gnmr_test::scratch_dir("prepare_stop_signal");
  gnmr_test::write_text(dir + "/corpus.txt", "One document.\n\nAnother one.\n\nA third.\n");
  auto options = small_options(dir, {dir + "/corpus.txt"});
  options.shard_tokens = 1;  // a shard per document
  std::atomic<int> signal{15};
  options.stop_signal = &signal;
  try {
    gnmr::run_prepare(options);
    FAIL() << "a set stop_signal should stop prepare";
  } catch (const gnmr::Error& e) {
    EXPECT_EQ(e.kind(), gnmr::ErrorKind::Runtime);
    EXPECT_NE(std::string(e.what()).find("stopped by signal 15"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(options.out_dir)) << "the shards or the directory were left";
}

// DIR's lock held by a child process (fcntl locks do not conflict within one process) until
// release(), which requires the child to have exited cleanly.
struct LockHeldByChild {
  pid_t pid = -1;
  int release_pipe[2] = {-1, -1};
  explicit LockHeldByChild(const std::string& dir) {
    int locked[2];
    EXPECT_EQ(::pipe(locked), 0);
    EXPECT_EQ(::pipe(release_pipe), 0);
    pid = ::fork();
    EXPECT_GE(pid, 0);
    if (pid == 0) {
      gnmr::DirectoryLock lock(dir, "test", gnmr::ErrorKind::Data);
      char byte = 1;
      if (::write(locked[1], &byte, 1) != 1 || ::read(release_pipe[0], &byte, 1) < 0) ::_exit(2);
      ::_exit(0);
    }
    char byte = 0;
    EXPECT_EQ(::read(locked[0], &byte, 1), 1);
  }
  void release() {
    char byte = 1;
    ASSERT_EQ(::write(release_pipe[1], &byte, 1), 1);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
};

// Two prepares into one directory once interleaved their shards (both numbered from
// train_000000.bin, each publishing over the other's). The second is refused while the first
// holds the directory's lock (here a child process holding it), takes nothing of it (the lock
// file stays the holder's), and a prepare after the holder has ended leaves no lock file behind.
TEST(Prepare, ASecondPrepareIntoADirectoryInUseIsRefusedAndTheFirstKeepsIt) {
  const std::string dir = gnmr_test::scratch_dir("prepare_in_use");
  gnmr_test::write_text(dir + "/corpus.txt", "One document.\n\nAnother one.\n");
  const auto options = small_options(dir, {dir + "/corpus.txt"});
  fs::create_directories(options.out_dir);
  LockHeldByChild holder(options.out_dir);
  gnmr_test::expect_data_error(
      [&] { gnmr::run_prepare(options); },
      {options.out_dir, "is in use by another gnmr process: pid " + std::to_string(holder.pid)});
  EXPECT_TRUE(fs::exists(options.out_dir + "/.gnmr.lock"));
  for (const auto& entry : fs::directory_iterator(options.out_dir)) {
    EXPECT_NE(entry.path().extension(), ".bin") << entry.path() << " was written";
  }
  holder.release();
  gnmr::run_prepare(options);
  EXPECT_TRUE(fs::exists(options.out_dir + "/prepare.json"));
  EXPECT_FALSE(fs::exists(options.out_dir + "/.gnmr.lock"));
}

// A prepare killed with SIGKILL leaves its finished shards and no prepare.json; training on
// them once read part of the corpus unsaid. Such a directory is refused where the prepare's
// unfinished shard is left too (saying so, or that the prepare still runs where it holds the
// directory's lock), a shard that prepare.json does not list is refused, and shards
// without either (other tools) pass with a warning.
TEST(Prepare, ShardsAreCheckedAgainstThePrepareThatWroteThem) {
  const std::string dir = gnmr_test::scratch_dir("prepare_shard_set");
  gnmr_test::write_text(dir + "/corpus.txt", "One document.\n\nAnother one.\n\nA third.\n");
  auto options = small_options(dir, {dir + "/corpus.txt"});
  options.shard_tokens = 1;  // a shard per document
  const gnmr::PrepareSummary summary = gnmr::run_prepare(options);
  ASSERT_EQ(summary.train_shards.size(), 3u);
  EXPECT_NO_THROW(gnmr::check_prepared_shards("data.train", summary.train_shards));
  fs::copy_file(summary.train_shards[0], options.out_dir + "/train_000009.bin");
  std::vector<std::string> with_stray = summary.train_shards;
  with_stray.push_back(options.out_dir + "/train_000009.bin");
  gnmr_test::expect_data_error(
      [&] { gnmr::check_prepared_shards("data.train", with_stray); },
      {"data.train: shard " + options.out_dir + "/train_000009.bin is not listed in"});
  // What SIGKILL leaves: no prepare.json, the shard being written under its temporary name.
  fs::remove(options.out_dir + "/prepare.json");
  fs::rename(summary.train_shards[2], summary.train_shards[2] + ".tmp.12345");
  const std::vector<std::string> finished(summary.train_shards.begin(),
                                          summary.train_shards.begin() + 2);
  gnmr_test::expect_data_error([&] { gnmr::check_prepared_shards("data.train", finished); },
                               {"holds no prepare.json", "train_000002.bin.tmp.12345"});
  {  // The same files while a prepare still holds the directory: it is at work, not killed.
    LockHeldByChild running(options.out_dir);
    gnmr_test::expect_data_error([&] { gnmr::check_prepared_shards("data.train", finished); },
                                 {"data.train: gnmr prepare is still writing " + options.out_dir,
                                  "pid " + std::to_string(running.pid), "wait for it to end"});
    running.release();
  }
  gnmr_test::expect_data_error(
      [&] { gnmr::run_prepare(options); },
      {"and no prepare.json: the shards of a prepare that did not finish"});
  fs::remove(summary.train_shards[2] + ".tmp.12345");
  {  // Between its last shard and prepare.json a prepare at work has no shard mid-write.
    LockHeldByChild running(options.out_dir);
    gnmr_test::expect_data_error(
        [&] { gnmr::check_prepared_shards("data.train", finished); },
        {"gnmr prepare is still writing", "pid " + std::to_string(running.pid)});
    running.release();
  }
  EXPECT_NO_THROW(gnmr::check_prepared_shards("data.train", finished));
}

// Python's json.dumps writes a lone UTF-16 surrogate as "\ud800", which the JSON parser
// refuses: one such record once stopped prepare (exit 4). It is now U+FFFD, counted as the
// invalid UTF-8 bytes are; a valid pair and an escaped backslash before "u" stay as they are.
TEST(Prepare, ALoneSurrogateEscapeInJsonLinesBecomesAReplacementCharacterAndIsCounted) {
  const std::string dir = gnmr_test::scratch_dir("prepare_lone_surrogate");
  gnmr_test::write_text(dir + "/s.jsonl",
                        "{\"text\": \"fine\"}\n"
                        "{\"text\": \"lone \\ud800 x\", \"id\": 1}\n"
                        "{\"text\": \"pair \\ud83d\\ude00 and \\\\ud800 kept\"}\n"
                        "{\"text\": \"low \\udc00 then high at the end \\udbff\"}\n");
  auto options = small_options(dir, {dir + "/s.jsonl"});
  const auto summary = gnmr::run_prepare(options);
  EXPECT_EQ(summary.documents, 4);
  EXPECT_EQ(summary.invalid_utf8_lines, 2);
  EXPECT_EQ(summary.first_invalid_utf8_line, dir + "/s.jsonl:2");
  const auto tokenizer = gnmr::Tokenizer::load(options.tokenizer);
  const auto decoded = documents_of(summary.train_shards[0]);
  ASSERT_EQ(decoded.size(), 4u);
  EXPECT_EQ(decoded[1], tokenizer.encode("lone \xEF\xBF\xBD x"));
  EXPECT_EQ(decoded[2], tokenizer.encode("pair \xF0\x9F\x98\x80 and \\ud800 kept"));
  EXPECT_EQ(decoded[3], tokenizer.encode("low \xEF\xBF\xBD then high at the end \xEF\xBF\xBD"));
}
