// mkernel — the Hopper attention forward tile engine: for every (batch, query head, 128-row query tile) unit, the
// softmax of the scaled scores against the keys the rows see, times V, and each row's log-sum-exp: the contract of
// the `attention` step kind (mk/schedule/attention.hpp), run by one CTA of 384 threads over the units it draws
// (persistent: the resident kernel's compute lane can call it like the GEMM tile engine).
//
// Roles inside the CTA (warp specialisation, as gemm_device.hpp):
//  * warpgroup 0 = producer: one thread takes the next unit (drawn from a global counter, or the static split's),
//    publishes its number to the consumers through a shared word, loads its Q tile (128 rows x D, D / 64 boxes of 64
//    columns) into one of two Q buffers (the next unit's Q lands while this one's last tiles run) and then every K and
//    V tile of 128 keys into a ring of kStages stages with TMA; K and V complete on separate mbarriers, so
//    S = Q K^T starts before V has landed;
//  * warpgroups 1 and 2 = consumers, 64 query rows each: S = Q K^T (wgmma m64n128k16, both operands in shared
//    memory), the mask on the tiles that need one, the online softmax in registers (exp2 with the scale folded
//    in, FlashAttention-2 arXiv 2307.08691 algorithm 1), P rounded to bf16 in registers and O += P V (wgmma with
//    A from registers); a consumer frees a stage's K once its S has retired, its V once its P V has, and Q once
//    its last S has.
// The two consumers run the same key tiles on their own rows: while one does its softmax, the other's wgmmas
// keep the tensor cores busy.
//
// Tensor maps (4-D, innermost first): Q {D, qHeads, sq, batch}, K and V {D, kvHeads, skv, batch}, strides the
// token-major layout of attention.hpp; box {64, 1, 128, 1} with the 128-byte swizzle the wgmma descriptors read.
// Tokens past sq / skv are zero-filled by TMA; keys past skv are masked, query rows past sq never stored.
// Causal: the keys a row sees are a prefix of the block, so a unit runs key tiles [0, kvTiles) only (the tiles past
// its last row's prefix are skipped) and masks only the tiles that cross its diagonal or the end of the block.
// Output: float32 rows of D + 1 (the normalised values, then the natural-log log-sum-exp; a row that sees no key
// gets zeros and -inf), written from registers.
#pragma once

#include <cstdint>

#include "mk/device/attention_wgmma_device.hpp"
#include "mk/device/gemm_params_device.hpp"
#include "mk/device/gemm_primitives_device.hpp"
#include "mk/device/macros_device.hpp"

