// mkernel — compute lanes of the resident kernel: Gemm steps run by the Hopper tile engine
// (mk/device/gemm_device.hpp) and Attention steps run by the attention engine (mk/device/attention_device.hpp)
// inside the resident kernel, between the communication steps of a lane.
//
// The compute-capable instantiation of the resident kernel (CommConfig::computeLanes) has 384 threads per
// CTA (one producer + two consumer warpgroups), __launch_bounds__(384, 1) and kComputeSmemBytes of
// dynamic shared memory, so one CTA fills one SM. Communication steps run unchanged with 384 threads.
//
// What crosses from the host (docs/gpu-engine.md, "Compute lanes"):
//  * at lowering, every Gemm step of a rank gets a LoweredGemm record (the aux table of the program image,
//    ProgramHeader::gemmsOffset / nGemms), every Attention step a LoweredAttention record (attentionsOffset /
//    nAttentions); LoweredStep::count is its index in its table;
//  * per op, the host binds the addresses: one device-memory block per rank, GemmParams[nGemms] then
//    AttentionParams[nAttentions] (tensor maps encoded on the host for the op's addresses), cached by
//    (program, addresses) so repeated ops with the same buffers cost one lookup. The block's address travels
//    in the op's binding table, after the schedule's own bindings: table[nRanks * nBuffers + rank].
//
// A lane of n CTAs splits a Gemm step's output tiles among its first activeCtas CTAs (CTA i runs tiles i,
// i + activeCtas, ...). The step returns once every store of this CTA's tiles is complete and visible to
// the generic proxy (direct stores, or TMA stores drained with cp.async.bulk.wait_group 0 +
// fence.proxy.async.global); the lane's usual arrive / signal path (CTA barrier, system-scope fence,
// release) then publishes them.
#pragma once

#include <cstdint>

#include "mk/device/attention_device.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/device/gemm_device.hpp"
#include "mk/device/grouped_gemm_device.hpp"
#include "mk/device/macros_device.hpp"

