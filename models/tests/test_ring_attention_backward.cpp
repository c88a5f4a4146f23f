// The ring-attention backward generator (mk/algorithms/attention.hpp) and its attention-grad step: every dQ, dK and dV
// element of every rank against the dense backward of full attention in double (verify_attention.hpp), the dK/dV
// accumulators' trip around the ring, the zigzag's load balance, the step's checks and serialised forms.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "layout.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/verify_attention.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::countMoves;

namespace {

/// GQA 4 / 2, head dim 8, chunks of 3 tokens (causal) or 3 tokens per rank: odd block sizes.
RingAttentionSpec smallSpec(uint32_t ranks, bool causal) {
  RingAttentionSpec spec;
  spec.batch = 2;
  spec.qHeads = 4;
  spec.kvHeads = 2;
  spec.headDim = 8;
  spec.seq = (causal ? 2 : 1) * ranks * 3;
  spec.causal = causal;
  return spec;
}

}  // namespace

TEST_CASE("ring-attention-backward: every gradient matches the dense backward on 1 to 5 ranks, 1 and 2 nodes") {
  // Four and five ranks reuse each slot: the slot-free flags are exercised, across nodes too.
  const std::vector<std::vector<uint32_t>> placements = {{0}, {0, 0}, {0, 0, 0}, {0, 0, 1, 1}, {0, 0, 0, 1, 1}};
  for (const auto& nodeOf : placements)
    for (bool causal : {false, true}) {
      const auto R = static_cast<uint32_t>(nodeOf.size());
      CAPTURE(R);
      CAPTURE(causal);
      const RingAttentionSpec spec = smallSpec(R, causal);
      const Schedule s = generateRingAttentionBackward(spec, nodeOf);
      validate(s);  // flags fully consumed, no deadlock, no race on the ring's or the accumulators' slots
      const VerifyResult res = verifyRingAttentionBackward(s, spec, 11 + R);
      CHECK_MESSAGE(res.ok, res.detail);
      CHECK(res.worstRatio < 1);
      const uint64_t L = spec.seq / R;
      CHECK(res.checked == uint64_t{R} * spec.batch * L * (spec.qHeads + 2 * spec.kvHeads) * spec.headDim);
      // K/V travels R - 1 hops, its accumulator R (the last one home).
      CHECK(countMoves(s, StepKind::Put) + countMoves(s, StepKind::ProxyPut) == uint64_t{R} * (2 * R - 1) - (R == 1));
      CHECK((countMoves(s, StepKind::ProxyPut) > 0) == (nodeOf.back() != nodeOf.front()));
    }
}

TEST_CASE("ring-attention-backward: MQA in float32, bfloat16 and float16, odd tokens per rank, and the packed form") {
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::Float16}) {
    CAPTURE(toString(dtype));
    RingAttentionSpec spec = smallSpec(3, false);
    spec.batch = 1;
    spec.kvHeads = 1;
    spec.seq = 3 * 7;  // 7 tokens per rank
    spec.dtype = dtype;
    spec.scale = 0.5f;
    const Schedule s = generateRingAttentionBackward(spec, {0, 1, 2});
    const VerifyResult res = verifyRingAttentionBackward(s, spec, 5);
    CHECK_MESSAGE(res.ok, res.detail);
    Schedule back = scheduleFromJson(scheduleToJson(unpack(pack(s))));
    back.buffers = s.buffers;  // unpack names buffers buf0, ...; the verifier finds them by name
    CHECK(back.attentions.size() == s.attentions.size());
    CHECK(back.attentions.front().doOffset == s.attentions.front().doOffset);
    CHECK(back.attentions.front().dqAt == s.attentions.front().dqAt);
    const VerifyResult again = verifyRingAttentionBackward(back, spec, 5);
    CHECK_MESSAGE(again.ok, again.detail);
  }
}

TEST_CASE("ring-attention-backward: a missing block pair or a wrong scale is caught by the verifier") {
  const RingAttentionSpec spec = smallSpec(3, true);
  const Schedule s = generateRingAttentionBackward(spec, {0, 0, 0});
  // Without rank 2's last attention-grad step one block pair's terms are missing from rank 2's dQ and from the dK/dV of
  // the block it held last, rank 0's (rank 2 - 2), which the verifier compares first.
  Schedule missing = s;
  auto& steps = missing.lanes[2][0].steps;
  for (auto it = steps.end(); it != steps.begin(); --it)
    if (std::prev(it)->kind == StepKind::AttentionGrad) {
      steps.erase(std::prev(it));
      break;
    }
  const VerifyResult wrong = verifyRingAttentionBackward(missing, spec, 3);
  CHECK_FALSE(wrong.ok);
  CHECK_MESSAGE(wrong.detail.find("rank 0 dK") != std::string::npos, wrong.detail);
  // Another softmax scale than the forward's: P no longer matches the given log-sum-exp.
  Schedule rescaled = s;
  for (AttentionShape& sh : rescaled.attentions) sh.scale *= 1.5f;
  CHECK_FALSE(verifyRingAttentionBackward(rescaled, spec, 3).ok);
}

