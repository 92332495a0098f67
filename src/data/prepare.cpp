#include "data/prepare.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "data/counter_hash.h"
#include "data/document_reader.h"
#include "data/prepare_progress.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "util/atomic_file.h"
#include "util/directory_lock.h"
#include "util/error.h"
#include "util/log.h"

namespace fs = std::filesystem;

namespace gnmr {

namespace {

// A reader batch closes at this many documents or bytes of text, whichever comes first.
// Batching is independent of the thread count, which keeps the output deterministic.
constexpr size_t kBatchDocuments = 512;
constexpr size_t kBatchTextBytes = 4 << 20;
// Salt so the split hash never coincides with other users of the same seed.
constexpr uint64_t kSplitSalt = 0x73706C6974ull;  // "split"

struct DocumentBatch {
  int64_t sequence = 0;
  int64_t first_document = 0;  // global index of texts[0]
  std::vector<std::string> texts;
  int64_t input_bytes_after = 0;  // input bytes consumed once this batch was read
};

// One split's documents, flattened: tokens of document k are
// tokens[offsets[k] .. offsets[k+1]).
struct EncodedDocuments {
  std::vector<int32_t> tokens;
  std::vector<size_t> offsets{0};
};

struct EncodedBatch {
  int64_t documents = 0;
  EncodedDocuments train;
  EncodedDocuments val;
  int64_t input_bytes_after = 0;
};

bool goes_to_val(uint64_t seed, int64_t document_index, double val_fraction) {
  return hash_to_unit(hash_values({kSplitSalt, seed, static_cast<uint64_t>(document_index)})) <
         val_fraction;
}

// Writes one split as a sequence of shards PREFIX_000000.bin, ... in OUT_DIR.
class ShardSequence {
 public:
  ShardSequence(std::string out_dir, std::string prefix, int vocab_size, int64_t shard_tokens)
      : out_dir_(std::move(out_dir)),
        prefix_(std::move(prefix)),
        vocab_size_(vocab_size),
        shard_tokens_(shard_tokens) {}

  ~ShardSequence() {
    if (!finished_) {  // failed run: take back what it published
      for (const auto& path : paths_) std::remove(path.c_str());
    }
  }

  void add_document(const int32_t* tokens, size_t count) {
    if (current_ && current_->token_count() > 0 &&
        current_->token_count() + static_cast<int64_t>(count) > shard_tokens_) {
      close_current();
    }
    if (!current_) {
      char name[64];
      std::snprintf(name, sizeof(name), "%s_%06zu.bin", prefix_.c_str(), paths_.size());
      current_ = std::make_unique<ShardWriter>((fs::path(out_dir_) / name).string(), vocab_size_);
    }
    current_->append(tokens, count);
    tokens_ += static_cast<int64_t>(count);
    ++documents_;
  }

  // Publishes the last shard. The shards are still removed at destruction until keep().
  void close() {
    if (current_) close_current();
  }
  // The run succeeded (prepare.json is written): the shards stay.
  void keep() { finished_ = true; }

  const std::vector<std::string>& paths() const { return paths_; }
  int64_t tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }

 private:
  void close_current() {
    current_->close();
    paths_.push_back(current_->path());
    current_.reset();
  }

  std::string out_dir_;
  std::string prefix_;
  int vocab_size_;
  int64_t shard_tokens_;
  std::unique_ptr<ShardWriter> current_;
  std::vector<std::string> paths_;
  int64_t tokens_ = 0;
  int64_t documents_ = 0;
  bool finished_ = false;
};

// Reader -> workers -> in-order writer. At most max_in_flight batches exist between reading
// and writing, which bounds memory.
class PreparePipeline {
 public:
  PreparePipeline(const PrepareOptions& options, const Tokenizer& tokenizer, int workers)
      : options_(options), tokenizer_(tokenizer), max_in_flight_(2 * workers + 2) {
    threads_.emplace_back([this] { guarded([this] { read_all(); }); });
    for (int i = 0; i < workers; ++i) {
      threads_.emplace_back([this] { guarded([this] { encode_batches(); }); });
    }
  }