namespace mk::device {

/// Threads per CTA of the compute-capable resident kernel (the GEMM engine's producer + 2 consumers).
inline constexpr uint32_t kComputeThreads = GemmTileConfigT<256, false>::kThreads;

/// Dynamic shared memory of the compute-capable resident kernel: the largest of the engines' variants (GEMM:
/// 128- or 256-wide tile, direct or TMA-store epilogue; attention: head dim 64 or 128).
inline constexpr uint32_t kComputeSmemBytes = [] {
  const uint32_t v[6] = {GemmTileConfigT<128, false>::kSmemBytes, GemmTileConfigT<256, false>::kSmemBytes,
                         GemmTileConfigT<128, true>::kSmemBytes,  GemmTileConfigT<256, true>::kSmemBytes,
                         AttentionTileConfig<64>::kSmemBytes,     AttentionTileConfig<128>::kSmemBytes};
  uint32_t m = 0;
  for (uint32_t x : v) m = x > m ? x : m;
  return m;
}();
static_assert(kGroupedGemmSmemBytes<false> <= kComputeSmemBytes &&
                  GroupedGemmTileConfig::kLaunchRegs == GemmTileConfigT<256, false>::kLaunchRegs,
              "the resident grouped GEMM (direct epilogue) runs in the compute kernel's CTAs and shared memory");
static_assert(AttentionTileConfig<128>::kThreads == kComputeThreads &&
                  kAttentionLaunchRegs == GemmTileConfigT<256, false>::kLaunchRegs,
              "the attention engine runs in the compute kernel's CTAs with its launch register count");

/// LoweredGemm::flags bits.
enum LoweredGemmBits : uint32_t {
  kLgBColMajor = 1u << 0,   ///< B is stored N x K row-major (column-major K x N)
  kLgAccumulate = 1u << 1,  ///< C += A * B
  kLgTmaStore = 1u << 2,    ///< the TMA-store epilogue runs (bf16 C, n % 8 == 0, no accumulate)
};

/// One Gemm step of a rank's program, as lowered (the aux table of the program image). The host reads it
/// per op to build the step's GemmParams; the kernel reads only the GemmParams.
struct alignas(16) LoweredGemm {
  uint32_t m, n, k;        ///< C is m x n, A m x k
  uint32_t lda, ldb, ldc;  ///< leading dimensions in elements
  uint32_t blockN;         ///< tile width chosen at lowering (128 or 256)
  uint32_t flags;          ///< LoweredGemmBits
  uint32_t tiles;          ///< ceil(m / 128) x ceil(n / blockN)
  uint32_t ctas;           ///< CTAs of the lane that run tiles (LoweredStep::activeCtas)
  uint16_t lane;           ///< lane index in the schedule (diagnostics)
  uint8_t outDType;        ///< DType of C (Float32 or BFloat16)
  uint8_t reserved0;
  uint32_t step;       ///< step index in the lane (diagnostics)
  uint64_t a, b, dst;  ///< operands (kOperandShift encoding), as in the LoweredStep
};
static_assert(sizeof(LoweredGemm) == 80, "LoweredGemm is a fixed wire record");

/// One Attention step of a rank's program, as lowered (mk/schedule/attention.hpp's shape; the aux table of the program
/// image). The host reads it per op to build the step's AttentionParams (maps of Q, K, V at the op's addresses).
struct alignas(16) LoweredAttention {
  uint32_t batch, qHeads, kvHeads, headDim;
  uint32_t sq, skv, ldq, ldkv, ldo;
  uint32_t causal;  ///< 1: key j is seen by row i iff kvPos + j <= qPos + i
  float scale;      ///< scores are scale x q.k
  uint32_t units;   ///< batch x qHeads x ceil(sq / 128)
  uint32_t ctas;    ///< CTAs of the lane that run units (LoweredStep::activeCtas)
  uint16_t lane;    ///< lane index in the schedule (diagnostics)
  uint16_t reserved0;
  uint32_t step;  ///< step index in the lane (diagnostics)
  uint32_t reserved1;
  int64_t causalDelta;  ///< qPos - kvPos
  uint64_t vOffset;     ///< V starts this many elements after K in b's buffer
  uint64_t q, kv, dst;  ///< operands (kOperandShift encoding), as in the LoweredStep
};
static_assert(sizeof(LoweredAttention) == 112, "LoweredAttention is a fixed wire record");

/// LoweredGroupedGemm::flags bits.
enum LoweredGroupedGemmBits : uint32_t {
  kLggBColMajor = 1u << 0,  ///< every B_g is stored N x K row-major
  kLggSwiglu = 1u << 1,     ///< C[i][f] = silu(acc[i][2f]) x acc[i][2f + 1] (C n / 2 wide)
};

/// LoweredGroupedGemm::counts of a step whose groups have no runtime extent: every group at its bound (the host's
/// parameter block then holds the counts).
inline constexpr uint64_t kStaticGroupCounts = ~uint64_t{0};

/// One GroupedGemm step of a rank's program, as lowered (the aux table of the program image): `groups` GEMMs of one
/// shape, A and C stacked `rows` rows apart (the IR's Strided layout: each group's block at its bound), B_g blocks
/// stacked bStride elements apart; group g's rows are the int32 at counts + 4 g (the groups' sourced runtime extents,
/// consecutive elements of one buffer of the rank) or, with kStaticGroupCounts, `rows`.
struct alignas(16) LoweredGroupedGemm {
  uint32_t groups;         ///< G
  uint32_t rows;           ///< rows of each group's block in A and C (every count's bound)
  uint32_t n, k;           ///< B_g is k x n (n = 2F with swiglu)
  uint32_t lda, ldb, ldc;  ///< leading dimensions in elements
  uint32_t flags;          ///< LoweredGroupedGemmBits
  uint32_t ctas;           ///< CTAs of the lane that run tiles (LoweredStep::activeCtas)
  uint16_t lane;           ///< lane index in the schedule (diagnostics)
  uint8_t outDType;        ///< DType of C (Float32 or BFloat16)
  uint8_t reserved0;
  uint32_t step;  ///< step index in the lane (diagnostics)
  uint32_t reserved1;
  uint64_t bStride;    ///< elements between two groups' B blocks
  uint64_t a, b, dst;  ///< operands (kOperandShift encoding) of group 0, as in the LoweredStep
  uint64_t counts;     ///< operand of group 0's int32 count, or kStaticGroupCounts
};
static_assert(sizeof(LoweredGroupedGemm) == 96, "LoweredGroupedGemm is a fixed wire record");

/// Where rank `rank`'s GemmParams block of the current op sits in the binding table (after the schedule's
/// nRanks x nBuffers bindings).
MK_HOST_DEVICE_INLINE uint32_t gemmParamsBinding(uint32_t nRanks, uint32_t nBuffers, uint32_t rank) {
  return nRanks * nBuffers + rank;
}

#if MK_HAVE_DEVICE_CODE

/// The compute-capable kernel's dynamic shared memory (kComputeSmemBytes, which includes the 1 KiB of slack the
/// engine aligns it up with: declared 16-byte aligned so that the static variables are not padded to 1 KiB).
extern __shared__ __align__(16) uint8_t mkComputeLaneSmem[];

/// Run CTA `idx`'s share of Attention step `step` of op `op` (all kComputeThreads threads call it with the same
/// arguments; CTAs at or past step.activeCtas have no unit and return at once). Its AttentionParams follow the rank's
/// GemmParams in the block the binding table names. The step's CTAs draw units from its counter of the op's board
/// slot (a CTA that finishes early takes the next unit: causal units differ in length): op N + 1 of the same program
/// may run on some CTAs while others finish op N, and op N + kSlots is published only once op N is done everywhere.
MK_DEVICE_INLINE void runAttentionStep(const LoweredStep& step, const ProgramHeader* ph, const uint64_t* table,
                                       uint32_t rank, uint32_t op, uint32_t idx) {
  if (idx >= step.activeCtas) return;
  const auto* block = reinterpret_cast<const GemmParams*>(table[gemmParamsBinding(ph->nRanks, ph->nBuffers, rank)]);
  const AttentionParams& p = reinterpret_cast<const AttentionParams*>(block + ph->nGemms)[step.count];
  uint32_t* counter = p.unitCounter + size_t{op % kSlots} * ph->nAttentions;
  if (p.headDim == 64)
    attentionRunUnits<64, true>(p, mkComputeLaneSmem, counter, idx, step.activeCtas);
  else
    attentionRunUnits<128, true>(p, mkComputeLaneSmem, counter, idx, step.activeCtas);
}

/// Run CTA `idx`'s share of GroupedGemm step `step` (all kComputeThreads threads call it with the same arguments):
/// tiles idx, idx + activeCtas, ... of the list the grouped engine builds from the counts it reads when the step
/// starts. Its GroupedGemmParams follow the rank's GemmParams and AttentionParams in the block the binding table names.
MK_DEVICE_INLINE void runGroupedGemmStep(const LoweredStep& step, const ProgramHeader* ph, const uint64_t* table,
                                         uint32_t rank, uint32_t idx) {
  if (idx >= step.activeCtas) return;
  const auto* block = reinterpret_cast<const GemmParams*>(table[gemmParamsBinding(ph->nRanks, ph->nBuffers, rank)]);
  const auto* attn = reinterpret_cast<const AttentionParams*>(block + ph->nGemms);
  const GroupedGemmParams& p = reinterpret_cast<const GroupedGemmParams*>(attn + ph->nAttentions)[step.count];
  groupedGemmRunTiles<false, true>(p, mkComputeLaneSmem, idx, step.activeCtas);
}

/// Run CTA `idx`'s share of Gemm step `step` (all kComputeThreads threads call it with the same arguments).
/// CTAs at or past step.activeCtas have no tile and return at once.
MK_DEVICE_INLINE void runGemmStep(const LoweredStep& step, const ProgramHeader* ph, const uint64_t* table,
                                  uint32_t rank, uint32_t idx) {
  if (idx >= step.activeCtas) return;
  const auto* block = reinterpret_cast<const GemmParams*>(table[gemmParamsBinding(ph->nRanks, ph->nBuffers, rank)]);
  const GemmParams& p = block[step.count];
  const uint32_t units = p.tilesM * p.tilesN;
  GemmNoHook hook;
  if (p.blockN == 128) {
    if (p.tmaStoreC)
      gemmRunTiles<128, true, true>(p, mkComputeLaneSmem, idx, step.activeCtas, units, hook);
    else
      gemmRunTiles<128, false, true>(p, mkComputeLaneSmem, idx, step.activeCtas, units, hook);
  } else {
    if (p.tmaStoreC)
      gemmRunTiles<256, true, true>(p, mkComputeLaneSmem, idx, step.activeCtas, units, hook);
    else
      gemmRunTiles<256, false, true>(p, mkComputeLaneSmem, idx, step.activeCtas, units, hook);
  }
}

#endif  // MK_HAVE_DEVICE_CODE

}  // namespace mk::device
