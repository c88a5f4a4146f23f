// mkernel — run a generated collective on the CPU executor against a plain reference.
//
// Tolerance argument (what verifyCollective accepts, and why that is tight enough to catch bugs):
//
//  * Non-reducing ops (allgather, broadcast, alltoall) and max/min reductions only move or select
//    values that are already representable in the dtype: every engine must reproduce them bit for bit
//    (compared as values, so +0 and -0 are equal), tolerance 0.
//  * SmallIntegers inputs are integers in [-8, 8]. Every partial sum of n of them is an integer of
//    magnitude <= 8n, and an integer is exact in a format with p significant bits while it is <= 2^p:
//    bf16 (p = 8) up to 256, half (p = 11) up to 2048, float (p = 24) up to 2^24. So any summation
//    order is exact, and the tolerance is 0, for n <= 32 ranks in bf16, n <= 256 in half, and
//    n <= 2^21 in float. Above those rank counts SmallIntegers is not a bit-exact test in that
//    dtype: use Uniform (verifyCollective does not refuse it, it just becomes stricter than the math).
//  * Uniform inputs x_1..x_n (per element) in [-1, 1). An engine computes the sum with n - 1 Reduce
//    steps in some order; each computes a + b in float and rounds once to its destination dtype, so
//    each adds an error of at most u_eff * |partial sum| <= u_eff * sum_i |x_i| (every partial sum of
//    any subset is bounded by sum_i |x_i|, to first order). The reference rounds the exact sum S once:
//    |ref - S| <= u * |ref|. Hence
//        |got - ref| <= (n - 1) * u_eff * sum_i |x_i| + u * |ref|.
//    u is the dtype's unit roundoff: 2^-24 (float32), 2^-8 (bf16), 2^-11 (half). u_eff adds 2^-24
//    for the 16-bit dtypes, because a Reduce into a 16-bit destination first rounds a + b to float and
//    then to the dtype (two roundings). The bound is inflated by (1 + 2 n u_eff) for the second-order
//    terms (partials computed from already-rounded partials), and by n times half the smallest
//    subnormal step of the dtype, since a rounding in the subnormal range is absolute, not relative.
//    Those two extras are far below one unit in the last place for any sane n, so the check still
//    catches a single dropped or doubled contribution.
//  * allreduce also requires every rank's output to be bit-identical to rank 0's: ranks that sum in
//    different orders may each be within tolerance and still disagree, which breaks data-parallel
//    training (replicas drift apart). So a correct allreduce schedule must reduce each element in the
//    same order on every rank (or compute it once and broadcast it).
//  * NaN never passes.
#include "mk/exec/verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/util/size.hpp"
#include "verify_common.hpp"

