// An independent, table-driven reference for the small floating-point formats, written
// from the format definitions (OCP OFP8 v1.0 §4, OCP MX v1.0 §5.3) without using any code
// from src/precision: values come from sign/exponent/mantissa with std::ldexp in double, and
// encoding picks the nearest table value by exact double comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace gnmr::test {

enum class Overflow { kSaturate, kToInfinity };

struct FormatDefinition {
  const char* name;
  int exponent_bits;
  int mantissa_bits;
  int bias;
  // Special encodings in the all-ones exponent: "fn" (only all-ones mantissa is NaN, no inf),
  // "ieee" (mantissa 0 = inf, others NaN) or "none" (every code finite).
  enum class Specials { kNone, kFn, kIeee } specials;

  int total_bits() const { return 1 + exponent_bits + mantissa_bits; }
  int code_count() const { return 1 << total_bits(); }
  uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  uint32_t magnitude_mask() const { return sign_bit() - 1; }
  bool is_nan(uint32_t code) const {
    const uint32_t exponent = (code >> mantissa_bits) & ((1u << exponent_bits) - 1);
    const uint32_t mantissa = code & ((1u << mantissa_bits) - 1);
    const bool top = exponent == (1u << exponent_bits) - 1;
    if (specials == Specials::kFn) return top && mantissa == (1u << mantissa_bits) - 1;
    if (specials == Specials::kIeee) return top && mantissa != 0;
    return false;
  }
  bool is_inf(uint32_t code) const {
    const uint32_t exponent = (code >> mantissa_bits) & ((1u << exponent_bits) - 1);
    const uint32_t mantissa = code & ((1u << mantissa_bits) - 1);
    return specials == Specials::kIeee && exponent == (1u << exponent_bits) - 1 && mantissa == 0;
  }
  // (-1)^s * 2^(1-bias) * 0.m for exponent 0; (-1)^s * 2^(e-bias) * 1.m otherwise.
  double value(uint32_t code) const {
    if (is_nan(code)) return std::numeric_limits<double>::quiet_NaN();
    const bool negative = (code & sign_bit()) != 0;
    if (is_inf(code)) return negative ? -HUGE_VAL : HUGE_VAL;
    const int exponent = static_cast<int>((code >> mantissa_bits) & ((1u << exponent_bits) - 1));
    const double fraction =
        static_cast<double>(code & ((1u << mantissa_bits) - 1)) / std::ldexp(1.0, mantissa_bits);
    const double magnitude = exponent == 0 ? std::ldexp(fraction, 1 - bias)
                                           : std::ldexp(1.0 + fraction, exponent - bias);
    return negative ? -magnitude : magnitude;
  }
};

inline const FormatDefinition kE4m3Definition{"e4m3", 4, 3, 7, FormatDefinition::Specials::kFn};
inline const FormatDefinition kE5m2Definition{"e5m2", 5, 2, 15, FormatDefinition::Specials::kIeee};
inline const FormatDefinition kE3m2Definition{"e3m2", 3, 2, 3, FormatDefinition::Specials::kNone};
inline const FormatDefinition kE2m3Definition{"e2m3", 2, 3, 1, FormatDefinition::Specials::kNone};
inline const FormatDefinition kE2m1Definition{"e2m1", 2, 1, 1, FormatDefinition::Specials::kNone};

// Non-negative finite values of a format with their codes, sorted by value.
struct MagnitudeTable {
  std::vector<double> values;
  std::vector<uint32_t> codes;
};

inline MagnitudeTable finite_magnitudes(const FormatDefinition& format) {
  std::vector<std::pair<double, uint32_t>> entries;
  for (uint32_t code = 0; code < format.sign_bit(); ++code) {
    if (format.is_nan(code) || format.is_inf(code)) continue;
    entries.emplace_back(format.value(code), code);
  }
  std::sort(entries.begin(), entries.end());
  MagnitudeTable table;
  for (const auto& [value, code] : entries) {
    table.values.push_back(value);
    table.codes.push_back(code);
  }
  return table;
}

// Nearest-even encoding of a non-NaN x by search in the table. kSaturate clamps to the
// largest finite value; kToInfinity rounds as if the exponent range continued (the next
// value past max is max + ulp(max), reached as the inf code), as IEEE-754 §7.4 specifies.
inline uint32_t reference_encode(const FormatDefinition& format, const MagnitudeTable& table,
                                 double x, Overflow overflow) {
  const uint32_t sign = std::signbit(x) ? format.sign_bit() : 0;
  const double magnitude = std::fabs(x);
  std::vector<double> values = table.values;
  std::vector<uint32_t> codes = table.codes;
  if (overflow == Overflow::kToInfinity) {
    const double ulp = values.back() - values[values.size() - 2];
    values.push_back(values.back() + ulp);
    codes.push_back(codes.back() + 1);  // the inf code follows the max code
  }
  if (magnitude >= values.back()) return sign | codes.back();
  const size_t upper = std::upper_bound(values.begin(), values.end(), magnitude) - values.begin();
  const size_t lower = upper - 1;  // values[lower] <= magnitude < values[upper]
  const double below = magnitude - values[lower];
  const double above = values[upper] - magnitude;
  size_t pick;
  if (below < above) {
    pick = lower;
  } else if (above < below) {
    pick = upper;
  } else {
    pick = (codes[lower] & 1u) == 0 ? lower : upper;  // tie: the even mantissa
  }
  return sign | codes[pick];
}

}  // namespace gnmr::test
