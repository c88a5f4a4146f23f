// The ring-attention generator (mk/algorithms/attention.hpp): K/V blocks passed around the ring, attention against the
// block each rank holds, lse-merge of the partial results; every output element against full attention in double
// (verify_attention.hpp), the zigzag's load balance, the spec's refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "layout.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/verify_attention.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::countMoves;

namespace {

RingAttentionSpec oddSpec(uint32_t ranks, bool causal) {
  RingAttentionSpec spec;
  spec.batch = 2;
  spec.qHeads = 6;  // GQA: three query heads per KV head
  spec.kvHeads = 2;
  spec.headDim = 24;
  spec.seq = 2 * ranks * 5;  // chunks of 5 tokens
  spec.causal = causal;
  return spec;
}

}  // namespace

TEST_CASE("ring-attention: every output matches full attention on 1, 2, 3 ranks of a node and 2 nodes x 2 ranks") {
  // Five ranks reuse each ring slot twice: the slot-free flags of both lanes are exercised, across nodes too.
  const std::vector<std::vector<uint32_t>> placements = {{0}, {0, 0}, {0, 0, 0}, {0, 0, 1, 1}, {0, 0, 0, 1, 1}};
  for (const auto& nodeOf : placements)
    for (bool causal : {false, true}) {
      const auto R = static_cast<uint32_t>(nodeOf.size());
      CAPTURE(R);
      CAPTURE(causal);
      const RingAttentionSpec spec = oddSpec(R, causal);
      const Schedule s = generateRingAttention(spec, nodeOf);
      validate(s);  // flags fully consumed, no deadlock, no race on the ring's slots
      const VerifyResult res = verifyRingAttention(s, spec, 7 + R);
      CHECK_MESSAGE(res.ok, res.detail);
      CHECK(res.checked == uint64_t{R} * spec.batch * (spec.seq / R) * spec.qHeads * (spec.headDim + 1));
      // Each block travels once per hop of the ring; across nodes through the proxy.
      const bool twoNodes = nodeOf.back() != nodeOf.front();
      CHECK(countMoves(s, StepKind::Put) + countMoves(s, StepKind::ProxyPut) == uint64_t{R} * (R - 1));
      CHECK((countMoves(s, StepKind::ProxyPut) > 0) == twoNodes);
    }
}

TEST_CASE("ring-attention: float32 MQA with one batch, and the packed form runs the same") {
  RingAttentionSpec spec = oddSpec(3, true);
  spec.batch = 1;
  spec.qHeads = 4;
  spec.kvHeads = 1;
  spec.headDim = 8;
  spec.dtype = DType::Float32;
  spec.scale = 0.5f;
  const Schedule s = generateRingAttention(spec, {0, 1, 2});
  const VerifyResult res = verifyRingAttention(s, spec, 3);
  CHECK_MESSAGE(res.ok, res.detail);
  Schedule back = scheduleFromJson(scheduleToJson(unpack(pack(s))));
  back.buffers = s.buffers;  // unpack names buffers buf0, ...; the verifier finds them by name
  const VerifyResult again = verifyRingAttention(back, spec, 3);
  CHECK_MESSAGE(again.ok, again.detail);
  CHECK(again.worstRatio < 1);
  // Without rank 1's last merge its out misses one block of keys: the verifier says where.
  Schedule missing = s;
  auto& steps = missing.lanes[1][0].steps;
  for (auto it = steps.end(); it != steps.begin(); --it)
    if (std::prev(it)->kind == StepKind::Reduce) {
      steps.erase(std::prev(it));
      break;
    }
  const VerifyResult wrong = verifyRingAttention(missing, spec, 3);
  CHECK_FALSE(wrong.ok);
  CHECK(wrong.detail.find("rank 1 out[") != std::string::npos);
}

TEST_CASE("ring-attention: causal zigzag gives every rank the same attention FLOPs") {
  for (uint32_t R : {2u, 4u}) {
    const RingAttentionSpec spec = oddSpec(R, true);
    const Schedule s = generateRingAttention(spec, std::vector<uint32_t>(R, 0));
    std::vector<double> flops(R, 0);
    for (uint32_t r = 0; r < R; ++r)
      for (const Step& st : s.lanes[r][0].steps)
        if (st.kind == StepKind::Attention) flops[r] += st.flops;
    // Half the pairs of the whole sequence (plus the diagonal), split evenly.
    const double S = static_cast<double>(spec.seq);
    const double total = 4.0 * spec.batch * spec.qHeads * spec.headDim * S * (S + 1) / 2;
    for (uint32_t r = 0; r < R; ++r) CHECK(flops[r] == doctest::Approx(total / R));
  }
}

