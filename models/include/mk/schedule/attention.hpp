// mkernel — the shape of an attention step: one block of query rows against one block of key / value rows, for
// every (batch, query head), written as log-sum-exp rows that a reduce with op lse-merge combines exactly.
//
// Layouts (row-major, offsets in elements of the operand's dtype; ldq, ldkv, ldo are the tokens between two batches,
// so a block may be a slice of a longer sequence):
//  * Q (a):  [batch][ldq tokens][qHeads][headDim], the step reads tokens [0, sq);
//  * K (b):  [batch][ldkv tokens][kvHeads][headDim], tokens [0, skv); V has the same layout vOffset elements after K
//    in the same buffer;
//  * out (dst, float32): [batch][ldo tokens][qHeads] rows of headDim + 1 values, the attention output normalised
//    within the block, then the row's log-sum-exp of the scaled scores (natural log): RedOpShape::LseRows with
//    row = headDim, so `reduce op lse-merge row headDim` merges two blocks' results of the same queries.
// GQA / MQA: query head h reads KV head h / (qHeads / kvHeads). Causal: query i (absolute position qPos + i) sees key
// j (position kvPos + j) iff kvPos + j <= qPos + i; a row that sees no key gets output 0 and log-sum-exp -inf,
// which lse-merge weighs 0 (FlashAttention-2, arXiv 2307.08691, section 3.1; ring attention, arXiv 2310.01889).
//
// The backward step (attention-grad) uses the same shape and three more offsets, because a step has three operands
// and the backward touches eight arrays (grouped by dtype and by what stays on a rank):
//  * a (Q's dtype): Q as above, and dO (the output's gradient, Q's layout) doOffset elements after it;
//  * b (Q's dtype): K and V as above;
//  * dst (float32): the accumulators dK and dV, K's and V's layout (dV vOffset elements after dK); in the same buffer
//    at absolute offsets: the forward's rows (out's layout above, ldo; read) at rowsAt and the accumulator dQ (Q's
//    layout, ldq) at dqAt. It adds (never overwrites) dQ, dK and dV: FlashAttention-2's backward (arXiv 2307.08691,
//    algorithm 2) with P recomputed from the forward's log-sum-exp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace mk {

/// Sizes, layout and mask of an Attention step (Schedule::attentions[aux]).
struct AttentionShape {
  uint32_t batch = 0;    ///< B
  uint32_t qHeads = 0;   ///< Hq
  uint32_t kvHeads = 0;  ///< Hkv; qHeads is a multiple of it
  uint32_t headDim = 0;  ///< D
  uint32_t sq = 0;       ///< query rows per (batch, head) in the block
  uint32_t skv = 0;      ///< key / value rows per (batch, KV head) in the block
  uint32_t ldq = 0;      ///< tokens between two batches of Q (>= sq)
  uint32_t ldkv = 0;     ///< tokens between two batches of K and of V (>= skv)
  uint32_t ldo = 0;      ///< tokens between two batches of the output (>= sq)
  bool causal = false;   ///< mask keys after the query's position
  float scale = 0;       ///< scores are scale x q.k; defaultAttentionScale(headDim) is 1 / sqrt(D)
  uint64_t vOffset = 0;  ///< V starts this many elements after K in b's buffer
  uint64_t qPos = 0;     ///< absolute position of query row 0 (causal)
  uint64_t kvPos = 0;    ///< absolute position of key row 0 (causal)
  // attention-grad only (0 and ignored for attention):
  uint64_t doOffset = 0;  ///< dO starts this many elements after Q in a's buffer
  uint64_t rowsAt = 0;    ///< the forward's rows (O and log-sum-exp) start at this element of dst's buffer
  uint64_t dqAt = 0;      ///< the accumulator dQ starts at this element of dst's buffer

