// Controller::save_state / load_state: the controller's part of a checkpoint.
//
// Blob layout (version 1, all integers little-endian, doubles as their IEEE-754 bits):
//   "GNMRCTL\0"  u32 version
//   u64 length + bytes: the resolved options as JSON (controller_options_to_json); a key
//                      missing here (a state older than the key) reads as its default
//   i32 n_layers, i32 n_decision_units, i32 window
//   i64 observations, i64 last_step
//   per decision unit: f64 norm_sum, i64 norm_count, i32 window_filled, i32 window_next,
//                      f64 gnmr_window[window]
//   i32 lock[n_decision_units]
//   u8 current_plan[n_units]
//   run telemetry: i64 steps, eligible_unit_steps, exceeding_unit_steps, gnmr_exceedances,
//                  delta_exceedances, invalid_norms, active_unit_steps, switches,
//                  recovered_steps[n_units]
//   u64 FNV-1a checksum of all preceding bytes
// Every version keeps the frame (magic, u32 version, ..., the checksum last), so that an
// intact blob of another version is told apart from a damaged one.
#include <cstring>
#include <stdexcept>
#include <string>

#include "controller/controller.h"
#include "util/fnv1a.h"

namespace gnmr {

namespace {

constexpr char kMagic[8] = {'G', 'N', 'M', 'R', 'C', 'T', 'L', '\0'};
constexpr uint32_t kVersion = 1;

[[noreturn]] void damaged(const std::string& what) {
  throw ControllerStateDamaged("gnmr controller state: " + what);
}

[[noreturn]] void mismatch(const std::string& what) {
  throw ControllerStateMismatch("gnmr controller state: " + what);
}

class BlobWriter {
 public:
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    u64(bits);
  }
  void raw(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), p, p + size);
  }
  std::vector<uint8_t> bytes;
};