  ~PreparePipeline() {
    stop();
    for (auto& thread : threads_) thread.join();
  }

  // The next batch in reading order; false once every batch has been handed out. Rethrows
  // the first error of any stage.
  bool next_encoded(EncodedBatch& out) {
    std::unique_lock<std::mutex> lock(mutex_);
    results_ready_.wait(lock, [&] {
      return error_ || results_.count(next_to_write_) > 0 ||
             (reading_done_ && next_to_write_ == batches_read_);
    });
    if (error_) std::rethrow_exception(error_);
    auto it = results_.find(next_to_write_);
    if (it == results_.end()) return false;
    out = std::move(it->second);
    results_.erase(it);
    ++next_to_write_;
    space_free_.notify_all();
    return true;
  }

  int64_t input_bytes_read() const { return input_bytes_read_.load(); }
  // Valid once next_encoded has returned false (the reader sets them before it finishes).
  int64_t invalid_utf8_lines() const { return invalid_utf8_lines_; }
  const std::string& first_invalid_utf8_line() const { return first_invalid_utf8_line_; }

 private:
  template <typename Stage>
  void guarded(Stage stage) {
    try {
      stage();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      stopping_ = true;
      jobs_ready_.notify_all();
      space_free_.notify_all();
      results_ready_.notify_all();
    }
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    jobs_ready_.notify_all();
    space_free_.notify_all();
  }

  // Returns false when the pipeline is stopping.
  bool push_job(DocumentBatch&& batch) {
    std::unique_lock<std::mutex> lock(mutex_);
    space_free_.wait(lock,
                     [&] { return stopping_ || batches_read_ - next_to_write_ < max_in_flight_; });
    if (stopping_) return false;
    batch.sequence = batches_read_++;
    jobs_.push_back(std::move(batch));
    jobs_ready_.notify_one();
    return true;
  }

  void read_all() {
    int64_t document_index = 0;
    int64_t bytes_before_file = 0;
    DocumentBatch batch;
    size_t batch_bytes = 0;
    for (const auto& input : options_.inputs) {
      DocumentReader reader(input);
      std::string text;
      while (reader.next(text)) {
        if (batch.texts.empty()) batch.first_document = document_index;
        batch_bytes += text.size();
        batch.texts.push_back(std::move(text));
        ++document_index;
        if (batch.texts.size() >= kBatchDocuments || batch_bytes >= kBatchTextBytes) {
          batch.input_bytes_after = bytes_before_file + reader.bytes_consumed();
          input_bytes_read_.store(batch.input_bytes_after);
          if (!push_job(std::move(batch))) return;
          batch = DocumentBatch();
          batch_bytes = 0;
        }
      }
      bytes_before_file += static_cast<int64_t>(fs::file_size(input));
      if (reader.invalid_utf8_lines() > 0 && invalid_utf8_lines_ == 0) {
        first_invalid_utf8_line_ = input + ":" + std::to_string(reader.first_invalid_utf8_line());
      }
      invalid_utf8_lines_ += reader.invalid_utf8_lines();
    }
    input_bytes_read_.store(bytes_before_file);
    if (!batch.texts.empty()) {
      batch.input_bytes_after = bytes_before_file;
      if (!push_job(std::move(batch))) return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    reading_done_ = true;
    jobs_ready_.notify_all();
    results_ready_.notify_all();
  }

  void encode_batches() {
    const int32_t bos = tokenizer_.bos_id();
    const int32_t eos = tokenizer_.eos_id();
    while (true) {
      DocumentBatch batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        jobs_ready_.wait(lock, [&] { return stopping_ || reading_done_ || !jobs_.empty(); });
        if (stopping_ || jobs_.empty()) return;
        batch = std::move(jobs_.front());
        jobs_.pop_front();
      }
      EncodedBatch encoded;
      encoded.documents = static_cast<int64_t>(batch.texts.size());
      encoded.input_bytes_after = batch.input_bytes_after;
      for (size_t k = 0; k < batch.texts.size(); ++k) {
        const int64_t index = batch.first_document + static_cast<int64_t>(k);
        EncodedDocuments& split =
            goes_to_val(options_.seed, index, options_.val_fraction) ? encoded.val : encoded.train;
        split.tokens.push_back(bos);
        const auto ids = tokenizer_.encode_document(batch.texts[k]);
        split.tokens.insert(split.tokens.end(), ids.begin(), ids.end());
        split.tokens.push_back(eos);
        split.offsets.push_back(split.tokens.size());
      }
      std::lock_guard<std::mutex> lock(mutex_);
      results_.emplace(batch.sequence, std::move(encoded));
      results_ready_.notify_all();
    }
  }