TEST_CASE("ring-attention-backward: causal zigzag splits the backward FLOPs evenly, 2.5 x the forward's") {
  for (uint32_t R : {2u, 4u}) {
    const RingAttentionSpec spec = smallSpec(R, true);
    const Schedule bwd = generateRingAttentionBackward(spec, std::vector<uint32_t>(R, 0));
    const Schedule fwd = generateRingAttention(spec, std::vector<uint32_t>(R, 0));
    std::vector<double> flops(R, 0);
    double forward = 0;
    for (uint32_t r = 0; r < R; ++r) {
      for (const Step& st : bwd.lanes[r][0].steps)
        if (st.kind == StepKind::AttentionGrad) flops[r] += st.flops;
      for (const Step& st : fwd.lanes[r][0].steps)
        if (st.kind == StepKind::Attention) forward += st.flops;
    }
    const double S = static_cast<double>(spec.seq);
    const double total = 2.5 * 4.0 * spec.batch * spec.qHeads * spec.headDim * S * (S + 1) / 2;
    for (uint32_t r = 0; r < R; ++r) CHECK(flops[r] == doctest::Approx(total / R));
    CHECK(forward * 2.5 == doctest::Approx(total));
  }
}

TEST_CASE("ring-attention-backward: the timeline prices attention-grad by query heads' key blocks, even with MQA") {
  RingAttentionSpec spec = smallSpec(2, false);
  spec.seq = 4096;
  spec.headDim = 128;
  spec.qHeads = 8;
  spec.kvHeads = 1;  // MQA: work units per KV head would leave most SMs idle
  Profile p = defaultProfile(topologyPreset("h200x2"));
  p.attentionTflops = 0.625 * p.gemmTflops;  // attention has a rate of its own (calib-attention)
  spec.computeCtas = p.sms - 1;              // the send lane keeps one SM
  const Schedule s = generateRingAttentionBackward(spec, {0, 0});
  const Timeline t = simulateUncontended(s, p);
  double gradUs = 0;
  for (const StepTime& st : t.steps) {
    const Step& step = s.lanes[st.rank][st.lane].steps[st.step];
    if (step.kind != StepKind::AttentionGrad) continue;
    // At the attention rate of the lane's SMs, or of fewer when its work units (a 128-row key block per batch and query
    // head) do not fill them.
    const AttentionShape& sh = s.attentions[step.aux];
    const double units = static_cast<double>(sh.batch) * sh.qHeads * ((sh.skv + 127) / 128);
    const double sms = std::min(static_cast<double>(p.sms - 1), units);
    CHECK(step.flops == doctest::Approx(2.5 * 4.0 * sh.batch * sh.qHeads * sh.headDim * sh.sq * sh.skv));
    CHECK(st.endUs - st.startUs == doctest::Approx(step.flops / (p.attentionTflops * 1e6 * sms / p.sms)));
    if (st.rank == 0) gradUs += st.endUs - st.startUs;
  }
  CHECK(gradUs > 0);
  CHECK(t.totalUs >= gradUs);
}

TEST_CASE("attention-grad: the table entry, and the validator's refusals name the region") {
  CHECK(parseStepKind("attention-grad") == StepKind::AttentionGrad);
  CHECK_FALSE(kindInfo(StepKind::AttentionGrad).gpu);  // the GPU lowering refuses it (ErrorCode::Unsupported)
  CHECK(pricedByFlops(StepKind::AttentionGrad));
  const RingAttentionSpec spec = smallSpec(2, false);
  const Schedule s = generateRingAttentionBackward(spec, {0, 0});
  Schedule x = s;
  x.attentions[0].doOffset = 1;  // dO would overlap Q
  test::expectError([&] { validate(x); }, ErrorCode::InvalidSchedule, "dO follows Q");
  x = s;
  x.attentions[0].dqAt = x.attentions[0].rowsAt;  // dQ written over the forward's rows
  test::expectError([&] { validate(x); }, ErrorCode::InvalidSchedule, "dQ (dqAt) [");
  x = s;
  x.attentions[0].rowsAt = ringAttentionBackwardLayout(spec, 2).size;  // past the end of grad
  test::expectError([&] { validate(x); }, ErrorCode::InvalidSchedule, "forward rows (rowsAt)");
  x = s;
  x.buffers[3].dtype = DType::BFloat16;
  test::expectError([&] { validate(x); }, ErrorCode::InvalidSchedule, "expected float32");
}

TEST_CASE("ring-attention-backward: a grad buffer past 2^50 elements is refused") {
  RingAttentionSpec spec = smallSpec(2, false);
  spec.seq = uint64_t{1} << 30;
  spec.headDim = 1u << 17;
  spec.qHeads = spec.kvHeads = 2;
  test::expectError([&] { generateRingAttentionBackward(spec, {0, 0}); }, ErrorCode::InvalidArgument, "2^50");
}