namespace mk::device {

/// Everything the engine reads, filled by the host (mk/attention.hpp); lives in param, constant or global memory
/// (TMA reads the maps from there).
struct AttentionParams {
  GemmTensorMap mapQ, mapK, mapV;     ///< 4-D bf16 maps, box {64, 1, 128, 1}, 128-byte swizzle
  float* out = nullptr;               ///< [batch][ldo][qHeads][headDim + 1] float32
  uint32_t* timeoutReport = nullptr;  ///< host-mapped words a timed-out wait reports into (or null)
  /// Resident runs (the compute lane): the budget of every wait (0: kGemmWaitLimitNs) and the word a timeout report
  /// carries in r[7] (lane << 16 | step). The standalone kernel keeps the constant budget and no tag.
  uint64_t waitLimitNs = 0;
  uint32_t tag = 0;
  /// Dynamic unit fetch: a zeroed device word the CTAs draw unit numbers from (atomicAdd), so a CTA that finishes
  /// early takes the next unit; the last draw of a run sets it back to zero for the next one on the stream. Null:
  /// CTA c runs units c, c + stride, ... (a static split). Resident steps: the first of kSlots x
  /// ProgramHeader::nAttentions zeroed words, slot-major (the binder's block; runAttentionStep picks the op's slot).
  uint32_t* unitCounter = nullptr;
  uint32_t batch = 0, qHeads = 0, kvHeads = 0, headDim = 0, sq = 0, skv = 0, ldo = 0;
  uint32_t qTiles = 0;      ///< ceil(sq / 128)
  uint32_t units = 0;       ///< batch x qHeads x qTiles
  uint32_t causal = 0;      ///< 1: key j is seen by row i iff j <= i + causalDelta
  int64_t causalDelta = 0;  ///< qPos - kvPos
  float scale = 0;          ///< scores are scale x q.k
  float scaleLog2 = 0;      ///< scale x log2(e): the softmax runs on exp2
};

/// Registers per thread the engine's kernels are launched with (65536 / 384, rounded down to a multiple of 8): what
/// setmaxnreg re-balances, and what a resident run gives every warp back at the end.
inline constexpr uint32_t kAttentionLaunchRegs = 168;

/// Tile shape, pipeline depth and shared-memory layout for head dim kD (64 or 128).
template <uint32_t kDValue>
struct AttentionTileConfig {
  static constexpr uint32_t kD = kDValue;
  static constexpr uint32_t kBlockM = 128;  ///< query rows per unit: two consumer warpgroups x 64
  static constexpr uint32_t kBlockN = 128;  ///< keys per K / V tile
  static constexpr uint32_t kBoxCols = 64;  ///< one 128-byte swizzle row of bf16
  static constexpr uint32_t kBoxes = kD / kBoxCols;
  static constexpr uint32_t kBoxBytes = 128 * kBoxCols * 2;   ///< 128 rows x 128 bytes (Q, K and V boxes alike)
  static constexpr uint32_t kTileBytes = kBoxes * kBoxBytes;  ///< one Q, K or V tile
  /// K / V stages: as many as shared memory holds beside Q (a stage is one K and one V tile).
  static constexpr uint32_t kStages = kD == 64 ? 4 : 2;
  /// Q tiles: two, so the producer loads the next unit's Q while the consumers finish this one.
  static constexpr uint32_t kQStages = 2;
  static constexpr uint32_t kConsumerWarps = 8;
  static constexpr uint32_t kThreads = 384;
  static constexpr uint32_t kProducerRegs = 72;
  static constexpr uint32_t kConsumerRegs = 216;
  static constexpr uint32_t kSmemAlign = 1024;
  /// Barriers: Q full and empty and unit full and empty per Q stage, then K full, V full, K empty and V empty
  /// per K / V stage (AttentionBarriers); then one unit-number word per Q stage.
  static constexpr uint32_t kBarriers = 4 * kQStages + 4 * kStages;
  static constexpr uint32_t kSmemBytes =
      kSmemAlign + kTileBytes * (kQStages + 2 * kStages) + 8 * kBarriers + 4 * kQStages;
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
  static_assert(kSmemBytes <= 227 * 1024, "H100/H200 give a CTA at most 227 KiB of shared memory");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 256 <= kAttentionLaunchRegs * kThreads,
                "setmaxnreg moves launch registers");
};

/// Shared-memory addresses of the engine's mbarriers (8 bytes each) from the first one; stage s of a per-stage
/// barrier is at + 8 s. K and V are freed separately: K once the scores that read it have retired, V once P V has,
/// so the producer refills a stage's K while the consumers still multiply by its V. `unit` is the word of Q stage 0
/// the producer publishes a unit number in (unitFull / unitEmpty guard it), so producer and consumers agree on the
/// units however they are drawn.
template <uint32_t kQStages, uint32_t kStages>
struct AttentionBarriers {
  uint32_t qFull, qEmpty, unitFull, unitEmpty, kFull, vFull, kEmpty, vEmpty, unit;
  MK_HOST_DEVICE_INLINE explicit AttentionBarriers(uint32_t first)
      : qFull(first),
        qEmpty(qFull + 8 * kQStages),
        unitFull(qEmpty + 8 * kQStages),
        unitEmpty(unitFull + 8 * kQStages),
        kFull(unitEmpty + 8 * kQStages),
        vFull(kFull + 8 * kStages),
        kEmpty(vFull + 8 * kStages),
        vEmpty(kEmpty + 8 * kStages),
        unit(vEmpty + 8 * kStages) {}
};

