// mkernel — runtime extents: sizes a schedule learns only when it runs (tokens per expert, rows received).
//
// A schedule is generated once and run many times, but a mixture-of-experts layer routes a different number of
// tokens to each expert every step. An extent is a named value per rank with a static bound: buffers, offsets and
// the validator's checks use the bound (so one program serves every routing), and a step or GEMM shape that names
// the extent processes only the part the runtime value asks for. The pattern is CUTLASS's grouped-GEMM problem
// shape (per-group sizes read from device memory at run time) and DeepEP's layout -> notify -> dispatch (counts
// known on the device before the data moves).
//
// Semantics (the contract every engine implements):
//  * a Flat step (Copy, Reduce, Put, ProxyPut) with `extent` e runs count / bound(e) x value(rank, e) elements,
//    where rank is the rank that executes the step: `count` is its element count at the bound and must be a
//    multiple of it (elements per unit: a token's hidden size, say). Its signal, if any, is sent in every case,
//    also when it moves nothing;
//  * a GEMM shape with `extent` e has m / bound(e) x value(rank, e) rows at run time (m: its rows at the bound); a
//    Gemm or GroupedGemm group on it computes those rows of C and leaves the others untouched; the offsets of the
//    groups that follow it stay those of the bound (static layout);
//  * value(rank, e) <= bound(e): an engine refuses a larger value, naming the extent and the rank;
//  * who sets the values: the caller of a run (ExecOptions::extents on the CPU executor; device words the caller
//    writes for the GPU engine), read when the step starts; or, for an extent with a source, the schedule itself:
//    the value on rank r is element `sourceElement` of the int32 buffer `sourceBuffer` on rank r, read when a step
//    of rank r naming the extent starts (a route step's count, or a count another rank put there: DeepEP's
//    notify). It is an ordinary buffer element, so flags order its writer before its readers like any data, and the
//    validator's race check counts the read. A source value below 0 or above the bound is refused when it is read,
//    naming the extent, the rank, the value and the bound (a routing that overflows a receive capacity);
//  * the cost model prices `expected` unless it is given values (fillCostAttributes), also for sourced extents.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mk {

/// Step::extent / GemmShape::extent of a size fixed when the schedule is generated.
inline constexpr uint32_t kNoExtent = 0xFFFFFFFFu;
/// ExtentDecl::sourceBuffer of an extent whose values the caller gives (a buffer id is at most 65534).
inline constexpr uint16_t kNoSourceBuffer = 0xFFFFu;

/// One runtime extent of a schedule (Schedule::extents; a step names it by index).
struct ExtentDecl {
  std::string name;     ///< unique within the schedule; JSON names it
  uint64_t bound = 0;   ///< largest value on any rank, in units (tokens, rows); at least 1
  double expected = 0;  ///< the value the cost model prices when no values are given, in [0, bound]
  /// Where the schedule keeps the value (an int32 buffer, the same element on every rank), or kNoSourceBuffer: the
  /// caller gives it.
  uint16_t sourceBuffer = kNoSourceBuffer;
  uint64_t sourceElement = 0;  ///< the element of sourceBuffer holding the value
  /// Whether the schedule computes the value (sourceBuffer) rather than the caller.
  bool sourced() const noexcept { return sourceBuffer != kNoSourceBuffer; }
};

/// Runtime values of a schedule's extents: values[rank][extent], each at most the extent's bound. Empty: every
/// extent at its bound on every rank (the static schedule).
using ExtentValues = std::vector<std::vector<uint64_t>>;

/// `full` (elements or rows at the bound, a multiple of `bound`) scaled to `value` units of `bound`.
constexpr uint64_t scaleToExtent(uint64_t full, uint64_t bound, uint64_t value) noexcept {
  return bound == 0 ? 0 : full / bound * value;
}

}  // namespace mk