namespace mk {

using detail::roundOnce;
using detail::subnormalHalfStep;
using detail::unitRoundoff;

std::vector<std::vector<float>> referenceCollective(const CollectiveSpec& spec, uint32_t nRanks,
                                                    const std::vector<std::vector<float>>& inputs) {
  if (nRanks == 0) throw Error(ErrorCode::InvalidArgument, "referenceCollective: nRanks must be >= 1, got 0");
  if (inputs.size() != nRanks)
    throw Error(ErrorCode::InvalidArgument, "referenceCollective: got inputs for " + std::to_string(inputs.size()) +
                                                " ranks, expected nRanks = " + std::to_string(nRanks));
  const uint64_t inCount = inputCount(spec, nRanks);
  const uint64_t outCount = outputCount(spec, nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) {
    // Broadcast reads the input on the root only, so other ranks may pass anything there.
    if (spec.op == CollOp::Broadcast && r != spec.root) continue;
    if (inputs[r].size() != inCount)
      throw Error(ErrorCode::InvalidArgument, "referenceCollective: input of rank " + std::to_string(r) + " has " +
                                                  std::to_string(inputs[r].size()) + " elements, expected " +
                                                  std::to_string(inCount) + " for " + toString(spec.op) + " of count " +
                                                  std::to_string(spec.count));
  }
  if (spec.op == CollOp::Broadcast && spec.root >= nRanks)
    throw Error(ErrorCode::InvalidArgument, "referenceCollective: broadcast root " + std::to_string(spec.root) +
                                                " is not a rank (nRanks = " + std::to_string(nRanks) + ")");

  const uint64_t count = spec.count;
  // Reduction of element `idx` of every rank's input, in rank order 0..n-1.
  auto reduceAt = [&](uint64_t idx) -> float {
    if (spec.redop == RedOp::Sum) {
      double acc = 0;
      for (uint32_t r = 0; r < nRanks; ++r) acc += static_cast<double>(inputs[r][idx]);
      return roundOnce(spec.dtype, acc);
    }
    // Max/min select an input (already a dtype value): exact, no rounding.
    float acc = inputs[0][idx];
    for (uint32_t r = 1; r < nRanks; ++r) acc = applyRedOp(spec.redop, acc, inputs[r][idx]);
    return acc;
  };

  std::vector<std::vector<float>> out(nRanks, std::vector<float>(outCount));
  switch (spec.op) {
    case CollOp::AllReduce: {
      std::vector<float> reduced(count);
      for (uint64_t i = 0; i < count; ++i) reduced[i] = reduceAt(i);
      for (uint32_t r = 0; r < nRanks; ++r) out[r] = reduced;
      break;
    }
    case CollOp::AllGather:
      for (uint32_t r = 0; r < nRanks; ++r)
        for (uint32_t j = 0; j < nRanks; ++j)
          std::copy(inputs[j].begin(), inputs[j].end(), out[r].begin() + static_cast<std::ptrdiff_t>(j * count));
      break;
    case CollOp::ReduceScatter:
      for (uint32_t r = 0; r < nRanks; ++r)
        for (uint64_t i = 0; i < count; ++i) out[r][i] = reduceAt(r * count + i);
      break;
    case CollOp::Broadcast:
      for (uint32_t r = 0; r < nRanks; ++r) out[r] = inputs[spec.root];
      break;
    case CollOp::AllToAll:
      for (uint32_t r = 0; r < nRanks; ++r)
        for (uint32_t j = 0; j < nRanks; ++j)
          for (uint64_t i = 0; i < count; ++i) out[r][j * count + i] = inputs[j][r * count + i];
      break;
  }
  return out;
}

VerifyResult verifyCollective(const Schedule& s, const CollectiveSpec& spec, uint64_t seed, InputKind kind,
                              const ExecOptions& opt) {
  const uint32_t n = s.nRanks;
  auto findBuffer = [&](const char* name) -> uint16_t {
    for (std::size_t b = 0; b < s.buffers.size(); ++b)
      if (s.buffers[b].name == name) {
        const BufferDecl& d = s.buffers[b];
        if (d.dtype != spec.dtype)
          throw Error(ErrorCode::InvalidArgument, std::string("verifyCollective: buffer '") + name + "' is " +
                                                      toString(d.dtype) + ", the spec says " + toString(spec.dtype));
        if (d.count.size() != n)
          throw Error(ErrorCode::InvalidArgument, std::string("verifyCollective: buffer '") + name + "' has " +
                                                      std::to_string(d.count.size()) + " per-rank counts, expected " +
                                                      std::to_string(n));
        return static_cast<uint16_t>(b);
      }
    throw Error(ErrorCode::InvalidArgument,
                std::string("verifyCollective: the schedule has no buffer named '") + name + "'");
  };
  if (n == 0) throw Error(ErrorCode::InvalidArgument, "verifyCollective: the schedule has no ranks");
  const uint16_t inBuf = findBuffer("input");
  const uint16_t outBuf = findBuffer("output");
  const uint64_t inCount = inputCount(spec, n);
  const uint64_t outCount = outputCount(spec, n);
  for (uint32_t r = 0; r < n; ++r) {
    const bool inputRead = spec.op != CollOp::Broadcast || r == spec.root;
    if (inputRead && s.buffers[inBuf].count[r] != inCount)
      throw Error(ErrorCode::InvalidArgument, "verifyCollective: 'input' of rank " + std::to_string(r) + " has " +
                                                  std::to_string(s.buffers[inBuf].count[r]) + " elements, expected " +
                                                  std::to_string(inCount) + " for " + toString(spec.op) + " of count " +
                                                  std::to_string(spec.count));
    if (s.buffers[outBuf].count[r] != outCount)
      throw Error(ErrorCode::InvalidArgument, "verifyCollective: 'output' of rank " + std::to_string(r) + " has " +
                                                  std::to_string(s.buffers[outBuf].count[r]) + " elements, expected " +
                                                  std::to_string(outCount) + " for " + toString(spec.op) +
                                                  " of count " + std::to_string(spec.count));
  }

  // A run that spans processes (opt.localRanks) holds and checks its own ranks; every process draws every rank's
  // inputs (the reference needs them all) from the same seed.
  const std::vector<char> local = detail::localRankMask(opt, n);
  HostMemory mem = detail::allocateLocal(s, opt);
  std::vector<std::vector<float>> inputs(n);
  for (uint32_t r = 0; r < n; ++r) {
    std::mt19937_64 rng(seed + r);
    const uint64_t have = s.buffers[inBuf].count[r];
    std::byte* base = local[r] ? mem.bytes[r][inBuf].data() : nullptr;
    inputs[r].resize(have);
    for (uint64_t i = 0; i < have; ++i) {
      const float v = detail::inputValue(kind, rng(), 8);
      inputs[r][i] = detail::roundTo(spec.dtype, v);
      if (base) storeElement(spec.dtype, base, i, v);
    }
  }

  execute(s, mem, opt);

  const std::vector<std::vector<float>> ref = referenceCollective(spec, n, inputs);
  const bool summing = spec.redop == RedOp::Sum && (spec.op == CollOp::AllReduce || spec.op == CollOp::ReduceScatter);
  const bool exact = kind == InputKind::SmallIntegers || !summing;
  const double u = unitRoundoff(spec.dtype);
  const double uEff = u + (spec.dtype == DType::Float32 ? 0.0 : 0x1p-24);
  const double nd = static_cast<double>(n);

  // sum_i |x_i| per input element, once (not once per rank and output element).
  std::vector<double> absSum;
  if (!exact) {
    absSum.assign(inCount, 0.0);
    for (uint32_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < inCount; ++i) absSum[i] += std::fabs(static_cast<double>(inputs[j][i]));
  }

  VerifyResult res;
  res.ok = true;
  res.detail = "OK";
  for (uint32_t r = 0; r < n; ++r) {
    if (!local[r]) continue;
    const std::byte* base = mem.bytes[r][outBuf].data();
    for (uint64_t i = 0; i < outCount; ++i) {
      const double got = loadElement(spec.dtype, base, i);
      const double want = ref[r][i];
      double tol = 0;
      if (!exact) {
        // Which input elements were summed into this output element.
        const uint64_t src = spec.op == CollOp::ReduceScatter ? r * spec.count + i : i;
        tol = ((nd - 1) * uEff * absSum[src] + u * std::fabs(want)) * (1 + 2 * nd * uEff) +
              nd * subnormalHalfStep(spec.dtype);
      }
      detail::checkElement(res, got, want, tol,
                           [&] { return "rank " + std::to_string(r) + " output[" + std::to_string(i) + "]"; });
    }
  }

  if (spec.op == CollOp::AllReduce)
    detail::checkIdenticalAcrossRanks(res, mem, outBuf, outCount, spec.dtype, "output",
                                      "allreduce outputs must be bit-identical on every rank");
  return res;
}

}  // namespace mk
