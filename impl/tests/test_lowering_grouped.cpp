// The lowering of GroupedGemm steps (impl/src/lowering/grouped_gemm_step.cpp) for the resident kernel's compute lane:
// the record the grouped GEMM engine's binder reads, the count array it points at, CTAs, and every refusal. No GPU.
#include <doctest/doctest.h>

#include <string>

#include "gemm/gemm_lane_params.hpp"
#include "lowering/lowering.hpp"
#include "lowering_test_util.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/schedule/step_kind.hpp"

namespace {

using mk::DType;
using mk::Schedule;
using mk::Step;
using mk::StepKind;
using mk::runtime::LoweredProgram;
using mk::runtime::LowerOptions;
using mk::runtime::lowerRank;

mk::BufferDecl decl(const char* name, DType dt, uint64_t count, mk::BufferKind kind = mk::BufferKind::Input) {
  mk::BufferDecl d;
  d.name = name;
  d.dtype = dt;
  d.kind = kind;
  d.count = {count};
  return d;
}

/// One rank, one compute lane: a GroupedGemm of `groups` groups of m x n x k, A and B in buffer 0, counts (int32) in
/// buffer 1 at element `countsAt` (the groups' sourced extents when `counted`), C in buffer 2.
Schedule grouped(uint32_t groups, uint32_t m, uint32_t n, uint32_t k, bool counted, uint64_t countsAt = 0) {
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  const uint64_t aBlock = uint64_t{m} * k, bBlock = uint64_t{k} * n;
  s.buffers = {decl("ab", DType::BFloat16, groups * (aBlock + bBlock)), decl("counts", DType::Int32, countsAt + groups),
               decl("c", DType::BFloat16, uint64_t{groups} * m * n, mk::BufferKind::Output)};
  for (uint32_t g = 0; g < groups; ++g) {
    mk::GemmShape sh;
    sh.m = m;
    sh.n = n;
    sh.k = k;
    sh.lda = k;
    sh.ldb = n;
    sh.ldc = n;
    if (counted) {
      mk::ExtentDecl e;
      e.name = "rows" + std::to_string(g);
      e.bound = m;
      e.expected = m;
      e.sourceBuffer = 1;
      e.sourceElement = countsAt + g;
      sh.extent = g;
      s.extents.push_back(e);
    }
    s.gemms.push_back(sh);
  }
  Step st;
  st.kind = StepKind::GroupedGemm;
  st.count = groups;
  st.a = mk::bufRef(0, 0, 0);
  st.b = mk::bufRef(0, 0, groups * aBlock);
  st.dst = mk::bufRef(0, 2, 0);
  mk::Lane lane;
  lane.role = mk::LaneRole::Compute;
  lane.steps.push_back(st);
  s.lanes = {{lane}};
  return s;
}

LowerOptions workers(uint32_t n) {
  LowerOptions o;
  o.nWorkers = n;
  return o;
}

std::string refusal(const Schedule& s) { return mkt::loweringErrorOf(s, 0, workers(16)); }

}  // namespace

TEST_CASE("lowering grouped: a GroupedGemm step gets its record, the count array and the lane's CTAs") {
  for (const bool counted : {true, false}) {
    CAPTURE(counted);
    const Schedule s = grouped(4, 200, 264, 72, counted, 8);
    const LoweredProgram p = lowerRank(s, 0, workers(16));
    REQUIRE(p.header().nGroupedGemms == 1);
    REQUIRE(mk::runtime::computeStepCount(p) == 1);
    const mk::device::LoweredStep& ls = p.steps()[0];
    CHECK(ls.kind == static_cast<uint8_t>(StepKind::GroupedGemm));
    CHECK(ls.count == 0);
    const mk::device::LoweredGroupedGemm& r = mk::runtime::loweredGroupedGemms(p)[0];
    CHECK(r.groups == 4);
    CHECK(r.rows == 200);
    CHECK(r.n == 264);
    CHECK(r.k == 72);
    CHECK(r.bStride == uint64_t{72} * 264);
    CHECK(r.ctas == ls.activeCtas);
    CHECK(r.ctas >= 1);
    CHECK(r.ctas <= 16);
    CHECK(r.a == ls.a);
    CHECK(r.dst == ls.dst);
    if (counted) {
      CHECK((r.counts >> mk::device::kOperandShift) == 1u);  // buffer 1 of rank 0
      CHECK((r.counts & mk::device::kOperandOffsetMask) == 32u);
    } else {
      CHECK(r.counts == mk::device::kStaticGroupCounts);
    }
  }
}

