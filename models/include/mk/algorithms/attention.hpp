// mkernel — ring attention (forward and backward) as a schedule (issue 38 item 3): context parallelism over R ranks
// where each rank keeps its queries and the key / value blocks travel around the ring while it computes attention
// against the block it holds (ring attention, arXiv 2310.01889), the partial results merged by log-sum-exp (lse-merge).
//
// The sequence of S tokens is split over R ranks (placed on nodes by nodeOf), L = S / R tokens each:
//  * without a mask, rank r holds tokens [r L, (r + 1) L);
//  * causal, zigzag for load balance: the sequence is cut into 2R chunks of c = S / (2R) tokens and rank r holds
//    chunks r and 2R - 1 - r, in that order (its local token t < c is global token r c + t, the others
//    (2R - 1 - r) c + t - c), so every rank sees the same number of unmasked (query, key) pairs.
// Buffers of the schedule (per rank; element types: the spec's dtype for q and kv, float32 for the rest):
//   "q"    Input, B x L x Hq x D: the rank's queries, in its local token order
//   "kv"   Input, K then V, each B x L x Hkv x D: the rank's keys and values, same token order
//   "ring" Scratch, 2 slots of kv's size: the blocks that arrive from the previous rank (double-buffered)
//   "part" Scratch, B x L x Hq x (D + 1): one block's partial result before it is merged
//   "out"  Output, B x L x Hq x (D + 1): for every local token and query head the attention output over the whole
//          sequence (the keys it sees), normalised, then its log-sum-exp (the statistics a backward pass needs;
//          read O as the first D values of each row)
// Per-node K/V sharing (mKernel sends a block once per node and shares it among the node's GPUs) is not done: every
// block travels to the next rank, across the network once per rank whose predecessor is on another node.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

/// What ring-attention computes (ranks and nodes come from the placement).
struct RingAttentionSpec {
  uint32_t batch = 1;             ///< B
  uint32_t qHeads = 0;            ///< Hq
  uint32_t kvHeads = 0;           ///< Hkv: Hq is a multiple of it (GQA; 1: MQA)
  uint32_t headDim = 0;           ///< D
  uint64_t seq = 0;               ///< S: tokens of the whole sequence, a multiple of R (of 2R when causal)
  bool causal = false;            ///< mask later keys; the tokens are then placed in zigzag order
  float scale = 0;                ///< softmax scale; 0: 1 / sqrt(D)
  DType dtype = DType::BFloat16;  ///< of q and kv: float32, bfloat16 or float16
  /// Lane::ctas of the compute lane, a weight against the send lane's 1: the cost model splits a rank's SMs among
  /// its lanes by these weights, so a caller that knows the GPU gives it its SMs less one (1: half of them)
  uint32_t computeCtas = 1;
};

/// Check `spec` on `nRanks` ranks: every size and computeCtas >= 1, qHeads a multiple of kvHeads, seq a multiple of
/// nRanks (of 2 x nRanks when causal), a finite non-negative scale, a float dtype, every buffer within kMaxElements and
/// every block size within 32 bits. Throws Error(InvalidArgument) naming the field, what it must be and what it is.
void validateRingAttentionSpec(const RingAttentionSpec& spec, uint32_t nRanks);

/// Global position of local token `t` of rank `rank` (the placement above).
uint64_t ringAttentionPosition(const RingAttentionSpec& spec, uint32_t nRanks, uint32_t rank, uint64_t t);

/// Generate ring-attention on ranks placed as `nodeOf` says. Lanes of rank r:
///  * compute: for step t = 0 .. R - 1, wait for the block of rank r - t (its own kv at t = 0, then ring slot t % 2),
///    run attention of its queries against it (causal: one step per pair of a query chunk and a key chunk that is
///    not wholly masked) and lse-merge each result into out (the first one is written there directly); then
///    signal the previous rank that the slot may be overwritten;
///  * send (intra when the next rank shares the node, else inter-send): for t = 0 .. R - 2, once the block of step
///    t is there and the next rank freed the slot it goes to, put (or proxyput) it into the next rank's slot
///    (t + 1) % 2, signalling its arrival; then tell the previous rank the slot of step t is read.
/// The result passes validate() and has cost attributes filled. Throws what validateRingAttentionSpec throws.
Schedule generateRingAttention(const RingAttentionSpec& spec, const std::vector<uint32_t>& nodeOf);

// The backward (generateRingAttentionBackward): the same placement and spec. Each rank keeps its queries, the output's
// gradient dO, the forward's rows and its dQ accumulator; the K/V blocks travel around the ring as in the forward,
// each with a float32 dK/dV accumulator that every rank it visits adds its contribution to before passing it on;
// after R steps the accumulator of rank o's block is on rank o - 1, which sends it home (one last hop). The
// attention-grad step has three operands (attention.hpp), so the float32 arrays of a rank share one buffer.
// Buffers (per rank):
//   "qdo"  Input, 2 x B x L x Hq x D (the spec's dtype): the rank's queries, then dO, both in its local token order
//   "kv"   Input, K then V, each B x L x Hkv x D (the spec's dtype): as in the forward
//   "ring" Scratch, 2 slots of kv's size: the K/V blocks that arrive from the previous rank (double-buffered)
//   "grad" InOut, float32, five regions one after the other:
//          rows  B x L x Hq x (D + 1)  given: the forward's "out" (O, then the log-sum-exp)
//          dq    B x L x Hq x D        dQ, added to: zero it for a fresh gradient
//          dkv   2 x B x L x Hkv x D   dK then dV of the rank's own keys and values, added to (zero them likewise)
//          slot0, slot1  (dkv's size each): the travelling dK/dV accumulators that arrive from the previous rank
// ringAttentionBackwardLayout gives the offsets.

/// Element offsets of the regions of the backward's "grad" buffer (above) and its size.
struct RingAttentionGradLayout {
  uint64_t rows = 0, dq = 0, dkv = 0, slot0 = 0, slot1 = 0, size = 0;
};

/// The "grad" layout of the backward for `spec` on `nRanks` ranks (its spec valid there).
RingAttentionGradLayout ringAttentionBackwardLayout(const RingAttentionSpec& spec, uint32_t nRanks);

/// Generate the backward of ring-attention on ranks placed as `nodeOf` says. Lanes of rank r:
///  * compute: for step t = 0 .. R - 1, wait for the block of rank r - t and its accumulator (its own kv and grad's
///    dkv at t = 0, then ring and grad slot t % 2), run attention-grad of its queries against it (causal: one step
///    per pair of a query chunk and a key chunk that is not wholly masked), adding into dq and the accumulator, then
///    tell its send lane; at the end wait for its own dK/dV to come home;
///  * send (intra or inter-send as in the forward): for t = 0 .. R - 2, once the block of step t is there and the
///    next rank freed the slots it goes to, put K/V into the next rank's ring slot (t + 1) % 2; once the compute
///    lane is done with step t, put the accumulator into its grad slot (t + 1) % 2 (both signal its arrival; then
///    tell the previous rank the slots of step t are read); at t = R - 1 put the accumulator into the next rank's
///    grad dkv (the block is the next rank's own) and signal that it came home.
/// FLOPs: attention-grad prices 2.5 x the forward's matmul FLOPs per block. The result passes validate() and has
/// cost attributes filled. Throws what validateRingAttentionSpec throws, and Error(InvalidArgument) when the grad
/// buffer would pass kMaxElements.
Schedule generateRingAttentionBackward(const RingAttentionSpec& spec, const std::vector<uint32_t>& nodeOf);

}  // namespace mk
