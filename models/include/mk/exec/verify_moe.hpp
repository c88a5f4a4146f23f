// mkernel — run a generated moe-dispatch-gemm or moe-ffn on the CPU executor against an FP32 reference of the whole
// layer.
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

/// moe-ffn's check: the router ids as verifyMoeDispatchGemm's (`routing`, `ids`), router weights uniform in [0, 1),
/// random bf16 tokens, w1 and w2 in [-1, 1) (seeded), "y" a sentinel; execute `s` (generated for `spec`) and compare
/// every element of every rank's "y" with the reference computed straight from the inputs in double: per (token, k)
/// gate and up = x . w1 columns (2f, 2f + 1) of expert ids[t][k], h = silu(gate) x up rounded once to bf16 (where
/// the SwiGLU epilogue rounds), o = h . w2, y = sum_k weight x o. Tolerance per element, from the engine's rounding
/// points: GEMM 1's fp32 accumulation ((H + 1) u32 sum |x w1| per dot) and the float epilogue (8 u32) move h's
/// input by at most a drift d (through |silu'| <= 1.1 |up| and |silu(gate)|); rounding being monotonic, the engine's
/// h lies between the bf16 roundings of (exact -+ d), so it may differ from the reference's by eh = the larger gap
/// to them, 0 unless that interval straddles a rounding boundary; GEMM 2 adds sum_f eh |w2| + (F + 1) u32
/// sum_f (|h| + eh) |w2|; the combine, summed in double, sum_k |weight| (e_o + 2 u32 |o|) + 2 u32 |y| (o rounded to
/// float32, and across nodes once more in its node's partial sum, which the relay rounds to float32). Throws
/// what verifyMoeDispatchGemm throws (for moe-ffn's buffers), and Error(InvalidArgument) from the executor for a
/// routing over the capacity, an id out of range (at the route) or a non-finite weight (at the combine).
VerifyResult verifyMoeFfn(const Schedule& s, const MoeFfnSpec& spec, uint64_t seed,
                          MoeRouting routing = MoeRouting::Uniform, const MoeIds& ids = {}, ExecStats* stats = nullptr);

}  // namespace mk
