// mkernel — the ring-attention backward generator (mk/algorithms/attention.hpp): the K/V blocks travel around the ring
// as in the forward, each with a dK/dV accumulator that every rank adds its attention-grad contribution to; dQ stays.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "generator_common.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "ring_attention_common.hpp"

namespace mk {

namespace {

/// The buffer ids of the schedule, in declaration order (attention.hpp).
enum Buf : uint16_t { kQdo, kKv, kRing, kGrad };

/// Flags of every rank: a K/V block or its accumulator arrived (two increments per step, from the previous rank's
/// send lane); its own compute lane finished a step (for its send lane); the next rank's send lane is done with the
/// slots of a step (so the slots two steps later may be overwritten); its own block's accumulator came home.
enum Flag : uint32_t { kArrived, kComputed, kFreed, kReturned, kFlagCount };

using gen::flagStep;

}  // namespace

RingAttentionGradLayout ringAttentionBackwardLayout(const RingAttentionSpec& spec, uint32_t nRanks) {
  const uint64_t L = spec.seq / nRanks, D = spec.headDim;
  const uint64_t kvBlock = 2 * gen::elements({spec.batch, L, spec.kvHeads, D});
  RingAttentionGradLayout g;
  g.dq = gen::elements({spec.batch, L, spec.qHeads, D + 1});
  g.dkv = g.dq + gen::elements({spec.batch, L, spec.qHeads, D});
  g.slot0 = g.dkv + kvBlock;
  g.slot1 = g.slot0 + kvBlock;
  g.size = g.slot1 + kvBlock;
  return g;
}

Schedule generateRingAttentionBackward(const RingAttentionSpec& spec, const std::vector<uint32_t>& nodeOf) {
  const auto R = static_cast<uint32_t>(nodeOf.size());
  validateRingAttentionSpec(spec, R);
  const RingAttentionGradLayout lay = ringAttentionBackwardLayout(spec, R);
  if (lay.size > kMaxElements)  // each term is below 2^50 (validateRingAttentionSpec): the sum cannot wrap
    throw Error(ErrorCode::InvalidArgument,
                "ring-attention-backward: buffer grad (rows, dQ and three dK/dV blocks, float32) on " +
                    std::to_string(R) + " ranks holds " + std::to_string(lay.size) +
                    " elements, more than 2^50: use more ranks or smaller sizes");
  const uint32_t B = spec.batch, Hq = spec.qHeads, Hkv = spec.kvHeads, D = spec.headDim;
  const auto L = static_cast<uint32_t>(spec.seq / R);
  const uint32_t chunks = spec.causal ? 2 : 1, c = L / chunks;  // query and key chunks per rank, their tokens
  const uint64_t qSize = uint64_t{B} * L * Hq * D, kSize = uint64_t{B} * L * Hkv * D, kvBlock = 2 * kSize;
  const uint64_t outRow = uint64_t{D} + 1;

  Schedule s;
  s.nRanks = R;
  s.nodeOf = nodeOf;
  s.nFlags = kFlagCount;
  auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
  s.buffers = {{"qdo", spec.dtype, BufferKind::Input, same(2 * qSize)},
               {"kv", spec.dtype, BufferKind::Input, same(kvBlock)},
               {"ring", spec.dtype, BufferKind::Scratch, same(2 * kvBlock)},
               {"grad", DType::Float32, BufferKind::InOut, same(lay.size)}};
  gen::RingAttentionBlocks blocks = gen::ringAttentionBlocks(spec, R);
  blocks.base.doOffset = qSize;
  // Where rank `rank` holds the block of step t and its accumulator: its own at t = 0, then slot t % 2.
  auto kvAt = [&](uint32_t rank, uint32_t t) {
    return t == 0 ? bufRef(rank, kKv, 0) : bufRef(rank, kRing, (t % 2) * kvBlock);
  };
  auto accAt = [&](uint32_t rank, uint32_t t) {
    return bufRef(rank, kGrad, t == 0 ? lay.dkv : t % 2 == 0 ? lay.slot0 : lay.slot1);
  };

  s.lanes.resize(R);
  for (uint32_t r = 0; r < R; ++r) {
    const uint32_t next = (r + 1) % R, prev = (r + R - 1) % R;
    Lane compute{LaneRole::Compute, spec.computeCtas, {}};
    for (uint32_t t = 0; t < R; ++t) {
      const uint32_t origin = (r + R - t) % R;  // whose keys and values rank r holds at step t
      if (t >= 1) compute.steps.push_back(flagStep(StepKind::Wait, r, kArrived, 2 * uint64_t{t}));
      for (uint32_t qi = 0; qi < chunks; ++qi)
        for (uint32_t ki = 0; ki < chunks; ++ki) {
          std::optional<AttentionShape> pair = blocks.pair(blocks.chunkOf(r, qi), blocks.chunkOf(origin, ki));
          if (!pair) continue;  // every key after every query: nothing to see
          AttentionShape& sh = *pair;
          sh.rowsAt = lay.rows + uint64_t{qi} * c * Hq * outRow;
          sh.dqAt = lay.dq + uint64_t{qi} * c * Hq * D;
          Step grad;
          grad.kind = StepKind::AttentionGrad;
          grad.aux = gen::attentionShapeIndex(s, sh);
          grad.dst = accAt(r, t);
          grad.dst.offset += uint64_t{ki} * c * Hkv * D;
          grad.a = bufRef(r, kQdo, uint64_t{qi} * c * Hq * D);
          grad.b = kvAt(r, t);
          grad.b.offset += uint64_t{ki} * c * Hkv * D;
          compute.steps.push_back(grad);
        }
      if (R >= 2) compute.steps.push_back(flagStep(StepKind::Signal, r, kComputed, 1));
    }
    // The last hop brings this rank's dK / dV home: the op is done when it landed.
    if (R >= 2) compute.steps.push_back(flagStep(StepKind::Wait, r, kReturned, 1));
    s.lanes[r].push_back(std::move(compute));
    if (R == 1) continue;
    const bool intra = nodeOf[next] == nodeOf[r];
    auto put = [&](BufRef dst, BufRef src, uint32_t flag) {
      Step st;
      st.kind = intra ? StepKind::Put : StepKind::ProxyPut;
      st.count = kvBlock;
      st.dst = dst;
      st.a = src;
      st.flags = kStepSignal;
      st.flag = FlagRef{next, flag};
      st.value = 1;
      return st;
    };
    Lane send{intra ? LaneRole::Intra : LaneRole::InterSend, 1, {}};
    for (uint32_t t = 0; t < R; ++t) {
      if (t + 2 <= R) {  // K/V goes on while this rank computes with it
        if (t >= 1) send.steps.push_back(flagStep(StepKind::Wait, r, kArrived, 2 * uint64_t{t}));
        // The next rank is done with the slots this block goes to (its step t - 1).
        if (t >= 2) send.steps.push_back(flagStep(StepKind::Wait, r, kFreed, t - 1));
        send.steps.push_back(put(kvAt(next, t + 1), kvAt(r, t), kArrived));
      }
      send.steps.push_back(flagStep(StepKind::Wait, r, kComputed, uint64_t{t} + 1));
      if (t + 2 <= R)
        send.steps.push_back(put(accAt(next, t + 1), accAt(r, t), kArrived));
      else  // the block of step R - 1 is the next rank's own: its accumulator goes home
        send.steps.push_back(put(bufRef(next, kGrad, lay.dkv), accAt(r, t), kReturned));
      // The previous rank's step t + 1 sends write these slots again (slot t + 2 = slot t): it waits for this.
      if (t >= 1 && t + 3 <= R) send.steps.push_back(gen::signalStep(nodeOf, r, prev, kFreed, 1, kGrad));
    }
    s.lanes[r].push_back(std::move(send));
  }
  gen::finishRingAttention(s, spec, "ring-attention-backward");
  return s;
}

}  // namespace mk
