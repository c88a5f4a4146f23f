// mkernel — the inputs of a ring attention and its double reference, for any engine that runs it: the CPU executor
// (verify_attention.hpp), the GPU engine's tests and mk-bench ring-attention. One home for how the whole sequence is
// drawn, how it is split among the ranks (attention.hpp's placement: zigzag when causal) and what each rank's "out"
// rows must hold.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "mk/algorithms/attention.hpp"
#include "mk/exec/verify.hpp"

namespace mk {

/// The whole sequence's Q, K and V (uniform in [-1, 1), rounded once to the spec's dtype) and every rank's pieces.
struct RingAttentionData {
  RingAttentionSpec spec;
  uint32_t nRanks = 0;
  std::vector<float> q, k, v;                 ///< [batch][seq][heads][headDim], the rounded values
  std::vector<std::vector<uint8_t>> qBytes;   ///< per rank: its "q" buffer in the spec's dtype, local token order
  std::vector<std::vector<uint8_t>> kvBytes;  ///< per rank: its "kv" buffer (K, then V)
};

/// Draw the inputs of `spec` on `nRanks` ranks from `seed`. Throws what validateRingAttentionSpec throws.
RingAttentionData makeRingAttentionData(const RingAttentionSpec& spec, uint32_t nRanks, uint64_t seed);

/// Tolerance of one element: `want` the double reference, `lse` the row's reference log-sum-exp, `isLse` whether the
/// element is the log-sum-exp itself.
using RingAttentionTolerance = std::function<double(double want, double lse, bool isLse)>;

/// Compare rank `rank`'s "out" rows (float32 [batch][L][qHeads][headDim + 1]) with attention over the whole sequence
/// computed in double from data's rounded inputs, every element under `tol`; adds to `res` (checked, ok, detail of the
/// first mismatch naming rank, batch, token, position, head and column; worstRatio).
void checkRingAttentionRank(VerifyResult& res, const RingAttentionData& data, uint32_t rank, const float* out,
                            const RingAttentionTolerance& tol);

}  // namespace mk
