// mkernel — the ring-attention generator (mk/algorithms/attention.hpp): K/V blocks passed around the ring, attention
// steps against the block each rank holds, partial results merged by lse-merge.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "generator_common.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/error.hpp"
#include "mk/schedule/element.hpp"
#include "mk/schedule/pack.hpp"
#include "ring_attention_common.hpp"

namespace mk {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::InvalidArgument, "ring-attention: " + what); }

/// The buffer ids of the schedule, in declaration order (attention.hpp).
enum Buf : uint16_t { kQ, kKv, kRing, kPart, kOut };

/// Flags of every rank: a block arrived in its ring (from the previous rank's send lane); the next rank's compute
/// lane, and its send lane, are done with the slot of a step (so the slot two steps later may be overwritten).
enum Flag : uint32_t { kArrived, kComputeFreed, kSendFreed, kFlagCount };

using gen::flagStep;

}  // namespace

void validateRingAttentionSpec(const RingAttentionSpec& spec, uint32_t nRanks) {
  if (nRanks == 0) bad("no ranks: the placement must name at least one");
  if (const char* zero = gen::firstZero({{"batch", spec.batch},
                                         {"qHeads", spec.qHeads},
                                         {"kvHeads", spec.kvHeads},
                                         {"headDim", spec.headDim},
                                         {"seq", spec.seq},
                                         {"computeCtas", spec.computeCtas}}))
    bad(std::string(zero) + " must be >= 1 (got 0)");
  if (spec.qHeads % spec.kvHeads != 0)
    bad("qHeads " + std::to_string(spec.qHeads) + " is not a multiple of kvHeads " + std::to_string(spec.kvHeads) +
        " (each KV head serves qHeads / kvHeads query heads)");
  const uint64_t parts = spec.causal ? 2 * uint64_t{nRanks} : nRanks;
  if (spec.seq % parts != 0)
    bad("seq " + std::to_string(spec.seq) + " is not a multiple of " +
        (spec.causal ? "2 x ranks = " + std::to_string(parts) + " (causal attention places 2 x ranks chunks zigzag)"
                     : "ranks = " + std::to_string(parts) + " (every rank holds seq / ranks tokens)"));
  if (!(std::isfinite(spec.scale) && spec.scale >= 0))
    bad("scale " + std::to_string(spec.scale) + " must be finite and > 0 (or 0 for 1 / sqrt(headDim))");
  if (spec.dtype != DType::Float32 && spec.dtype != DType::BFloat16 && spec.dtype != DType::Float16)
    bad(std::string("dtype ") + toString(spec.dtype) + " is not float32, bfloat16 or float16");
  const uint64_t local = spec.seq / nRanks;
  if (local > std::numeric_limits<uint32_t>::max())
    bad("seq / ranks = " + std::to_string(local) + " tokens per rank exceeds 2^32 - 1 (an attention block's rows)");
  for (const auto& [name, n] :
       {std::pair<const char*, uint64_t>{"q (batch x seq / ranks x qHeads x headDim)",
                                         gen::elements({spec.batch, local, spec.qHeads, spec.headDim})},
        {"ring (4 x batch x seq / ranks x kvHeads x headDim)",
         gen::elements({4, spec.batch, local, spec.kvHeads, spec.headDim})},
        {"out (batch x seq / ranks x qHeads x (headDim + 1))",
         gen::elements({spec.batch, local, spec.qHeads, uint64_t{spec.headDim} + 1})}})
    if (n > kMaxElements)
      bad("buffer " + std::string(name) + " on " + std::to_string(nRanks) +
          " ranks holds more than 2^50 elements: use more ranks or smaller sizes");
}

uint64_t ringAttentionPosition(const RingAttentionSpec& spec, uint32_t nRanks, uint32_t rank, uint64_t t) {
  const uint64_t local = spec.seq / nRanks;
  if (!spec.causal) return uint64_t{rank} * local + t;
  const uint64_t c = local / 2;
  return t < c ? uint64_t{rank} * c + t : (2 * uint64_t{nRanks} - 1 - rank) * c + (t - c);
}