  /// Elements of one output row: headDim values and the log-sum-exp.
  uint64_t outRow() const noexcept { return uint64_t{headDim} + 1; }
  /// Whether query row i sees key row j.
  bool sees(uint64_t i, uint64_t j) const noexcept { return !causal || kvPos + j <= qPos + i; }
  /// Keys query row i sees: a prefix [0, visibleKeys(i)) of the block.
  uint64_t visibleKeys(uint64_t i) const noexcept {
    if (!causal) return skv;
    if (qPos + i < kvPos) return 0;
    return std::min<uint64_t>(skv, qPos + i - kvPos + 1);
  }
};

/// 1 / sqrt(headDim): the softmax scale of "Attention Is All You Need" (arXiv 1706.03762, eq. 1).
inline float defaultAttentionScale(uint32_t headDim) noexcept {
  return headDim == 0 ? 0.0f : static_cast<float>(1.0 / std::sqrt(static_cast<double>(headDim)));
}

/// Unmasked (query, key) pairs of one (batch, query head): sq x skv without a mask, the sum of visibleKeys(i) with
/// one, in closed form (the rows before the diagonal see nothing, the rows past it see the whole block).
inline uint64_t attentionPairs(const AttentionShape& sh) noexcept {
  if (!sh.causal) return uint64_t{sh.sq} * sh.skv;
  // Row i sees min(skv, max(0, d + i)) keys with d = qPos + 1 - kvPos (signed, as a long double: exact below 2^64).
  const long double d = static_cast<long double>(sh.qPos) + 1.0L - static_cast<long double>(sh.kvPos);
  const long double sq = sh.sq, skv = sh.skv;
  const long double first = std::clamp(1.0L - d, 0.0L, sq);  // first row that sees a key
  const long double full = std::clamp(skv - d, 0.0L, sq);    // first row that sees the whole block
  if (full <= first) return static_cast<uint64_t>((sq - full) * skv);
  // Rows [first, full) see d + i keys: an arithmetic series.
  const long double n = full - first;
  const long double partial = n * d + (first + full - 1.0L) * n / 2.0L;
  return static_cast<uint64_t>(partial + (sq - full) * skv);
}

/// Arithmetic of the step: 4 x batch x qHeads x headDim per unmasked pair (q.k and p.v, a multiply and an add
/// each), the count FlashAttention's papers use; the softmax's exponentials are not counted.
inline double attentionFlops(const AttentionShape& sh) noexcept {
  return 4.0 * sh.batch * sh.qHeads * sh.headDim * static_cast<double>(attentionPairs(sh));
}

/// Arithmetic of an attention-grad step: 2.5 x attentionFlops (10 per unmasked pair and head dimension: the
/// recomputed q.k, then dO.v, and the three products into dV, dQ and dK, a multiply and an add each), the count
/// FlashAttention-2's paper uses for its backward; the exponentials and the D = rowsum(dO o O) pass are not counted.
inline double attentionGradFlops(const AttentionShape& sh) noexcept { return 2.5 * attentionFlops(sh); }

/// Elements each operand spans from its offset (saturating: a hostile shape reads as out of range): Q from a, K and
/// V from b (V's block ends vOffset later), the output rows from dst.
struct AttentionElements {
  uint64_t q = 0, kv = 0, out = 0;
};

inline AttentionElements attentionElements(const AttentionShape& sh) noexcept {
  auto span = [](uint64_t batches, uint64_t ld, uint64_t rows, uint64_t rowElems) {
    // (batches - 1) x ld x rowElems + rows x rowElems, saturating.
    uint64_t stride = 0, lead = 0, last = 0, sum = 0;
    if (batches == 0 || rows == 0 || rowElems == 0) return uint64_t{0};
    if (__builtin_mul_overflow(ld, rowElems, &stride) || __builtin_mul_overflow(stride, batches - 1, &lead) ||
        __builtin_mul_overflow(rows, rowElems, &last) || __builtin_add_overflow(lead, last, &sum))
      return ~uint64_t{0};
    return sum;
  };
  AttentionElements e;
  const uint64_t d = sh.headDim;
  e.q = span(sh.batch, sh.ldq, sh.sq, uint64_t{sh.qHeads} * d);
  e.kv = span(sh.batch, sh.ldkv, sh.skv, uint64_t{sh.kvHeads} * d);
  e.out = span(sh.batch, sh.ldo, sh.sq, uint64_t{sh.qHeads} * sh.outRow());
  if (__builtin_add_overflow(e.kv, sh.vOffset, &e.kv)) e.kv = ~uint64_t{0};
  return e;
}