TEST_CASE("ring-attention: the timeline prices attention on the tensor cores of its lane, by its work units") {
  RingAttentionSpec spec = oddSpec(2, true);
  spec.seq = 4096;
  spec.headDim = 128;
  spec.qHeads = 8;
  spec.kvHeads = 8;
  Profile p = defaultProfile(topologyPreset("h200x2"));
  p.attentionTflops = 0.625 * p.gemmTflops;  // attention has a rate of its own (calib-attention)
  spec.computeCtas = p.sms - 1;              // the send lane keeps one SM
  const Schedule s = generateRingAttention(spec, {0, 0});
  const Timeline t = simulateUncontended(s, p);
  double attentionUs = 0;
  for (const StepTime& st : t.steps) {
    const Step& step = s.lanes[st.rank][st.lane].steps[st.step];
    if (step.kind != StepKind::Attention) continue;
    // At the attention rate of the lane's SMs, or of fewer when its work units (a 128-row query block per batch and
    // head) do not fill them.
    const AttentionShape& sh = s.attentions[step.aux];
    const double units = static_cast<double>(sh.batch) * sh.qHeads * ((sh.sq + 127) / 128);
    const double sms = std::min(static_cast<double>(p.sms - 1), units);
    CHECK(st.endUs - st.startUs == doctest::Approx(step.flops / (p.attentionTflops * 1e6 * sms / p.sms)));
    if (st.rank == 0) attentionUs += st.endUs - st.startUs;
  }
  CHECK(attentionUs > 0);
  CHECK(t.totalUs >= attentionUs);
}

TEST_CASE("ring-attention: attention steps run at attentionTflops, GEMMs at gemmTflops, each capped at its own rate") {
  Profile p = defaultProfile(topologyPreset("h200x2"));
  p.attentionTflops = 400;
  p.gemmTflops = 700;
  CHECK(stepPrice(p, StepKind::Attention, LinkClass::Local, 1e9, false).rate == 400);
  CHECK(stepPrice(p, StepKind::AttentionGrad, LinkClass::Local, 1e9, false).rate == 400);
  CHECK(stepPrice(p, StepKind::Gemm, LinkClass::Local, 1e9, false).rate == 700);
  // Rule 2b: a lane of half the SMs reaches half of the step's own rate.
  const double half = p.sms / 2.0;
  const StepPrice att = stepPrice(p, StepKind::Attention, LinkClass::Local, 1e9, false);
  CHECK(ctaCapPerUs(p, att, half, 1000) == doctest::Approx(400e6 / 2));
  CHECK(ctaCapPerUs(p, stepPrice(p, StepKind::Gemm, LinkClass::Local, 1e9, false), half, 1000) ==
        doctest::Approx(700e6 / 2));
  // A schedule of attention steps needs the attention rate, not the GEMM's.
  RingAttentionSpec spec = oddSpec(2, false);
  const Schedule s = generateRingAttention(spec, {0, 0});
  Profile noGemm = p;
  noGemm.gemmTflops = 0;
  CHECK(simulateUncontended(s, noGemm).totalUs > 0);
  Profile noAttention = p;
  noAttention.attentionTflops = 0;
  CHECK_THROWS_WITH_AS(simulateUncontended(s, noAttention), doctest::Contains("profile.attentionTflops"), Error);
}

TEST_CASE("ring-attention: a bad spec is refused naming the field") {
  auto refused = [](RingAttentionSpec spec, uint32_t ranks, const char* part) {
    CAPTURE(part);
    test::expectError([&] { generateRingAttention(spec, std::vector<uint32_t>(ranks, 0)); }, ErrorCode::InvalidArgument,
                      part);
  };
  RingAttentionSpec spec = oddSpec(2, true);
  refused(spec, 0, "no ranks");
  for (uint32_t RingAttentionSpec::*field :
       {&RingAttentionSpec::batch, &RingAttentionSpec::qHeads, &RingAttentionSpec::kvHeads, &RingAttentionSpec::headDim,
        &RingAttentionSpec::computeCtas}) {
    RingAttentionSpec zero = spec;
    zero.*field = 0;
    refused(zero, 2, "must be >= 1 (got 0)");
  }
  RingAttentionSpec x = spec;
  x.seq = 0;
  refused(x, 2, "seq must be >= 1");
  x = spec;
  x.kvHeads = 4;
  refused(x, 2, "qHeads 6 is not a multiple of kvHeads 4");
  x = spec;
  x.seq = 18;  // a multiple of 2 ranks, not of 4 zigzag chunks
  refused(x, 2, "seq 18 is not a multiple of 2 x ranks = 4");
  x.causal = false;
  refused(x, 4, "seq 18 is not a multiple of ranks = 4");
  x = spec;
  x.scale = std::numeric_limits<float>::quiet_NaN();
  refused(x, 2, "scale nan must be finite");
  x = spec;
  x.dtype = DType::Int32;
  refused(x, 2, "dtype int32 is not float32, bfloat16 or float16");
  x = spec;
  x.seq = uint64_t{1} << 36;
  refused(x, 2, "tokens per rank exceeds 2^32 - 1");
  x = spec;
  x.seq = uint64_t{1} << 30;
  x.headDim = 1u << 20;
  refused(x, 2, "holds more than 2^50 elements");
}
