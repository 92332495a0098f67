// A tiny training config on the bundled corpus, written for each CLI test.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"

namespace gnmr_test {

inline std::string write_tiny_config(const std::string& dir, const std::string& extra_json = "{}") {
  std::string shards = brown_shards_dir();
  EXPECT_FALSE(shards.empty()) << "gnmr prepare of the bundled corpus failed";
  nlohmann::json config = {{"include", source_path("configs/models/tiny.json")},
                           {"data",
                            {{"train", shards + "/train_*.bin"},
                             {"val", shards + "/val_*.bin"},
                             {"tokenizer", source_path("data/brown/tokenizer.model")},
                             {"seq_len", 32}}},
                           {"train",
                            {{"steps", 12},
                             {"warmup_steps", 2},
                             {"global_batch_tokens", 256},
                             {"micro_batch", 4},
                             {"lr", 3e-3}}},
                           {"eval", {{"every", 6}, {"tokens", 1024}}},
                           {"checkpoint", {{"every", 6}, {"keep", 5}}},
                           {"log", {{"every", 4}}}};
  config.merge_patch(nlohmann::json::parse(extra_json));
  std::string path = dir + "/config.json";
  std::ofstream(path) << config.dump(2);
  return path;
}

// The train and eval lines of a metrics file; with_run_headers keeps the "kind":"run" line
// each start or resume writes (the BLAS it ran on) and the "kind":"end" line each job that
// stops writes, which differ between a resumed run and an uninterrupted one by design.
inline std::vector<nlohmann::json> read_metrics(const std::string& path,
                                                bool with_run_headers = false) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    const std::string kind = j.value("kind", "");
    if (with_run_headers || (kind != "run" && kind != "end")) lines.push_back(j);
  }
  return lines;
}

// The metric fields that depend on wall-clock time or process memory.
inline nlohmann::json without_timing(nlohmann::json line) {
  for (const char* key : {"tokens_per_s", "step_ms", "gflops_per_s", "peak_rss_bytes",
                          "controller_ms", "mfu", "recovery_gap_ms", "time"})
    line.erase(key);
  return line;
}

// The last line of a command's output that is a JSON object (`gnmr bench` prints its figures
// last); null when there is none.
inline nlohmann::json last_json_line(const std::string& output) {
  std::istringstream lines(output);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.front() == '{') last = line;
  }
  return last.empty() ? nlohmann::json() : nlohmann::json::parse(last);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The files of checkpoint directories a and b that a resume reads, equal byte for byte.
inline void expect_same_checkpoint_files(const std::string& a, const std::string& b) {
  for (const char* file :
       {"model.safetensors", "optimizer.safetensors", "trainer.json", "controller.bin"}) {
    EXPECT_EQ(read_bytes(a + "/" + file), read_bytes(b + "/" + file))
        << b << "/" << file << " differs from " << a;
  }
}

// The train and eval lines of two run directories' metrics, equal but for their timing fields.
inline void expect_same_metrics(const std::string& run_a, const std::string& run_b) {
  const std::vector<nlohmann::json> a = read_metrics(run_a + "/metrics.jsonl"),
                                    b = read_metrics(run_b + "/metrics.jsonl");
  ASSERT_EQ(a.size(), b.size()) << run_a << " and " << run_b;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(without_timing(a[i]), without_timing(b[i])) << "metrics line " << i;
  }
}

}  // namespace gnmr_test