  const PrepareOptions& options_;
  const Tokenizer& tokenizer_;
  const int64_t max_in_flight_;
  std::mutex mutex_;
  std::condition_variable jobs_ready_;
  std::condition_variable space_free_;
  std::condition_variable results_ready_;
  std::deque<DocumentBatch> jobs_;
  std::map<int64_t, EncodedBatch> results_;
  int64_t batches_read_ = 0;
  int64_t next_to_write_ = 0;
  bool reading_done_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::atomic<int64_t> input_bytes_read_{0};
  int64_t invalid_utf8_lines_ = 0;  // written by the reader thread only
  std::string first_invalid_utf8_line_;
  std::vector<std::thread> threads_;
};

void validate_options(const PrepareOptions& options) {
  if (options.inputs.empty()) throw Error(ErrorKind::Usage, "prepare: no input files given");
  if (options.out_dir.empty()) throw Error(ErrorKind::Usage, "prepare: --out DIR is required");
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    throw Error(ErrorKind::Usage, "prepare: --val-fraction " +
                                      std::to_string(options.val_fraction) + " must lie in [0, 1)");
  }
  if (options.shard_tokens <= 0) {
    throw Error(ErrorKind::Usage, "prepare: shard size must be a positive number of tokens");
  }
  if (options.threads < 0) throw Error(ErrorKind::Usage, "prepare: --threads must be >= 0");
}

// The output directory, held for the run: created, or an existing one that holds no shards
// (nothing is overwritten), locked against a second prepare into it (the two would interleave
// their shards), and checked for shards only once locked. At destruction, after the shard
// sequences, it drops its lock file and, if the run made it and failed, the directory (empty
// again by then).
struct OutputDirectory {
  std::string path;
  bool created = false;
  bool keep = false;
  DirectoryLock lock;

  explicit OutputDirectory(const std::string& out_dir) : path(out_dir) {
    std::error_code ec;
    if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec)) {
      throw Error(ErrorKind::Data, "prepare: output " + out_dir + " exists and is not a directory");
    }
    created = fs::create_directories(out_dir);
    try {
      lock = DirectoryLock(out_dir, "prepare: output directory", ErrorKind::Data);
      for (const auto& entry : fs::directory_iterator(out_dir)) {
        const std::string name = entry.path().filename().string();
        // A shard, finished or being written (NAME.bin.tmp.PID: a prepare at work or killed).
        if (entry.path().extension() == ".bin" || name == "prepare.json" ||
            name.find(".bin.tmp.") != std::string::npos) {
          const bool finished = fs::exists(fs::path(out_dir) / "prepare.json");
          throw Error(ErrorKind::Data,
                      "prepare: output directory " + out_dir + " already holds " + name +
                          (finished ? ""
                                    : " and no prepare.json: the shards of a prepare that "
                                      "did not finish") +
                          "; choose a new --out or remove the old shards");
        }
      }
    } catch (...) {
      release();  // no destructor runs for a constructor that throws
      throw;
    }
  }
  ~OutputDirectory() { release(); }
  OutputDirectory(const OutputDirectory&) = delete;
  OutputDirectory& operator=(const OutputDirectory&) = delete;

  void release() {
    lock.remove_and_release();
    std::error_code ec;
    if (created && !keep) fs::remove(path, ec);  // fails, and keeps it, unless empty
  }
};

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::vector<std::string> file_names(const std::vector<std::string>& paths) {
  std::vector<std::string> names;
  for (const auto& path : paths) names.push_back(fs::path(path).filename().string());
  return names;
}

}  // namespace