/// Why `sh` is no valid attention shape ("" when it is): a zero size, qHeads not a multiple of kvHeads, a leading
/// dimension below its block, a scale that is not finite and positive, V overlapping K.
inline std::string attentionShapeProblem(const AttentionShape& sh) {
  auto s = [](uint64_t v) { return std::to_string(v); };
  if (sh.batch == 0 || sh.qHeads == 0 || sh.kvHeads == 0 || sh.headDim == 0 || sh.sq == 0 || sh.skv == 0)
    return "batch, qHeads, kvHeads, headDim, sq, skv must all be > 0 (got " + s(sh.batch) + ", " + s(sh.qHeads) + ", " +
           s(sh.kvHeads) + ", " + s(sh.headDim) + ", " + s(sh.sq) + ", " + s(sh.skv) + ")";
  if (sh.qHeads % sh.kvHeads != 0)
    return "qHeads " + s(sh.qHeads) + " is not a multiple of kvHeads " + s(sh.kvHeads) +
           " (each KV head serves qHeads / kvHeads query heads)";
  if (sh.ldq < sh.sq) return "ldq " + s(sh.ldq) + " < sq " + s(sh.sq) + " (tokens between two batches of Q)";
  if (sh.ldkv < sh.skv) return "ldkv " + s(sh.ldkv) + " < skv " + s(sh.skv) + " (tokens between two batches of K)";
  if (sh.ldo < sh.sq) return "ldo " + s(sh.ldo) + " < sq " + s(sh.sq) + " (tokens between two batches of out)";
  if (!(std::isfinite(sh.scale) && sh.scale > 0))
    return "scale must be finite and > 0 (got " + std::to_string(sh.scale) + "; 1 / sqrt(headDim) is usual)";
  const uint64_t kSpan = attentionElements(AttentionShape{sh.batch, sh.qHeads, sh.kvHeads, sh.headDim, sh.sq, sh.skv,
                                                          sh.ldq, sh.ldkv, sh.ldo, sh.causal, sh.scale})
                             .kv;
  if (sh.vOffset < kSpan)
    return "vOffset " + s(sh.vOffset) + " < the " + s(kSpan) + " elements of K (V follows K in b's buffer)";
  return "";
}

/// Regions of an attention-grad step (absolute offsets from its operands' offsets or, for rows and dQ, in dst's
/// buffer): [a, a + qdo) holds Q and dO, [b, b + kv) K and V, [dst, dst + dkv) dK and dV, [rowsAt, rowsAt + rows)
/// the forward's rows, [dqAt, dqAt + dq) dQ. Saturating like attentionElements.
struct AttentionGradElements {
  uint64_t qdo = 0, kv = 0, dkv = 0, rows = 0, dq = 0;
};

inline AttentionGradElements attentionGradElements(const AttentionShape& sh) noexcept {
  const AttentionElements e = attentionElements(sh);
  AttentionGradElements g;
  g.kv = g.dkv = e.kv;
  g.rows = e.out;
  g.dq = e.q;
  if (__builtin_add_overflow(e.q, sh.doOffset, &g.qdo)) g.qdo = ~uint64_t{0};
  return g;
}

/// Why `sh` is no valid attention-grad shape ("" when it is): attentionShapeProblem, or dO overlapping Q.
inline std::string attentionGradShapeProblem(const AttentionShape& sh) {
  if (std::string problem = attentionShapeProblem(sh); !problem.empty()) return problem;
  const uint64_t q = attentionElements(sh).q;
  if (sh.doOffset < q)
    return "doOffset " + std::to_string(sh.doOffset) + " < the " + std::to_string(q) +
           " elements of Q (dO follows Q in a's buffer)";
  return "";
}

}  // namespace mk