Schedule generateRingAttention(const RingAttentionSpec& spec, const std::vector<uint32_t>& nodeOf) {
  const auto R = static_cast<uint32_t>(nodeOf.size());
  validateRingAttentionSpec(spec, R);
  const uint32_t B = spec.batch, Hq = spec.qHeads, Hkv = spec.kvHeads, D = spec.headDim;
  const auto L = static_cast<uint32_t>(spec.seq / R);
  const uint32_t chunks = spec.causal ? 2 : 1, c = L / chunks;  // query and key chunks per rank, their tokens
  const uint64_t kSize = uint64_t{B} * L * Hkv * D, kvBlock = 2 * kSize;
  const uint64_t outRow = uint64_t{D} + 1, outSize = uint64_t{B} * L * Hq * outRow;

  Schedule s;
  s.nRanks = R;
  s.nodeOf = nodeOf;
  s.nFlags = kFlagCount;
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  s.buffers = {{"q", spec.dtype, BufferKind::Input, same(uint64_t{B} * L * Hq * D)},
               {"kv", spec.dtype, BufferKind::Input, same(kvBlock)},
               {"ring", spec.dtype, BufferKind::Scratch, same(2 * kvBlock)},
               {"part", DType::Float32, BufferKind::Scratch, same(outSize)},
               {"out", DType::Float32, BufferKind::Output, same(outSize)}};
  gen::RingAttentionBlocks blocks = gen::ringAttentionBlocks(spec, R);
  auto slot = [&](uint32_t rank, uint32_t t) { return bufRef(rank, kRing, (t % 2) * kvBlock); };

  s.lanes.resize(R);
  for (uint32_t r = 0; r < R; ++r) {
    const uint32_t next = (r + 1) % R, prev = (r + R - 1) % R;
    Lane compute{LaneRole::Compute, spec.computeCtas, {}};
    std::vector<bool> started(chunks, false);
    for (uint32_t t = 0; t < R; ++t) {
      const uint32_t origin = (r + R - t) % R;  // whose keys and values rank r holds at step t
      if (t >= 1) compute.steps.push_back(flagStep(StepKind::Wait, r, kArrived, t));
      const BufRef kv = t == 0 ? bufRef(r, kKv, 0) : slot(r, t);
      for (uint32_t qi = 0; qi < chunks; ++qi)
        for (uint32_t ki = 0; ki < chunks; ++ki) {
          std::optional<AttentionShape> pair = blocks.pair(blocks.chunkOf(r, qi), blocks.chunkOf(origin, ki));
          if (!pair) continue;  // every key after every query: nothing to see
          AttentionShape& sh = *pair;
          const uint64_t outAt = uint64_t{qi} * c * Hq * outRow;
          Step att;
          att.kind = StepKind::Attention;
          att.aux = gen::attentionShapeIndex(s, sh);
          att.dst = bufRef(r, started[qi] ? kPart : kOut, outAt);
          att.a = bufRef(r, kQ, uint64_t{qi} * c * Hq * D);
          att.b = kv;
          att.b.offset += uint64_t{ki} * c * Hkv * D;
          compute.steps.push_back(att);
          if (!started[qi]) {
            started[qi] = true;
            continue;
          }
          // out <- lse-merge(out, part) over the chunk's rows: contiguous over all batches for a whole-rank chunk.
          const uint64_t rows = uint64_t{c} * Hq * (chunks == 1 ? B : 1);
          for (uint32_t b = 0; b < (chunks == 1 ? 1 : B); ++b) {
            Step merge;
            merge.kind = StepKind::Reduce;
            merge.op = RedOp::LseMerge;
            merge.aux = D;
            merge.count = rows * outRow;
            merge.dst = merge.a = bufRef(r, kOut, uint64_t{b} * L * Hq * outRow + outAt);
            merge.b = bufRef(r, kPart, merge.dst.offset);
            compute.steps.push_back(merge);
          }
        }
      // The previous rank's step t + 1 send writes this slot again (slot t + 2 = slot t): it waits for this.
      if (t >= 1 && t + 3 <= R) compute.steps.push_back(gen::signalStep(nodeOf, r, prev, kComputeFreed, 1, kRing));
    }
    s.lanes[r].push_back(std::move(compute));
    if (R == 1) continue;
    Lane send{nodeOf[next] == nodeOf[r] ? LaneRole::Intra : LaneRole::InterSend, 1, {}};
    for (uint32_t t = 0; t + 2 <= R; ++t) {
      if (t >= 1) send.steps.push_back(flagStep(StepKind::Wait, r, kArrived, t));
      if (t >= 2) {  // the next rank is done with the slot this block goes to (its step t - 1)
        send.steps.push_back(flagStep(StepKind::Wait, r, kComputeFreed, t - 1));
        send.steps.push_back(flagStep(StepKind::Wait, r, kSendFreed, t - 1));
      }
      Step put;
      put.kind = nodeOf[next] == nodeOf[r] ? StepKind::Put : StepKind::ProxyPut;
      put.count = kvBlock;
      put.dst = slot(next, t + 1);
      put.a = t == 0 ? bufRef(r, kKv, 0) : slot(r, t);
      put.flags = kStepSignal;
      put.flag = FlagRef{next, kArrived};
      put.value = 1;
      send.steps.push_back(put);
      if (t >= 1 && t + 3 <= R) send.steps.push_back(gen::signalStep(nodeOf, r, prev, kSendFreed, 1, kRing));
    }
    s.lanes[r].push_back(std::move(send));
  }
  gen::finishRingAttention(s, spec, "ring-attention");
  return s;
}

}  // namespace mk