PrepareSummary run_prepare(const PrepareOptions& options) {
  validate_options(options);
  check_inputs_readable(options.inputs);
  const Tokenizer tokenizer = Tokenizer::load(options.tokenizer);
  if (tokenizer.bos_id() < 0 || tokenizer.eos_id() < 0) {
    throw Error(ErrorKind::Data, "tokenizer " + options.tokenizer +
                                     ": the model has no BOS/EOS piece, which prepare puts "
                                     "around every document");
  }
  // Destroyed after the shard sequences below: a failed run removes its shards, then the
  // directory it made for them.
  OutputDirectory out_dir(options.out_dir);

  int64_t total_input_bytes = 0;
  for (const auto& input : options.inputs) total_input_bytes += fs::file_size(input);
  const int workers = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  spdlog::info("prepare: {} input(s), {:.1f} MB, tokenizer {} (vocab {}), {} worker(s)",
               options.inputs.size(), total_input_bytes / 1e6, options.tokenizer,
               tokenizer.vocab_size(), workers);

  ShardSequence train(options.out_dir, "train", tokenizer.vocab_size(), options.shard_tokens);
  ShardSequence val(options.out_dir, "val", tokenizer.vocab_size(), options.shard_tokens);
  PrepareProgress progress(total_input_bytes, options.progress);
  int64_t documents = 0;
  int64_t invalid_utf8_lines = 0;
  std::string first_invalid_utf8_line;
  {
    PreparePipeline pipeline(options, tokenizer, workers);
    EncodedBatch batch;
    while (pipeline.next_encoded(batch)) {
      for (auto* split : {&batch.train, &batch.val}) {
        ShardSequence& out = split == &batch.train ? train : val;
        for (size_t k = 0; k + 1 < split->offsets.size(); ++k) {
          out.add_document(split->tokens.data() + split->offsets[k],
                           split->offsets[k + 1] - split->offsets[k]);
        }
      }
      documents += batch.documents;
      progress.update(batch.input_bytes_after, documents, train.tokens() + val.tokens());
      if (options.stop_signal != nullptr && options.stop_signal->load() != 0) {
        throw Error(ErrorKind::Runtime, "prepare: stopped by signal " +
                                            std::to_string(options.stop_signal->load()) +
                                            "; the shards written so far were removed");
      }
    }
    invalid_utf8_lines = pipeline.invalid_utf8_lines();
    first_invalid_utf8_line = pipeline.first_invalid_utf8_line();
  }
  if (documents == 0) {
    throw Error(ErrorKind::Data, "prepare: the inputs hold no documents (" +
                                     joined(options.inputs) +
                                     " are empty or hold only blank lines or empty \"text\" "
                                     "fields); nothing was written");
  }
  progress.finish(total_input_bytes, documents, train.tokens() + val.tokens());
  train.close();
  val.close();

  PrepareSummary summary;
  summary.documents = documents;
  summary.train_documents = train.documents();
  summary.val_documents = val.documents();
  summary.train_tokens = train.tokens();
  summary.val_tokens = val.tokens();
  summary.train_shards = train.paths();
  summary.val_shards = val.paths();
  summary.invalid_utf8_lines = invalid_utf8_lines;
  summary.first_invalid_utf8_line = first_invalid_utf8_line;

  nlohmann::json record = {
      {"format_version", kShardVersion},
      {"tokenizer", options.tokenizer},
      {"vocab_size", tokenizer.vocab_size()},
      {"bos_id", tokenizer.bos_id()},
      {"eos_id", tokenizer.eos_id()},
      {"inputs", options.inputs},
      {"val_fraction", options.val_fraction},
      {"seed", options.seed},
      {"shard_tokens", options.shard_tokens},
      {"documents", summary.documents},
      {"train_documents", summary.train_documents},
      {"val_documents", summary.val_documents},
      {"train_tokens", summary.train_tokens},
      {"val_tokens", summary.val_tokens},
      {"invalid_utf8_lines", summary.invalid_utf8_lines},
      {"train_shards", file_names(summary.train_shards)},
      {"val_shards", file_names(summary.val_shards)},
  };
  const std::string record_path = (fs::path(options.out_dir) / "prepare.json").string();
  try {
    write_file_atomic(record_path, record.dump(2) + "\n");
  } catch (...) {
    std::remove(record_path.c_str());  // renamed in before the directory's fsync failed
    throw;
  }
  train.keep();  // only now: shards without their prepare.json are a failed run's
  val.keep();
  out_dir.keep = true;

  spdlog::info(
      "prepare: {} documents -> {} train tokens in {} shard(s), {} val tokens in {} "
      "shard(s), in {}",
      summary.documents, summary.train_tokens, summary.train_shards.size(), summary.val_tokens,
      summary.val_shards.size(), options.out_dir);
  if (summary.invalid_utf8_lines > 0) {
    spdlog::warn(
        "prepare: {} line(s) held invalid UTF-8, the first at {}; each invalid byte was "
        "tokenized as U+FFFD (counted in prepare.json \"invalid_utf8_lines\")",
        summary.invalid_utf8_lines, summary.first_invalid_utf8_line);
  }
  if (summary.val_documents == 0 && options.val_fraction > 0) {
    spdlog::warn(
        "prepare: no document fell into the validation split (val_fraction {}); raise "
        "--val-fraction for a corpus this small",
        options.val_fraction);
  }
  return summary;
}

