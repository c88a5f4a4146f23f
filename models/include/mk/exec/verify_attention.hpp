// mkernel — run a generated ring-attention on the CPU executor against a double reference of full attention.
#pragma once

#include <cstdint>

#include "mk/algorithms/attention.hpp"
#include "mk/exec/verify.hpp"

namespace mk {

/// Draw the whole sequence's Q, K and V uniform in [-1, 1) (seeded) rounded to the spec's dtype, give every rank its
/// tokens (attention.hpp: zigzag when causal), execute `s` (generated for `spec`) and compare every element of every
/// rank's "out" row with attention over the whole sequence computed in double from the same rounded inputs: the D
/// output values and the log-sum-exp. Tolerance 16 x 2R x u x (1 + |lse|) x (1 + |expected|) with u = 2^-24: each
/// block is exact to a float rounding, each of the at most 2R - 1 lse-merges costs a few float roundings of exp and
/// log1p of arguments up to |lse|. Throws Error(InvalidArgument) when `s` lacks a buffer of the spec's shape, and
/// what the executor throws.
VerifyResult verifyRingAttention(const Schedule& s, const RingAttentionSpec& spec, uint64_t seed);

}  // namespace mk