/// The (batch, query head, query tile) of unit `u`. Units are numbered (batch, KV head)-major: the CTAs that run
/// at the same time read the K / V of a few heads only, so those stay in L2 instead of streaming from HBM once per
/// query tile (with one head per CTA, B 4 x 16 heads x S 4096 reads ~2 GB per call). Inside a KV head the last
/// query tiles (the longest causal units) come first, then the query heads of the group.
struct AttentionUnit {
  uint32_t b, h, m0, kvTiles;
};

MK_HOST_DEVICE_INLINE AttentionUnit attentionUnit(const AttentionParams& p, uint32_t u) {
  const uint32_t group = p.qHeads / p.kvHeads, perKv = p.qTiles * group;
  const uint32_t bkv = u / perKv, r = u % perKv;
  const uint32_t qt = p.qTiles - 1 - r / group;
  AttentionUnit un{bkv / p.kvHeads, (bkv % p.kvHeads) * group + r % group, qt * 128, 0};
  const uint32_t last = (un.m0 + 128 < p.sq ? un.m0 + 128 : p.sq) - 1;
  int64_t end = p.skv;
  if (p.causal != 0) {
    const int64_t seen = p.causalDelta + static_cast<int64_t>(last) + 1;  // keys [0, seen) for the last row
    end = seen <= 0 ? 0 : (seen < end ? seen : end);
  }
  un.kvTiles = static_cast<uint32_t>((end + 127) / 128);
  return un;
}

/// Whether key tile t of unit `un` needs a mask: it reaches past the block's last key, or (causal) past the
/// diagonal of the unit's first row. Any other tile is seen whole by every row of the unit.
MK_HOST_DEVICE_INLINE bool attentionTileNeedsMask(const AttentionParams& p, const AttentionUnit& un, uint32_t t) {
  const uint32_t n0 = t * 128;
  return n0 + 128 > p.skv ||
         (p.causal != 0 && static_cast<int64_t>(n0 + 127) > p.causalDelta + static_cast<int64_t>(un.m0));
}

#if MK_HAVE_DEVICE_CODE

