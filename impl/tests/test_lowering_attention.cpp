// The lowering of Attention steps and lse-merge Reduces (impl/src/lowering/attention_step.cpp, lowering.cpp) for the
// resident kernel's compute lane: the records the attention engine reads, CTA splits, lane barriers and every
// refusal, on ring-attention schedules from the real generator and on hand-made one-step schedules. No GPU.
#include <doctest/doctest.h>

#include <string>

#include "gemm/gemm_lane_params.hpp"
#include "lowering/lowering.hpp"
#include "lowering_test_util.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/schedule/step_kind.hpp"

namespace {

using mk::DType;
using mk::RingAttentionSpec;
using mk::StepKind;
using mk::runtime::LoweredProgram;
using mk::runtime::LowerOptions;
using mk::runtime::lowerRank;

RingAttentionSpec ringSpec(uint32_t d, bool causal, DType dtype = DType::BFloat16) {
  RingAttentionSpec spec;
  spec.batch = 2;
  spec.qHeads = 4;
  spec.kvHeads = 2;
  spec.headDim = d;
  spec.seq = 4 * 300;
  spec.causal = causal;
  spec.dtype = dtype;
  spec.computeCtas = 8;
  return spec;
}

LowerOptions workers(uint32_t n) {
  LowerOptions o;
  o.nWorkers = n;
  return o;
}

}  // namespace

TEST_CASE("lowering attention: every Attention step of ring attention gets its record, CTAs and index") {
  for (const uint32_t d : {64u, 128u})
    for (const bool causal : {false, true}) {
      CAPTURE(d);
      CAPTURE(causal);
      const RingAttentionSpec spec = ringSpec(d, causal);
      const mk::Schedule s = mk::generateRingAttention(spec, {0, 0, 0, 0});
      for (uint32_t r = 0; r < 4; ++r) {
        const LoweredProgram p = lowerRank(s, r, workers(20));
        const auto& h = p.header();
        const auto* rec = mk::runtime::loweredAttentions(p);
        uint32_t seen = 0, merges = 0;
        for (uint32_t i = 0; i < h.nSteps; ++i) {
          const mk::device::LoweredStep& ls = p.steps()[i];
          const bool afterAttention = i > 0 && p.steps()[i - 1].kind == static_cast<uint8_t>(StepKind::Attention);
          if (ls.kind == static_cast<uint8_t>(StepKind::Attention)) {
            REQUIRE(ls.count == seen);
            const auto& a = rec[seen++];
            const uint32_t c = causal ? 150 : 300;  // tokens of one chunk
            CHECK(a.headDim == d);
            CHECK(a.sq == c);
            CHECK(a.skv == c);
            CHECK(a.ldq == 300);
            CHECK(a.batch == 2);
            CHECK(a.units == 2 * 4 * ((c + 127) / 128));
            CHECK(a.ctas == ls.activeCtas);
            CHECK(a.ctas >= 1);
            CHECK(a.ctas <= a.units);
            CHECK(a.vOffset == 2ull * 300 * 2 * d);
            CHECK(a.q == ls.a);
            CHECK(a.kv == ls.b);
            CHECK(a.dst == ls.dst);
            CHECK(a.causalDelta == 0);  // the zigzag's diagonal blocks start at the same position
          }
          if (ls.kind == static_cast<uint8_t>(StepKind::Reduce)) {
            ++merges;
            CHECK(ls.redop == static_cast<uint8_t>(mk::RedOp::LseMerge));
            CHECK(ls.extentUnit == d);
            CHECK(ls.count % (d + 1) == 0);
            CHECK(ls.activeCtas <= ls.count / (d + 1));
            // The first merge after an Attention step reads the part it wrote in units: the lane's CTAs meet first
            // (the other batches' merges of a causal chunk touch other rows and need no second meeting).
            if (afterAttention) CHECK((ls.bits & mk::device::kLsBarrierBefore) != 0);
          }
        }
        CHECK(seen == h.nAttentions);
        CHECK(seen >= 4);
        CHECK(merges >= 3);
        CHECK(mk::runtime::computeStepCount(p) == seen);
        CHECK(h.attentionsOffset % 16 == 0);
        CHECK(h.attentionsOffset + h.nAttentions * sizeof(mk::device::LoweredAttention) <= h.totalBytes);
      }
    }
}

TEST_CASE("lowering attention: shapes and operands the engine cannot run are refused naming the reason") {
  auto refused = [](const RingAttentionSpec& spec) {
    return mkt::loweringErrorOf(mk::generateRingAttention(spec, {0, 0}), 0, workers(8));
  };
  std::string msg = refused(ringSpec(32, false));
  CAPTURE(msg);
  CHECK(msg.find("unsupported") == 0);
  CHECK(msg.find("(attention)") != std::string::npos);
  CHECK(msg.find("headDim 32 is not supported by the GPU attention engine (64 or 128)") != std::string::npos);
  msg = refused(ringSpec(64, false, DType::Float16));
  CHECK(msg.find("reads bf16 Q, K and V only") != std::string::npos);

  // An Attention step whose Q starts off a 16-byte boundary, and one that reads another rank's K / V.
  mk::Schedule s = mk::generateRingAttention(ringSpec(64, false), {0, 0});
  mk::Step* att = nullptr;
  for (mk::Step& st : s.lanes[0][0].steps)
    if (st.kind == StepKind::Attention) att = &st;
  REQUIRE(att != nullptr);
  att->a.offset = 4;
  msg = mkt::loweringErrorOf(s, 0, workers(8));
  CHECK(msg.find("Q (a) starts 4 elements into its buffer, not a multiple of 8") != std::string::npos);
  att->a.offset = 0;
  att->b.rank = 1;
  msg = mkt::loweringErrorOf(s, 0, workers(8));
  CHECK(msg.find("K / V (b) lives on rank 1") != std::string::npos);
  att->b.rank = 0;
  att->aux = 99;
  msg = mkt::loweringErrorOf(s, 0, workers(8));
  CHECK(msg.find("attention index 99 is outside the schedule's") != std::string::npos);
}

TEST_CASE("lowering attention: lse-merge of bf16 rows or of a count that is no whole row is refused") {
  mk::Schedule s = mk::generateRingAttention(ringSpec(64, false), {0, 0});
  mk::Step* merge = nullptr;
  for (mk::Step& st : s.lanes[0][0].steps)
    if (st.kind == StepKind::Reduce) merge = &st;
  REQUIRE(merge != nullptr);
  CHECK(mkt::loweringErrorOf(s, 0, workers(8)).empty());
  merge->count -= 1;
  const std::string msg = mkt::loweringErrorOf(s, 0, workers(8));
  CAPTURE(msg);
  CHECK(msg.find("merges float32 lse rows of a fixed count only") != std::string::npos);
}

TEST_CASE("lowering attention: one worker CTA still runs every unit, alone in its lane") {
  const mk::Schedule s = mk::generateRingAttention(ringSpec(128, true), {0, 0});
  const LoweredProgram p = lowerRank(s, 1, workers(2));  // one CTA per lane
  for (uint32_t i = 0; i < p.header().nAttentions; ++i) CHECK(mk::runtime::loweredAttentions(p)[i].ctas == 1);
  for (uint32_t i = 0; i < p.header().nSteps; ++i) CHECK((p.steps()[i].bits & mk::device::kLsBarrierBefore) == 0);
}
