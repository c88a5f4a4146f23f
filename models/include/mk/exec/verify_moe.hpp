// mkernel — run a generated moe-dispatch-gemm on the CPU executor against an FP32 reference of the whole layer.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/algorithms/moe.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/verify.hpp"

namespace mk {

/// How verifyMoeDispatchGemm picks the router's expert ids.
enum class MoeRouting : uint8_t {
  Uniform,  ///< every token topk distinct experts drawn uniformly (seeded)
  Skewed,   ///< every token the same topk experts h, h + 1, ... (mod R x E), h drawn from the seed: expert h gets
            ///< every token of every rank, the experts outside the run none
  Given,    ///< the caller's ids
};

/// Router ids per rank: [rank][token x topk + k], global expert ids.
using MoeIds = std::vector<std::vector<int32_t>>;

/// The ids `routing` (Uniform or Skewed) gives every token of `spec` on `nRanks` ranks, drawn from `seed`.
MoeIds moeRouting(const MoeDispatchGemmSpec& spec, uint32_t nRanks, MoeRouting routing, uint64_t seed);

/// Fill the router ids (by `routing`; `ids` for Given, one tokens x topk list per rank), random bf16 tokens and
/// weights in [-1, 1) (seeded), every output element a sentinel; execute `s` (generated for `spec`) and compare
/// every element of every rank's "out" with the reference computed in double straight from the ids, tokens and
/// weights (moe.hpp says which token each row holds): rows within a block's count against the product, tolerance
/// (H u32 + u32) S with S = sum_k |x w| (fp32 accumulation of exact bf16 products), rows past it bit for bit the
/// sentinel (untouched). Throws Error(InvalidArgument) when `s` lacks a buffer of the spec's shape or `ids` does not
/// fit it, and what the executor throws: a routing over the capacity or an id out of range is refused by the
/// route before anything is written. `stats`, when given, receives what the run moved (ExecStats: the ProxyPut
/// bytes are those that crossed nodes).
VerifyResult verifyMoeDispatchGemm(const Schedule& s, const MoeDispatchGemmSpec& spec, uint64_t seed,
                                   MoeRouting routing = MoeRouting::Uniform, const MoeIds& ids = {},
                                   ExecStats* stats = nullptr);

}  // namespace mk