namespace attention_detail {

using gemm_detail::GemmWaiter;

/// Bounded wait (gemm_primitives_device.hpp). In a report, `stage` s < kStages names K / V stage s, kStages + s Q
/// stage s and kStages + kQStages + s the unit word of Q stage s; `unit` is the unit (or the wait's index).
/// kResident: the budget is p.waitLimitNs (else kGemmWaitLimitNs) and the report carries p.tag.
template <bool kResident>
MK_DEVICE_INLINE void waitBar(const AttentionParams& p, uint32_t bar, uint32_t parity, GemmWaiter who, uint32_t stage,
                              uint32_t unit) {
  if (gemm_detail::mbarTryWait(bar, parity)) return;
  const uint64_t limit = kResident && p.waitLimitNs != 0 ? p.waitLimitNs : kGemmWaitLimitNs;
  gemm_detail::mbarWaitBounded<kResident>(p.timeoutReport, limit, kResident ? p.tag : 0u, bar, parity, who, stage,
                                          unit);
}

/// The producer's next unit number: drawn from `counter` (the draw of the last CTA to finish sets it back to zero:
/// every CTA draws until it gets one past the units, so the draws number units + CTAs), or, without one, the static
/// split.
MK_DEVICE_INLINE uint32_t nextUnit(const AttentionParams& p, uint32_t* counter, uint32_t firstUnit, uint32_t unitStride,
                                   uint32_t i) {
  if (counter == nullptr) {
    const uint64_t u = firstUnit + uint64_t{i} * unitStride;
    return u < p.units ? static_cast<uint32_t>(u) : p.units;
  }
  const uint32_t u = atomicAdd(counter, 1u);
  if (u == p.units + unitStride - 1) atomicExch(counter, 0u);
  return u;
}

template <uint32_t kD, bool kResident>
MK_DEVICE_INLINE void produce(const AttentionParams& p, uint32_t smemQ, uint32_t smemKv, uint32_t bars,
                              uint32_t* counter, uint32_t firstUnit, uint32_t unitStride) {
  using Cfg = AttentionTileConfig<kD>;
  using namespace gemm_detail;
  const AttentionBarriers<Cfg::kQStages, Cfg::kStages> bar(bars);
  const uint32_t group = p.qHeads / p.kvHeads;
  uint32_t it = 0, qIter = 0;
  for (uint32_t i = 0;; ++i) {
    // Publish the unit (or the end, any number >= p.units) to the consumers through the unit word of slot i % 2.
    const uint32_t slot = i % Cfg::kQStages, slotPhase = (i / Cfg::kQStages) & 1;
    const uint32_t u = nextUnit(p, counter, firstUnit, unitStride, i);
    waitBar<kResident>(p, bar.unitEmpty + 8 * slot, slotPhase ^ 1, GemmWaiter::Producer,
                       Cfg::kStages + Cfg::kQStages + slot, i);
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(bar.unit + 4 * slot), "r"(u) : "memory");
    mbarArrive(bar.unitFull + 8 * slot);  // release: the consumers' wait orders their read after the store
    if (u >= p.units) break;
    const AttentionUnit un = attentionUnit(p, u);
    if (un.kvTiles == 0) continue;  // no key for any row: the consumers write zeros without Q
    const int32_t b = static_cast<int32_t>(un.b), kvh = static_cast<int32_t>(un.h / group);
    const uint32_t qs = qIter % Cfg::kQStages, q = smemQ + qs * Cfg::kTileBytes, qFull = bar.qFull + 8 * qs;
    waitBar<kResident>(p, bar.qEmpty + 8 * qs, ((qIter / Cfg::kQStages) & 1) ^ 1, GemmWaiter::Producer,
                       Cfg::kStages + qs, u);
    mbarArriveExpectTx(qFull, Cfg::kTileBytes);
    for (uint32_t box = 0; box < Cfg::kBoxes; ++box)
      tmaLoad4d(q + box * Cfg::kBoxBytes, &p.mapQ, static_cast<int32_t>(box * 64), static_cast<int32_t>(un.h),
                static_cast<int32_t>(un.m0), b, qFull);
    ++qIter;
    for (uint32_t t = 0; t < un.kvTiles; ++t, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      // A fresh barrier counts as having completed the phase before phase 0: the first pass never waits.
      const uint32_t k = smemKv + stage * 2 * Cfg::kTileBytes, v = k + Cfg::kTileBytes;
      const uint32_t kFull = bar.kFull + 8 * stage, vFull = bar.vFull + 8 * stage;
      const int32_t n0 = static_cast<int32_t>(t * 128);
      waitBar<kResident>(p, bar.kEmpty + 8 * stage, phase ^ 1, GemmWaiter::Producer, stage, u);
      mbarArriveExpectTx(kFull, Cfg::kTileBytes);
      for (uint32_t box = 0; box < Cfg::kBoxes; ++box)
        tmaLoad4d(k + box * Cfg::kBoxBytes, &p.mapK, static_cast<int32_t>(box * 64), kvh, n0, b, kFull);
      waitBar<kResident>(p, bar.vEmpty + 8 * stage, phase ^ 1, GemmWaiter::Producer, stage, u);
      mbarArriveExpectTx(vFull, Cfg::kTileBytes);
      for (uint32_t box = 0; box < Cfg::kBoxes; ++box)
        tmaLoad4d(v + box * Cfg::kBoxBytes, &p.mapV, static_cast<int32_t>(box * 64), kvh, n0, b, vFull);
    }
  }
}