class BlobReader {
 public:
  BlobReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return v;
  }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  int32_t i32() { return static_cast<int32_t>(u32()); }
  double f64() {
    uint64_t bits = u64();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  const uint8_t* raw(size_t size) {
    need(size);
    const uint8_t* p = data_ + pos_;
    pos_ += size;
    return p;
  }
  bool at_end() const { return pos_ == size_; }

 private:
  void need(size_t n) const {
    if (size_ - pos_ < n) damaged("truncated blob");
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<uint8_t> Controller::save_state() const {
  BlobWriter w;
  w.raw(kMagic, sizeof kMagic);
  w.u32(kVersion);
  const std::string options = controller_options_to_json(options_).dump();
  w.u64(options.size());
  w.raw(options.data(), options.size());
  w.i32(units_.n_layers());
  w.i32(units_.n_decision_units());
  w.i32(options_.window);
  w.i64(observations_);
  w.i64(last_step_);
  const RiskMonitor::State& m = monitor_.state();
  for (int d = 0; d < units_.n_decision_units(); ++d) {
    w.f64(m.norm_sum[d]);
    w.i64(m.norm_count[d]);
    w.i32(m.window_filled[d]);
    w.i32(m.window_next[d]);
    for (int i = 0; i < options_.window; ++i) {
      w.f64(m.gnmr_window[static_cast<size_t>(d) * options_.window + i]);
    }
  }
  for (int32_t lock : locks_) w.i32(lock);
  for (Path path : current_plan_.path) w.raw(&path, 1);
  const RunTelemetry& r = run_telemetry_;
  for (int64_t v : {r.steps, r.eligible_unit_steps, r.exceeding_unit_steps, r.gnmr_exceedances,
                    r.delta_exceedances, r.invalid_norms, r.active_unit_steps, r.switches}) {
    w.i64(v);
  }
  for (int64_t v : r.recovered_steps) w.i64(v);
  w.u64(fnv1a(w.bytes.data(), w.bytes.size()));
  return std::move(w.bytes);
}

void Controller::load_state(const std::vector<uint8_t>& blob) {
  if (blob.size() < sizeof kMagic + 4 + 8 || std::memcmp(blob.data(), kMagic, sizeof kMagic) != 0) {
    damaged("not a controller state blob (bad magic)");
  }
  const size_t body = blob.size() - 8;
  BlobReader checksum(blob.data() + body, 8);
  if (checksum.u64() != fnv1a(blob.data(), body)) damaged("damaged blob (checksum mismatch)");

  BlobReader r(blob.data(), body);
  r.raw(sizeof kMagic);
  const uint32_t version = r.u32();
  if (version != kVersion) {
    throw ControllerStateVersion("gnmr controller state: format version " +
                                 std::to_string(version) + ", this build reads version " +
                                 std::to_string(kVersion));
  }
  const uint64_t options_size = r.u64();
  if (options_size > body) damaged("truncated blob");
  const auto* options_bytes = reinterpret_cast<const char*>(r.raw(options_size));
  const nlohmann::json saved = nlohmann::json::parse(options_bytes, options_bytes + options_size,
                                                     nullptr, /*allow_exceptions=*/false);
  if (saved.is_discarded()) damaged("damaged options record");

  const int32_t n_layers = r.i32();
  const int32_t n_decision = r.i32();
  const int32_t window = r.i32();
  // The options first: one that changes the decision units (gnmr.granularity) is named.
  const nlohmann::json current = controller_options_to_json(options_);
  const nlohmann::json defaults = controller_options_to_json(ControllerOptions{});
  for (const auto& [key, value] : current.items()) {
    // A key missing from the state was added after the state was written (e.g.
    // history_start); new keys default to the old behaviour, so the state ran with the
    // default and matches only a config that keeps it.
    const bool stored = saved.contains(key);
    const nlohmann::json& state_value = stored ? saved.at(key) : defaults.at(key);
    if (state_value != value) {
      mismatch("gnmr." + key + " differs (state " +
               (stored ? state_value.dump() : "absent, i.e. the default " + state_value.dump()) +
               ", config " + value.dump() + ")");
    }
  }
  if (window != options_.window) damaged("damaged blob (window record)");
  if (n_layers != units_.n_layers() || n_decision != units_.n_decision_units()) {
    mismatch("made for " + std::to_string(n_layers) + " layers (" +
             std::to_string(int64_t{n_layers} * kKindsPerLayer) + " units, " +
             std::to_string(n_decision) + " decision units), this model has " +
             std::to_string(units_.n_layers()) + " layers (" + std::to_string(units_.n_units()) +
             " units, " + std::to_string(units_.n_decision_units()) + " decision units)");
  }

  const int64_t observations = r.i64();
  const int64_t last_step = r.i64();
  RiskMonitor::State m;
  for (int d = 0; d < n_decision; ++d) {
    m.norm_sum.push_back(r.f64());
    m.norm_count.push_back(r.i64());
    m.window_filled.push_back(r.i32());
    m.window_next.push_back(r.i32());
    for (int i = 0; i < window; ++i) m.gnmr_window.push_back(r.f64());
  }
  std::vector<int32_t> locks(static_cast<size_t>(n_decision));
  for (int32_t& lock : locks) {
    lock = r.i32();
    if (lock < 0) damaged("damaged blob (negative lock)");
  }
  RoutingPlan plan;
  const uint8_t* paths = r.raw(static_cast<size_t>(units_.n_units()));
  for (int u = 0; u < units_.n_units(); ++u) {
    if (paths[u] > 1) damaged("damaged blob (path record)");
    plan.path.push_back(static_cast<Path>(paths[u]));
  }
  RunTelemetry telemetry(units_.n_units());
  for (int64_t* v :
       {&telemetry.steps, &telemetry.eligible_unit_steps, &telemetry.exceeding_unit_steps,
        &telemetry.gnmr_exceedances, &telemetry.delta_exceedances, &telemetry.invalid_norms,
        &telemetry.active_unit_steps, &telemetry.switches}) {
    *v = r.i64();
  }
  for (int64_t& v : telemetry.recovered_steps) v = r.i64();
  if (!r.at_end()) damaged("damaged blob (trailing bytes)");

  // Everything parsed: commit. The monitor checks its windows' fill counts and positions.
  try {
    monitor_.set_state(std::move(m));
  } catch (const std::invalid_argument& e) {
    throw ControllerStateDamaged(e.what());
  }
  locks_ = std::move(locks);
  current_plan_ = std::move(plan);
  observations_ = observations;
  last_step_ = last_step;
  run_telemetry_ = std::move(telemetry);
  step_telemetry_ = StepTelemetry();
}

}  // namespace gnmr
