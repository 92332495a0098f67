// The CUDA backend's out-of-memory report (device_memory_report.h).
#include "backend/cuda/device_memory_report.h"

#include <cstdio>

namespace gnmr {

std::string format_gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1u << 30));
  return text;
}

std::string device_out_of_memory_message(const std::string& name, size_t bytes,
                                         const MemoryUse& held, size_t device_free,
                                         size_t device_total) {
  std::string by_role;
  for (int r = 0; r < kMemoryRoles; ++r) {
    if (held.bytes[r] == 0) continue;
    if (!by_role.empty()) by_role += ", ";
    by_role +=
        std::string(memory_role_name(static_cast<MemoryRole>(r))) + " " + format_gib(held.bytes[r]);
  }
  return "cuda backend: out of device memory allocating " + name + " (" + format_gib(bytes) +
         "); this run already holds " + format_gib(held.total()) +
         (by_role.empty() ? "" : " (" + by_role + ")") + ", and the device has " +
         format_gib(device_free) + " free of " + format_gib(device_total) +
         ". The config does not fit: lower train.micro_batch or data.seq_len (activations scale "
         "with both; gradient accumulation keeps train.global_batch_tokens), shard the AdamW "
         "moments over the ranks with dist.zero=1, or use a smaller model";
}

}  // namespace gnmr
