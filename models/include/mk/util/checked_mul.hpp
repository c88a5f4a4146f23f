// mkernel — the one checked multiplication of sizes and counts taken from input: a product that does not fit in
// 64 bits is bad input named by its factors, never a wrapped value (a wrapped element count used to surface much
// later as "count must be > 0 (got 0)").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "mk/error.hpp"

namespace mk {

/// One factor of a checked product: what it is (a field, an option, "4 bytes per element") and its value.
using NamedFactor = std::pair<const char*, uint64_t>;

/// The product of `factors`, or Error(InvalidArgument) "<a> x <b> x ... = <va> x <vb> x ... overflows 64 bits
/// (<hint>)" when it does not fit in a uint64_t. `hint` says what to do (may be empty).
inline uint64_t checkedMul(std::initializer_list<NamedFactor> factors, const std::string& hint = {}) {
  uint64_t product = 1;
  bool overflow = false;
  for (const NamedFactor& f : factors) overflow = overflow || __builtin_mul_overflow(product, f.second, &product);
  if (!overflow) return product;
  std::string names, values;
  for (const NamedFactor& f : factors) {
    names += (names.empty() ? "" : " x ") + std::string(f.first);
    values += (values.empty() ? "" : " x ") + std::to_string(f.second);
  }
  throw Error(ErrorCode::InvalidArgument,
              names + " = " + values + " overflows 64 bits" + (hint.empty() ? "" : " (" + hint + ")"));
}

}  // namespace mk
