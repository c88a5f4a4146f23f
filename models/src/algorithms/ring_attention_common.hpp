// mkernel — internal: what the ring-attention generators, forward (ring_attention.cpp) and backward
// (ring_attention_backward.cpp), share: the placement's chunks, the block shape of a (query chunk, key chunk) pair
// and the schedule's info.
#pragma once

#include <cstdint>
#include <optional>

#include "mk/algorithms/attention.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::gen {

/// The ring-attention blocks of `spec` on `nRanks` ranks: their chunk tokens and the shape every pair starts from.
struct RingAttentionBlocks {
  uint32_t ranks = 0;
  uint32_t chunks = 1;  ///< query and key chunks per rank: 2 when causal (zigzag), else 1
  uint32_t tokens = 0;  ///< tokens of a chunk (c)
  AttentionShape base;  ///< one chunk against one chunk, the rank's tokens as leading dimension, no mask

  /// Global chunk of chunk `i` of rank `rank`'s tokens (attention.hpp: zigzag when causal).
  uint32_t chunkOf(uint32_t rank, uint32_t i) const { return i == 0 ? rank : 2 * ranks - 1 - rank; }

  /// The shape of query chunk `qChunk` against key chunk `kChunk` (global chunks), or nothing when every key comes
  /// after every query: the diagonal pair is causal with its absolute positions, the pairs below it see every key.
  std::optional<AttentionShape> pair(uint32_t qChunk, uint32_t kChunk) const {
    if (chunks == 1) return base;  // no mask: every key of every block
    if (kChunk > qChunk) return std::nullopt;
    AttentionShape sh = base;
    if (kChunk == qChunk) {
      sh.causal = true;
      sh.qPos = sh.kvPos = uint64_t{qChunk} * tokens;
    }
    return sh;
  }
};

/// The blocks of `spec` (valid on `nRanks` ranks); V follows K in every K/V block (vOffset: the rank's K size).
inline RingAttentionBlocks ringAttentionBlocks(const RingAttentionSpec& spec, uint32_t nRanks) {
  RingAttentionBlocks b;
  b.ranks = nRanks;
  b.chunks = spec.causal ? 2 : 1;
  const auto L = static_cast<uint32_t>(spec.seq / nRanks);
  b.tokens = L / b.chunks;
  b.base.batch = spec.batch;
  b.base.qHeads = spec.qHeads;
  b.base.kvHeads = spec.kvHeads;
  b.base.headDim = spec.headDim;
  b.base.sq = b.base.skv = b.tokens;
  b.base.ldq = b.base.ldkv = b.base.ldo = L;
  b.base.scale = spec.scale > 0 ? spec.scale : defaultAttentionScale(spec.headDim);
  b.base.vOffset = uint64_t{spec.batch} * L * spec.kvHeads * spec.headDim;
  return b;
}

/// Name the schedule `op` of `spec` and fill its cost attributes (the generators' last step).
inline void finishRingAttention(Schedule& s, const RingAttentionSpec& spec, const char* op) {
  s.info.op = op;
  s.info.algo = spec.causal ? "ring-zigzag" : "ring";
  s.info.dtype = spec.dtype;
  s.info.count = spec.seq;
  fillCostAttributes(s);
}

}  // namespace mk::gen