/// 2^x on the SFU (ex2.approx, flush-to-zero: 2^-inf = 0).
MK_DEVICE_INLINE float fastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Max and sum over the 4 lanes that hold one accumulator row.
MK_DEVICE_INLINE float quadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
MK_DEVICE_INLINE float quadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// Mask S of key tile n0 for this thread's rows (unit rows r0 and r0 + 8): keys past the block and, causal, past
/// the row's diagonal read -inf.
MK_DEVICE_INLINE void maskTile(const AttentionParams& p, float (&s)[64], uint32_t r0, uint32_t n0, uint32_t lane) {
#pragma unroll
  for (uint32_t r = 0; r < 2; ++r) {
    int64_t lim = static_cast<int64_t>(p.skv) - n0 - 1;  // last key column of the tile the row sees
    if (p.causal != 0) {
      const int64_t diag = p.causalDelta + static_cast<int64_t>(r0 + 8 * r) - n0;
      lim = diag < lim ? diag : lim;
    }
    const int32_t l = static_cast<int32_t>(lim < -1 ? -1 : (lim > 127 ? 127 : lim));
#pragma unroll
    for (uint32_t j = 0; j < 16; ++j)
#pragma unroll
      for (uint32_t e = 0; e < 2; ++e)
        if (static_cast<int32_t>(8 * j + 2 * (lane % 4) + e) > l) s[4 * j + 2 * r + e] = -__int_as_float(0x7f800000);
  }
}

/// S = Q K^T for this consumer's 64 rows and the 128 keys of the K tile at `k`: D / 16 wgmma k-steps (4 per 64-column
/// box), committed as one group (not waited for).
template <uint32_t kD>
MK_DEVICE_INLINE void issueScores(float (&s)[64], uint32_t smemQ, uint32_t k, uint32_t consumer) {
  using Cfg = AttentionTileConfig<kD>;
  using namespace gemm_detail;
  wgmmaFence();
#pragma unroll
  for (uint32_t kk = 0; kk < kD / 16; ++kk) {
    const uint64_t descQ =
        smemDesc128B(smemQ + (kk / 4) * Cfg::kBoxBytes + consumer * 64 * 128 + (kk % 4) * 32, 16, 1024);
    const uint64_t descK = smemDesc128B(k + (kk / 4) * Cfg::kBoxBytes + (kk % 4) * 32, 16, 1024);
    wgmmaM64NK16Bf16<0>(s, descQ, descK, kk > 0 ? 1u : 0u);
  }
  wgmmaCommit();
}

/// O += P V for the V tile at `v` (N-major: key row j at j x 128 bytes, D / 64 boxes of 64 columns), P from
/// registers: 8 k-steps of 16 keys, committed as one group (not waited for).
template <uint32_t kD>
MK_DEVICE_INLINE void issueValues(float (&o)[kD / 2], const uint32_t (&pa)[8][4], uint32_t v) {
  using namespace gemm_detail;
  wgmmaFence();
#pragma unroll
  for (uint32_t kk = 0; kk < 8; ++kk)
    wgmmaM64NK16Bf16Rs<1>(o, pa[kk], smemDesc128B(v + kk * 16 * 128, AttentionTileConfig<kD>::kBoxBytes, 1024), 1u);
  wgmmaCommit();
}

/// The running softmax state of this thread's two rows.
struct RowState {
  float m[2];      ///< running max of the raw scores (-inf: no key seen yet)
  float l[2];      ///< running sum of this thread's exp2 weights (the row's 4 lanes are summed at the end)
  float alpha[2];  ///< the factor the last update asks O to be rescaled by
};

/// One key tile of the online softmax (FlashAttention-2 algorithm 1): mask when needed, the new row max, S
/// overwritten by p = 2^(s x scale' - m x scale'), l updated, alpha = 2^((m_old - m_new) x scale').
MK_DEVICE_INLINE void softmaxTile(const AttentionParams& p, float (&s)[64], RowState& st, const AttentionUnit& un,
                                  uint32_t t, uint32_t row0, uint32_t lane) {
  const float kNegInf = -__int_as_float(0x7f800000);
  const uint32_t n0 = t * 128;
  if (attentionTileNeedsMask(p, un, t)) maskTile(p, s, row0, n0, lane);
#pragma unroll
  for (uint32_t r = 0; r < 2; ++r) {
    float mx = st.m[r];
#pragma unroll
    for (uint32_t j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = quadMax(mx);
    // A row that has seen no key yet keeps m = -inf: its p are 0 and nothing is rescaled.
    const float mScaled = mx == kNegInf ? 0.0f : mx * p.scaleLog2;
    st.alpha[r] = mx == kNegInf ? 1.0f : fastExp2(st.m[r] * p.scaleLog2 - mScaled);
    st.m[r] = mx;
    float sum = 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < 16; ++j)
#pragma unroll
      for (uint32_t e = 0; e < 2; ++e) {
        const float pe = fastExp2(fmaf(s[4 * j + 2 * r + e], p.scaleLog2, -mScaled));
        s[4 * j + 2 * r + e] = pe;
        sum += pe;
      }
    st.l[r] = st.l[r] * st.alpha[r] + sum;
  }
}

