// Feature detection through cpuid and xgetbv (leaf and bit numbers from the Intel SDM,
// vol. 2A "CPUID"; AMD uses the same leaves for these features).
#include "backend/cpu/cpu_features.h"

#include <sched.h>

#include <cstdlib>
#include <fstream>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace gnmr {

namespace {

bool bit(unsigned reg, int index) {
  return (reg >> index) & 1u;
}

#if defined(__x86_64__) || defined(__i386__)
// XCR0: which register states the OS saves on a context switch. Readable only when the OS
// set CR4.OSXSAVE, which cpuid leaf 1 reports as ECX bit 27.
unsigned long long read_xcr0() {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}
#endif

// "cpu MHz" and "model name" of the first processor in /proc/cpuinfo.
void read_proc_cpuinfo(CpuFeatures& cpu) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && cpu.model_name.empty()) cpu.model_name = value;
    if (key == "cpu MHz" && cpu.clock_ghz == 0) cpu.clock_ghz = std::atof(value.c_str()) / 1000.0;
    if (!cpu.model_name.empty() && cpu.clock_ghz != 0) return;
  }
}

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures cpu;
  cpu_set_t set;
  CPU_ZERO(&set);
  cpu.logical_cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  read_proc_cpuinfo(cpu);
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return cpu;
  const unsigned max_leaf = eax;
  char vendor[13] = {};
  for (int i = 0; i < 4; ++i) {
    vendor[i] = char(ebx >> (8 * i));
    vendor[4 + i] = char(edx >> (8 * i));
    vendor[8 + i] = char(ecx >> (8 * i));
  }
  cpu.vendor = vendor;

  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  cpu.sse3 = bit(ecx, 0);
  const bool osxsave = bit(ecx, 27);
  const unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_saves_ymm = (xcr0 & 0x6) == 0x6;  // XMM and upper-YMM state
  const bool os_saves_zmm =
      os_saves_ymm && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM0-15 upper, ZMM16-31
  cpu.avx = bit(ecx, 28) && os_saves_ymm;
  cpu.fma = bit(ecx, 12) && os_saves_ymm;
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const unsigned max_subleaf = eax;
    cpu.avx2 = bit(ebx, 5) && os_saves_ymm;
    cpu.avx512 = bit(ebx, 16) && bit(ebx, 17) && bit(ebx, 28) && bit(ebx, 30) && bit(ebx, 31) &&
                 os_saves_zmm;
    if (max_subleaf >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      cpu.avx512_bf16 = cpu.avx512 && bit(eax, 5);
    }
  }
#endif
  return cpu;
}

std::string widest_vector_isa(const CpuFeatures& cpu) {
  if (cpu.avx512_bf16) return "AVX-512 BF16";
  if (cpu.avx512) return "AVX-512";
  if (cpu.avx2 && cpu.fma) return "AVX2+FMA";
  if (cpu.avx) return "AVX";
  if (cpu.sse3) return "SSE3";
  return "none";
}

}  // namespace gnmr
