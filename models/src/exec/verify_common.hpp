// mkernel — internal: the rounding facts and the element comparison every verifier of this folder shares
// (verify.cpp for the collectives, verify_fused.cpp for the fused operators).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify.hpp"
#include "mk/util/size.hpp"

namespace mk::detail {

/// The buffer called `name` of the generated schedule `s`, of `dtype`, with `want` elements on every rank; else
/// Error(InvalidArgument) "<who>: ..." naming the buffer, what it is and what the spec needs.
inline uint16_t requireBuffer(const Schedule& s, const std::string& who, const char* name, DType dtype, uint64_t want) {
  auto bad = [&](const std::string& what) { throw Error(ErrorCode::InvalidArgument, who + ": " + what); };
  const int b = s.bufferIndex(name);
  if (b < 0) bad(std::string("the schedule has no buffer named '") + name + "' (expected one generated for this spec)");
  const BufferDecl& d = s.buffers[static_cast<std::size_t>(b)];
  if (d.dtype != dtype)
    bad(std::string("buffer '") + name + "' is " + toString(d.dtype) + ", expected " + toString(dtype));
  for (uint32_t r = 0; r < s.nRanks; ++r)
    if (d.count.size() != s.nRanks || d.count[r] != want)
      bad(std::string("buffer '") + name + "' of rank " + std::to_string(r) + " has " +
          (d.count.size() == s.nRanks ? std::to_string(d.count[r]) : std::string("no")) + " elements, expected " +
          std::to_string(want) + " for the spec");
  return static_cast<uint16_t>(b);
}

/// The dtype's unit roundoff u = 2^-(mantissa bits + 1): 2^-24 (float32), 2^-8 (bfloat16), 2^-11 (float16).
inline double unitRoundoff(DType t) { return std::ldexp(1.0, -(dtypeInfo(t).mantissaBits + 1)); }

/// Half the distance between zero and the smallest subnormal, 2^(-bias - mantissa bits): the absolute rounding
/// error floor.
inline double subnormalHalfStep(DType t) { return std::ldexp(1.0, -(dtypeInfo(t).bias + dtypeInfo(t).mantissaBits)); }

/// `v` rounded to `t` (nearest even), as float.
inline float roundTo(DType t, float v) {
  uint32_t word = 0;  // large enough for one element of any dtype
  storeElement(t, &word, 0, v);
  return loadElement(t, &word, 0);
}

/// Round a double to `t` with a single rounding. Going through float first would round twice; rounding
/// to float with round-to-odd first makes the second (nearest-even) rounding exact, because float
/// keeps at least two more bits than bf16 and half.
inline float roundOnce(DType t, double x) {
  float f = static_cast<float>(x);
  if (t == DType::Float32 || std::isnan(x) || std::isinf(f)) return roundTo(t, f);
  const auto back = static_cast<double>(f);
  if (back != x) {
    // Truncate toward zero, then force the last bit to 1 (sticky): round-to-odd.
    if (std::fabs(back) > std::fabs(x)) f = std::nextafter(f, 0.0f);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= 1u;
    std::memcpy(&f, &bits, sizeof f);
  }
  return roundTo(t, f);
}

/// One input value from 64 random bits: an integer in [-range, range] for SmallIntegers, else uniform in [-1, 1).
/// Draws come from the raw 64-bit stream (not std distributions, whose output differs between standard
/// libraries) so a seed reproduces the same inputs everywhere.
inline float inputValue(InputKind kind, uint64_t bits, uint32_t range) {
  if (kind == InputKind::SmallIntegers)
    return static_cast<float>(static_cast<int64_t>(bits % (2 * uint64_t{range} + 1)) - static_cast<int64_t>(range));
  return static_cast<float>(static_cast<double>(bits >> 11) * 0x1p-52 - 1.0);
}

/// The ranks a run holds (ExecOptions::localRanks; empty: every rank): 1 at each such rank of `n`.
inline std::vector<char> localRankMask(const ExecOptions& opt, uint32_t n) {
  std::vector<char> local(n, opt.localRanks.empty() ? 1 : 0);
  for (uint32_t r : opt.localRanks)
    if (r < n) local[r] = 1;
  return local;
}

/// Host memory for the ranks a run holds: every rank's, or (a run that spans processes) its local ranks' only.
inline HostMemory allocateLocal(const Schedule& s, const ExecOptions& opt) {
  return opt.localRanks.empty() ? HostMemory::allocate(s) : HostMemory::allocate(s, opt.localRanks);
}

/// Compare one element: |got - want| <= tol (tol 0: equal), NaN never passes. Counts it in `res`, keeps the worst
/// ratio, and on the first failure stores "<where()>: got X expected Y (tol T)" as `res.detail`.
template <class Where>
void checkElement(VerifyResult& res, double got, double want, double tol, const Where& where) {
  const double diff = std::fabs(got - want);
  ++res.checked;
  double ratio;
  if (std::isnan(got) || std::isnan(want))
    ratio = std::numeric_limits<double>::infinity();
  else if (tol == 0)
    ratio = diff == 0 ? 0 : std::numeric_limits<double>::infinity();
  else
    ratio = diff / tol;
  if (ratio > res.worstRatio) res.worstRatio = ratio;
  if (ratio > 1 || std::isnan(ratio)) {
    if (res.ok)
      res.detail = where() + ": got " + formatNumber(got, 9) + " expected " + formatNumber(want, 9) + " (tol " +
                   formatNumber(tol, 9) + ")";
    res.ok = false;
  }
}

/// Every held rank's buffer `buf` (`count` elements of `t`) bit-identical to the first held rank's; the first
/// difference becomes `res.detail` with `why` appended. Ranks whose memory this process does not hold (a run that
/// spans processes) are skipped. Skipped when `res` already failed.
inline void checkIdenticalAcrossRanks(VerifyResult& res, const HostMemory& mem, uint16_t buf, uint64_t count, DType t,
                                      const std::string& name, const std::string& why) {
  const std::size_t esize = dtypeSize(t);
  auto held = [&](std::size_t r) { return buf < mem.bytes[r].size() && mem.bytes[r][buf].size() >= count * esize; };
  std::size_t firstRank = 0;
  while (firstRank < mem.bytes.size() && !held(firstRank)) ++firstRank;
  if (firstRank == mem.bytes.size()) return;
  const std::byte* first = mem.bytes[firstRank][buf].data();
  for (std::size_t r = firstRank + 1; r < mem.bytes.size() && res.ok; ++r) {
    if (!held(r)) continue;
    const std::byte* mine = mem.bytes[r][buf].data();
    for (uint64_t i = 0; i < count; ++i)
      if (std::memcmp(first + i * esize, mine + i * esize, esize) != 0) {
        res.ok = false;
        res.detail = "rank " + std::to_string(r) + " " + name + "[" + std::to_string(i) + "]: got " +
                     formatNumber(loadElement(t, mine, i), 9) + " but rank " + std::to_string(firstRank) + " has " +
                     formatNumber(loadElement(t, first, i), 9) + " (" + why + ")";
        break;
      }
  }
}

}  // namespace mk::detail
