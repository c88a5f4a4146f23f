// mkernel — run a generated fused operator on the CPU executor against a plain reference GEMM + collective.
#pragma once

#include <cstdint>

#include "mk/algorithms/fused.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/verify.hpp"

namespace mk {

/// Fill fresh random A (m x k) and B (k x n) (seeded; the same matrices whatever the rank count), hand every rank
/// its piece in the layout of fused.hpp, execute `s` (generated for `spec`), and compare every element of every
/// rank's "c" with the reference: the exact product in double, rounded once to the dtype, taken apart as the op
/// distributes it (gemm-rs: rank r's rows; gemm-ar: all of C on every rank, also bit-identical across ranks;
/// ag-gemm: rank r's columns). With opt.localRanks (a run that spans processes, ExecOptions::proxy) this process
/// fills and checks those ranks only (gemm-ar's bit-identity: among them); every process draws the whole A and B.
///
/// Tolerance (docs/fused-operators.md, "Verification"): with SmallIntegers inputs of magnitude at most R =
/// floor(sqrt(2^t / k)) (t = 8 for bfloat16, 11 for float16), every product, fp32 accumulation and rounded
/// partial is an integer below 2^t, so any order is exact and the tolerance is 0 (when k > 2^t even R = 1 is not
/// exact, and the Uniform bound applies). Uniform inputs in [-1, 1): per element, with S = sum_k |a b|,
///   |got - ref| <= ((K' - 1) u32 + u + (P - 1) u_eff) S + u |ref|,
/// K' the longest per-rank k (the fp32 accumulation of exact products), u the dtype's unit roundoff (the partial's
/// rounding to the dtype), P - 1 reductions of the partials (P = ranks for gemm-rs and gemm-ar, 1 for ag-gemm),
/// each rounding in float and then to the dtype (u_eff = u + 2^-24), and the reference's own rounding; inflated by
/// (1 + 2 (P + 1) u_eff) for second-order terms and by P + 1 half subnormal steps.
VerifyResult verifyFused(const Schedule& s, const FusedSpec& spec, uint64_t seed, InputKind kind = InputKind::Uniform,
                         const ExecOptions& opt = {});

}  // namespace mk