TEST_CASE("lowering grouped: what the grouped GEMM engine cannot run is refused, naming the step and the field") {
  auto expect = [](const Schedule& s, const std::string& code, const std::string& text) {
    const std::string msg = refusal(s);
    CAPTURE(msg);
    CHECK(msg.find(code) == 0);
    CHECK(msg.find("rank 0 lane 0 (compute) step 0 (grouped-gemm)") != std::string::npos);
    CHECK(msg.find(text) != std::string::npos);
  };
  Schedule s = grouped(3, 128, 256, 64, true);
  s.lanes[0][0].steps[0].flags = mk::kStepAccumulate;
  expect(s, "unsupported", "accumulation");
  s = grouped(3, 128, 256, 64, true);
  s.gemms[2].n = 128;
  expect(s, "unsupported", "groups of one shape");
  s = grouped(3, 128, 256, 64, true);
  s.gemms[1].extent = mk::kNoExtent;
  expect(s, "unsupported", "2 of the step's 3 groups have runtime rows");
  s = grouped(3, 128, 256, 64, true);
  s.extents[2].sourceElement = 5;
  expect(s, "unsupported", "is not element 2 of buffer 'counts'");
  s = grouped(3, 128, 256, 64, true);
  s.extents[1].sourceBuffer = mk::kNoSourceBuffer;
  expect(s, "unsupported", "is given by the caller");
  s = grouped(3, 128, 256, 64, true);
  s.extents[0].bound = 64;
  expect(s, "unsupported", "has bound 64, not the groups' m 128");
  s = grouped(3, 128, 255, 64, false);
  s.lanes[0][0].steps[0].flags = mk::kStepSwiGLU;
  expect(s, "unsupported", "SwiGLU needs an even n");
  s = grouped(3, 128, 256, 64, false);
  s.buffers[0].dtype = DType::Float32;
  expect(s, "unsupported", "A and B must be bfloat16");
  s = grouped(3, 128, 256, 60, false);
  expect(s, "unsupported", "lda 60 is not a multiple of 8");
  s = grouped(3, 128, 256, 64, false);
  s.lanes[0][0].steps[0].count = 4;
  expect(s, "invalid-schedule", "fall outside the schedule's 3 gemm shapes");
}

TEST_CASE("lowering grouped: moe-dispatch-gemm and moe-ffn on one node lower for the GPU engine, whole") {
  mk::MoeFfnSpec spec;
  spec.experts = 2;
  spec.topk = 2;
  spec.tokens = 64;
  spec.hidden = 64;
  spec.ffn = 32;
  const Schedule ffn = mk::generateMoeFfn(spec, {0, 0});
  mk::MoeDispatchGemmSpec d;
  d.experts = 2;
  d.topk = 2;
  d.tokens = 64;
  d.hidden = 64;
  d.outCols = 32;
  const Schedule dispatch = mk::generateMoeDispatchGemm(d, {0, 0, 0});
  for (const Schedule* s : {&ffn, &dispatch}) {
    for (uint32_t r = 0; r < s->nRanks; ++r) {
      const LoweredProgram p = lowerRank(*s, r, workers(16));
      uint32_t kinds[16] = {};
      for (uint32_t i = 0; i < p.header().nSteps; ++i) ++kinds[p.steps()[i].kind];
      CHECK(kinds[static_cast<int>(StepKind::Route)] == 1);
      CHECK(kinds[static_cast<int>(StepKind::Gather)] == s->nRanks * d.experts);
      CHECK(p.header().nGroupedGemms == kinds[static_cast<int>(StepKind::GroupedGemm)]);
      CHECK(p.header().extentSourcesOffset != 0);  // the counts the route and the notify write
      const bool combines = s == &ffn;
      CHECK(kinds[static_cast<int>(StepKind::Combine)] == (combines ? 1u : 0u));
    }
  }
  // Across nodes the route fills per-node lists: not on the GPU engine yet, said so.
  spec.combineReturn = mk::MoeCombineReturn::PerBlock;
  const std::string msg = mkt::loweringErrorOf(mk::generateMoeFfn(spec, {0, 1}), 0, workers(16));
  CAPTURE(msg);
  CHECK(msg.find("unsupported") == 0);
  CHECK(msg.find("run the schedule on the CPU executor") != std::string::npos);
}