void check_prepared_shards(const std::string& field, const std::vector<std::string>& paths,
                           bool warn) {
  std::map<std::string, std::vector<std::string>> by_dir;  // directory -> shard file names
  for (const std::string& path : paths) {
    const fs::path p(path);
    by_dir[p.parent_path().string()].push_back(p.filename().string());
  }
  for (const auto& [dir, names] : by_dir) {
    const fs::path shown = dir.empty() ? fs::path(".") : fs::path(dir);
    const fs::path record_path = shown / "prepare.json";
    std::error_code ec;
    if (fs::exists(record_path, ec)) {
      const nlohmann::json record =
          nlohmann::json::parse(read_file(record_path.string()), nullptr, false);
      std::set<std::string> listed;
      for (const char* split : {"train_shards", "val_shards"}) {
        if (!record.is_object() || !record.contains(split) || !record[split].is_array()) {
          throw Error(ErrorKind::Data, field + ": " + record_path.string() + " is damaged (no \"" +
                                           split + "\" list)");
        }
        for (const auto& name : record[split]) {
          if (name.is_string()) listed.insert(name.get<std::string>());
        }
      }
      for (const std::string& name : names) {
        if (listed.count(name) == 0) {
          throw Error(ErrorKind::Data,
                      field + ": shard " + (shown / name).string() + " is not listed in " +
                          record_path.string() +
                          ", which names the shards of the prepare that wrote them: a file from "
                          "elsewhere in their directory; move it out, or narrow the glob");
        }
      }
      continue;
    }
    std::string unfinished;
    for (const auto& entry : fs::directory_iterator(shown, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.find(".bin.tmp.") != std::string::npos) unfinished = name;
    }
    // A prepare at work holds the lock from before its first shard until after prepare.json.
    const std::string writer = DirectoryLock::holder(shown.string());
    if (!writer.empty()) {
      throw Error(ErrorKind::Data,
                  field + ": gnmr prepare is still writing " + shown.string() + " (" + writer +
                      " holds its lock" +
                      (unfinished.empty() ? "" : "; " + unfinished + " is being written") +
                      "): wait for it to end, it writes prepare.json last");
    }
    if (!unfinished.empty()) {
      throw Error(ErrorKind::Data,
                  field + ": " + shown.string() +
                      " holds no prepare.json (gnmr prepare writes it "
                      "last) and an unfinished shard, " +
                      unfinished +
                      ": the shards of a prepare that did not finish, part of the corpus; run "
                      "gnmr prepare again into a new --out");
    }
    if (!warn) continue;
    spdlog::warn(
        "{}: {} holds no prepare.json (gnmr prepare writes it last): if gnmr prepare made these "
        "shards, it did not finish and they are part of the corpus",
        field, shown.string());
  }
}

}  // namespace gnmr