template <uint32_t kRegs>
MK_DEVICE_INLINE void rescale(float (&o)[kRegs], const RowState& st) {
#pragma unroll
  for (uint32_t j = 0; j < kRegs / 4; ++j) {
    o[4 * j] *= st.alpha[0];
    o[4 * j + 1] *= st.alpha[0];
    o[4 * j + 2] *= st.alpha[1];
    o[4 * j + 3] *= st.alpha[1];
  }
}

/// P as bf16 A fragments: key columns [16 kk, 16 kk + 16) are accumulator groups 2 kk and 2 kk + 1.
MK_DEVICE_INLINE void packP(const float (&s)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (uint32_t kk = 0; kk < 8; ++kk) {
    pa[kk][0] = gemm_detail::packBf16x2(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = gemm_detail::packBf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = gemm_detail::packBf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = gemm_detail::packBf16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

template <uint32_t kRegs>
MK_DEVICE_INLINE void fenceRegs(float (&r)[kRegs]) {
#pragma unroll
  for (uint32_t i = 0; i < kRegs; ++i) wgmmaFenceOperand(r[i]);
}

/// Free a K / V stage or Q: one arrival per consumer warp, once the warp's wgmmas reading it have retired.
MK_DEVICE_INLINE void warpArrive(uint32_t bar, uint32_t lane) {
  __syncwarp();
  if (lane == 0) gemm_detail::mbarArrive(bar);
}

/// Epilogue: O / l and the row's log-sum-exp m x scale + ln l; a row that saw no key writes 0 and -inf.
template <uint32_t kD>
MK_DEVICE_INLINE void storeRows(const AttentionParams& p, const float (&o)[kD / 2], const RowState& st,
                                const AttentionUnit& un, uint32_t row0, uint32_t lane) {
  const float kNegInf = -__int_as_float(0x7f800000);
#pragma unroll
  for (uint32_t r = 0; r < 2; ++r) {
    const float sum = quadSum(st.l[r]);
    const uint32_t row = row0 + 8 * r;
    if (row >= p.sq) continue;
    float* dst = p.out + ((static_cast<uint64_t>(un.b) * p.ldo + row) * p.qHeads + un.h) * (kD + 1);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (uint32_t j = 0; j < kD / 8; ++j) {
      dst[8 * j + 2 * (lane % 4)] = o[4 * j + 2 * r] * inv;
      dst[8 * j + 2 * (lane % 4) + 1] = o[4 * j + 2 * r + 1] * inv;
    }
    if (lane % 4 == 0) dst[kD] = sum > 0.0f ? st.m[r] * p.scale + logf(sum) : kNegInf;
  }
}

/// The consumer warpgroups' loop over their units: per key tile S, wait, the softmax, P V, wait. The two consumers
/// run the same units and key tiles on their own rows, so one's softmax runs while the other's wgmmas do.
template <uint32_t kD, bool kResident>
MK_DEVICE_INLINE void consume(const AttentionParams& p, uint32_t smemQ0, uint32_t smemKv, uint32_t bars) {
  using Cfg = AttentionTileConfig<kD>;
  using namespace gemm_detail;
  const float kNegInf = -__int_as_float(0x7f800000);
  const AttentionBarriers<Cfg::kQStages, Cfg::kStages> bar(bars);
  const uint32_t consumer = threadIdx.x / 128 - 1, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const uint32_t rowOfThread = 64 * consumer + 16 * warp + lane / 4;  // in the unit; + 8 for the second row
  uint32_t it = 0, qIter = 0;
  float s[64];
  float o[kD / 2];
  uint32_t pa[8][4];
  for (uint32_t i = 0;; ++i) {
    const uint32_t slot = i % Cfg::kQStages;
    waitBar<kResident>(p, bar.unitFull + 8 * slot, (i / Cfg::kQStages) & 1, GemmWaiter::Consumer,
                       Cfg::kStages + Cfg::kQStages + slot, i);
    uint32_t u;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(u) : "r"(bar.unit + 4 * slot) : "memory");
    warpArrive(bar.unitEmpty + 8 * slot, lane);
    if (u >= p.units) break;
    const AttentionUnit un = attentionUnit(p, u);
    const uint32_t row0 = un.m0 + rowOfThread;
    RowState st{{kNegInf, kNegInf}, {0.0f, 0.0f}, {1.0f, 1.0f}};
#pragma unroll
    for (uint32_t j = 0; j < kD / 2; ++j) o[j] = 0.0f;
    uint32_t smemQ = 0, qEmpty = 0;  // this unit's Q stage
    if (un.kvTiles > 0) {
      const uint32_t qs = qIter % Cfg::kQStages;
      smemQ = smemQ0 + qs * Cfg::kTileBytes;
      qEmpty = bar.qEmpty + 8 * qs;
      waitBar<kResident>(p, bar.qFull + 8 * qs, (qIter / Cfg::kQStages) & 1, GemmWaiter::Consumer, Cfg::kStages + qs,
                         u);
      ++qIter;
    }
    for (uint32_t t = 0; t < un.kvTiles; ++t, ++it) {
      const uint32_t stage = it % Cfg::kStages, phase = (it / Cfg::kStages) & 1;
      const uint32_t k = smemKv + stage * 2 * Cfg::kTileBytes, v = k + Cfg::kTileBytes;
      waitBar<kResident>(p, bar.kFull + 8 * stage, phase, GemmWaiter::Consumer, stage, u);
      issueScores<kD>(s, smemQ, k, consumer);
      wgmmaWait<0>();
      fenceRegs(s);
      warpArrive(bar.kEmpty + 8 * stage, lane);
      if (t + 1 == un.kvTiles) warpArrive(qEmpty, lane);  // this warp's last read of Q has retired
      softmaxTile(p, s, st, un, t, row0, lane);
      rescale(o, st);
      packP(s, pa);
      waitBar<kResident>(p, bar.vFull + 8 * stage, phase, GemmWaiter::Consumer, stage, u);
      issueValues<kD>(o, pa, v);
      wgmmaWait<0>();
      fenceRegs(o);
      warpArrive(bar.vEmpty + 8 * stage, lane);
    }
    storeRows<kD>(p, o, st, un, row0, lane);
  }
}

}  // namespace attention_detail

/// Run units of `p` with this CTA of AttentionTileConfig<kD>::kThreads threads (launched with at most 168 registers
/// per thread, e.g. __launch_bounds__(384, 1)): those it draws from `counter`, or without one units firstUnit,
/// firstUnit + unitStride, ... < p.units. `unitStride` is the number of CTAs running the units (with a counter,
/// every one of them must run this routine to the end: the last draw resets the counter, and no draw of the next run
/// on the same counter may come before it); `smem` is AttentionTileConfig<kD>::kSmemBytes of dynamic shared memory the
/// CTA owns for the call. The routine initialises its mbarriers and re-balances registers with setmaxnreg; p.headDim
/// must be kD (else it traps). The standalone kernel passes p.unitCounter (stream order separates its runs); the
/// resident kernel passes its step's counter of the op's board slot (runAttentionStep: two ops in flight on a rank
/// are in different slots).
///
/// kResident (the resident kernel's compute lane, mk/device/compute_lane_device.hpp), as gemmRunTiles: every thread
/// returns, with exactly kAttentionLaunchRegs registers again (the consumers give theirs back first, then the
/// producer takes its share back: the kernel must be launched with exactly that count); the mbarriers are invalidated
/// before anyone leaves (the next step re-initialises the same shared memory); the tensor maps, written by the host
/// while the kernel ran, are acquired by the tensormap proxy before their first use; every output row is stored
/// (direct stores) when it returns.
template <uint32_t kD, bool kResident = false>
MK_DEVICE_INLINE void attentionRunUnits(const AttentionParams& p, uint8_t* smem, uint32_t* counter, uint32_t firstUnit,
                                        uint32_t unitStride) {
  using Cfg = AttentionTileConfig<kD>;
  using namespace gemm_detail;
  if (p.headDim != kD) __trap();
  const uintptr_t raw = reinterpret_cast<uintptr_t>(smem);
  uint8_t* base = smem + ((Cfg::kSmemAlign - raw % Cfg::kSmemAlign) % Cfg::kSmemAlign);
  const uint32_t smemQ = smemAddr(base);                            // Q stage s at s tiles
  const uint32_t smemKv = smemQ + Cfg::kQStages * Cfg::kTileBytes;  // stage s: K at 2 s tiles, V one tile later
  const uint32_t bars = smemKv + 2 * Cfg::kStages * Cfg::kTileBytes;
  const AttentionBarriers<Cfg::kQStages, Cfg::kStages> bar(bars);
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < Cfg::kQStages; ++s) {
      mbarInit(bar.qFull + 8 * s, 1);                     // the producer's expect_tx
      mbarInit(bar.qEmpty + 8 * s, Cfg::kConsumerWarps);  // every consumer warp
      mbarInit(bar.unitFull + 8 * s, 1);                  // the producer's arrival after its store
      mbarInit(bar.unitEmpty + 8 * s, Cfg::kConsumerWarps);
    }
    for (uint32_t s = 0; s < Cfg::kStages; ++s) {
      mbarInit(bar.kFull + 8 * s, 1);
      mbarInit(bar.vFull + 8 * s, 1);
      mbarInit(bar.kEmpty + 8 * s, Cfg::kConsumerWarps);
      mbarInit(bar.vEmpty + 8 * s, Cfg::kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x / 128 == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg::kProducerRegs));
    if (threadIdx.x == 0) {
      if constexpr (kResident) {
        // The maps were written (by a host copy) after the kernel started: order that write before the tensormap
        // proxy reads them.
        for (const GemmTensorMap* m : {&p.mapQ, &p.mapK, &p.mapV})
          asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(m))
                       : "memory");
        // Q, K and V may have been written by generic stores of other CTAs or GPUs (a ring slot a peer's put filled),
        // acquired by the lane's wait: order those before this thread's TMA (async proxy) reads of them.
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
      }
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapQ)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapK)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapV)) : "memory");
      attention_detail::produce<kD, kResident>(p, smemQ, smemKv, bars, counter, firstUnit, unitStride);
    }
    if constexpr (!kResident) return;
    // Take the registers back only once the consumers have given theirs back (gemmRunTiles explains the order).
    __syncwarp();
    namedBarrier<kGiveBackBarrier, Cfg::kThreads>();
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kAttentionLaunchRegs));
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::kConsumerRegs));
    attention_detail::consume<kD, kResident>(p, smemQ, smemKv, bars);
    if constexpr (!kResident) return;
    namedBarrier<1, 128 * 2>();  // the consumers' explicit warpgroup synchronisation between two setmaxnreg
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kAttentionLaunchRegs));
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kGiveBackBarrier), "n"(Cfg::kThreads) : "memory");
  }
  if constexpr (kResident) {
    // Every warp is back at the launch count and every TMA load completed (the consumers waited for each one they
    // were issued for): invalidate the barriers before any thread leaves.
    __syncthreads();
    if (threadIdx.x == 0) {
      for (uint32_t b = 0; b < Cfg::kBarriers; ++b)
        asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(bar.qFull + 8 * b) : "memory");
    }
    __syncthreads();
  }
}

#endif  // MK_HAVE_DEVICE_CODE

}  // namespace mk::device
