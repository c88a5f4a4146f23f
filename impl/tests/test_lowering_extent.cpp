// Runtime extents in the lowering (lowering/extents.hpp): the steps the GPU engine sizes at run time, and the ones
// it refuses.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "lowering/lowering.hpp"
#include "lowering_test_util.hpp"

namespace {

using mk::BufRef;
using mk::Schedule;
using mk::Step;
using mk::StepKind;
using mk::runtime::LoweredProgram;
using mk::runtime::LowerOptions;
using mk::runtime::lowerRank;

constexpr uint64_t kHidden = 64;  // elements per token
constexpr uint64_t kBound = 16;   // tokens at the bound

/// Two ranks of one node, buffers input(0) output(1) scratch(2) of kBound tokens, extents "tokens" and "rows".
Schedule extentRanks() {
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  s.nFlags = 4;
  const char* names[] = {"input", "output", "scratch"};
  const mk::BufferKind kinds[] = {mk::BufferKind::Input, mk::BufferKind::Output, mk::BufferKind::Scratch};
  for (int b = 0; b < 3; ++b) {
    mk::BufferDecl d;
    d.name = names[b];
    d.dtype = mk::DType::Float32;
    d.kind = kinds[b];
    d.count = {kBound * kHidden, kBound * kHidden};
    s.buffers.push_back(d);
  }
  s.extents = {mk::ExtentDecl{"tokens", kBound, 5.0}, mk::ExtentDecl{"rows", 4, 2.0}};
  s.lanes.resize(2);
  s.info.op = "custom";
  return s;
}

Step dataStep(StepKind kind, BufRef dst, BufRef src, uint64_t count, uint32_t extent) {
  Step st;
  st.kind = kind;
  st.dst = dst;
  st.a = src;
  st.b = src;
  st.count = count;
  st.extent = extent;
  return st;
}

std::string errorOf(const Schedule& s, uint32_t rank) { return mkt::loweringErrorOf(s, rank); }

}  // namespace

TEST_CASE("lowering extents: copy, put and reduce carry the extent's word, bound and elements per unit") {
  Schedule s = extentRanks();
  mk::Lane lane;
  lane.steps.push_back(dataStep(StepKind::Copy, mk::bufRef(0, 2, 0), mk::bufRef(0, 0, 0), kBound * kHidden, 0));
  Step put = dataStep(StepKind::Put, mk::bufRef(1, 2, 0), mk::bufRef(0, 0, 0), kBound * kHidden, 1);
  put.flags = mk::kStepSignal;
  put.flag = mk::FlagRef{1, 0};
  put.value = 1;
  lane.steps.push_back(put);
  lane.steps.push_back(dataStep(StepKind::Reduce, mk::bufRef(0, 1, 0), mk::bufRef(0, 2, 0), kBound * kHidden, 0));
  lane.steps.push_back(dataStep(StepKind::Copy, mk::bufRef(0, 1, 0), mk::bufRef(0, 0, 0), 8, mk::kNoExtent));
  s.lanes[0] = {lane};
  const LoweredProgram p = lowerRank(s, 0);
  const auto* st = p.steps();
  CHECK(st[0].extent == 0);
  CHECK(st[0].extentBound == kBound);
  CHECK(st[0].extentUnit == kHidden);
  CHECK(st[0].count == kBound * kHidden);  // the bound's count: operands and pieces are checked against it
  CHECK(st[1].extent == 1);
  CHECK(st[1].extentBound == 4);
  CHECK(st[1].extentUnit == kBound * kHidden / 4);
  CHECK((st[1].bits & mk::device::kLsSignal) != 0);  // a put of 0 elements still signals
  CHECK(st[2].extent == 0);
  CHECK(st[3].extent == mk::device::kNoExtentWord);
  // The words of each rank follow the schedule's 2 x 3 buffer bindings.
  CHECK(p.header().extentsBinding == mk::device::extentWordsBinding(2, 3, false, 0));
  CHECK(p.header().extentsBinding == 6);
  s.lanes[1] = s.lanes[0];
  for (Step& x : s.lanes[1][0].steps) {
    x.dst.rank = x.dst.rank == 0 ? 1 : 0;
    x.a.rank = 1;
    x.b.rank = 1;
  }
  s.lanes[1][0].steps[1].flag.rank = 0;
  CHECK(lowerRank(s, 1).header().extentsBinding == 7);
}

TEST_CASE("lowering extents: a program without an extent step binds no extent words") {
  Schedule s = extentRanks();
  mk::Lane lane;
  lane.steps.push_back(dataStep(StepKind::Copy, mk::bufRef(0, 1, 0), mk::bufRef(0, 0, 0), 64, mk::kNoExtent));
  s.lanes[0] = {lane};
  CHECK(lowerRank(s, 0).header().extentsBinding == mk::device::kNoExtentWord);
  CHECK(lowerRank(s, 0).steps()[0].extent == mk::device::kNoExtentWord);
}

TEST_CASE("lowering extents: steps sized by an extent share pieces only with steps of the same extent") {
  // In a lane of several CTAs, step 1 reads what step 0 wrote at the same static (count, offset): without an extent
  // every CTA reads its own piece, but the pieces of a runtime count differ from those of the bound.
  const uint64_t n = kBound * kHidden;
  for (const uint32_t readerExtent : {0u, mk::kNoExtent}) {
    Schedule s = extentRanks();
    s.buffers[0].count = s.buffers[1].count = s.buffers[2].count = {n * 64, n * 64};
    s.extents[0].bound = kBound;
    mk::Lane lane;
    lane.steps.push_back(dataStep(StepKind::Copy, mk::bufRef(0, 2, 0), mk::bufRef(0, 0, 0), n * 64, 0));
    lane.steps.push_back(dataStep(StepKind::Copy, mk::bufRef(0, 1, 0), mk::bufRef(0, 2, 0), n * 64, readerExtent));
    s.lanes[0] = {lane};
    LowerOptions opt;
    opt.nWorkers = 8;
    opt.minBytesPerCta = 1024;
    const LoweredProgram p = lowerRank(s, 0, opt);
    REQUIRE(p.lanes()[0].ctaCount == 8);
    CAPTURE(readerExtent);
    CHECK(((p.steps()[1].bits & mk::device::kLsBarrierBefore) != 0) == (readerExtent == mk::kNoExtent));
  }
}

TEST_CASE("lowering extents: a ProxyPut with an extent is refused naming the step and the CPU executor") {
  Schedule s = extentRanks();
  s.nodeOf = {0, 1};
  mk::Lane lane;
  lane.steps.push_back(dataStep(StepKind::ProxyPut, mk::bufRef(1, 2, 0), mk::bufRef(0, 0, 0), kBound * kHidden, 0));
  s.lanes[0] = {lane};
  const std::string msg = errorOf(s, 0);
  CAPTURE(msg);
  CHECK(msg.find("unsupported") == 0);
  CHECK(msg.find("rank 0 lane 0") != std::string::npos);
  CHECK(msg.find("(proxyput)") != std::string::npos);
  CHECK(msg.find("runtime extent 'tokens'") != std::string::npos);
  CHECK(msg.find("run the schedule on the CPU executor") != std::string::npos);
  s.lanes[0][0].steps[0].extent = mk::kNoExtent;
  CHECK(errorOf(s, 0).empty());
}

TEST_CASE("lowering extents: LL and LL128 puts with an extent are refused, packets being planned statically") {
  for (const uint8_t proto : {mk::kStepLL, mk::kStepLL128}) {
    Schedule s = extentRanks();
    mk::Lane lane;
    Step put = dataStep(StepKind::Put, mk::bufRef(1, 2, 0), mk::bufRef(0, 0, 0), kBound * kHidden, 0);
    put.flags = static_cast<uint8_t>(mk::kStepSignal | proto);
    put.flag = mk::FlagRef{1, 0};
    put.value = 1;
    lane.steps.push_back(put);
    s.lanes[0] = {lane};
    const std::string msg = errorOf(s, 0);
    CAPTURE(msg);
    CHECK(msg.find("unsupported") == 0);
    CHECK(msg.find("rank 0 lane 0") != std::string::npos);
    CHECK(msg.find(proto == mk::kStepLL ? "an LL put with runtime extent 'tokens'" : "an LL128 put") !=
          std::string::npos);
    CHECK(msg.find("packets are planned") != std::string::npos);
  }
}

TEST_CASE("lowering extents: a Gemm whose shape has an extent is refused naming the step") {
  Schedule s = extentRanks();
  for (auto& b : s.buffers) b.dtype = mk::DType::BFloat16;
  mk::GemmShape g;
  g.m = 16;
  g.n = 16;
  g.k = 16;
  g.lda = g.ldb = g.ldc = 16;
  g.extent = 0;
  s.gemms = {g};
  Step gemm;
  gemm.kind = StepKind::Gemm;
  gemm.dst = mk::bufRef(0, 1, 0);
  gemm.a = mk::bufRef(0, 0, 0);
  gemm.b = mk::bufRef(0, 0, 256);
  gemm.aux = 0;
  mk::Lane lane;
  lane.role = mk::LaneRole::Compute;
  lane.steps.push_back(gemm);
  s.lanes[0] = {lane};
  const std::string msg = errorOf(s, 0);
  CAPTURE(msg);
  CHECK(msg.find("unsupported") == 0);
  CHECK(msg.find("rank 0 lane 0 (compute) step 0 (gemm)") != std::string::npos);
  CHECK(msg.find("gemms[0] has rows set by runtime extent 'tokens'") != std::string::npos);
  s.gemms[0].extent = mk::kNoExtent;
  CHECK(errorOf(s, 0).empty());
}

TEST_CASE("lowering extents: a count that is not a multiple of the bound is refused") {
  Schedule s = extentRanks();
  mk::Lane lane;
  lane.steps.push_back(dataStep(StepKind::Copy, mk::bufRef(0, 2, 0), mk::bufRef(0, 0, 0), kBound * kHidden - 1, 0));
  s.lanes[0] = {lane};
  const std::string msg = errorOf(s, 0);
  CAPTURE(msg);
  CHECK(msg.find("not a multiple of the bound 16 of runtime extent 'tokens'") != std::string::npos);
}

TEST_CASE("lowering extents: an extent read from a buffer points the step at that int32 element") {
  Schedule s = extentRanks();
  mk::BufferDecl counts;
  counts.name = "counts";
  counts.dtype = mk::DType::Int32;
  counts.kind = mk::BufferKind::Scratch;
  counts.count = {2, 2};
  s.buffers.push_back(counts);
  s.extents[0].sourceBuffer = 3;
  s.extents[0].sourceElement = 1;
  mk::Lane lane;
  for (int i = 0; i < 2; ++i)
    lane.steps.push_back(dataStep(StepKind::Copy, mk::bufRef(0, 2, 0), mk::bufRef(0, 0, 0), kBound * kHidden, 0));
  s.lanes[0] = {lane};
  const LoweredProgram p = mk::runtime::lowerRank(s, 0, {});
  const auto& h = p.header();
  CHECK(h.extentsBinding == mk::device::kNoExtentWord);  // no caller words: the value is the schedule's
  REQUIRE(h.extentSourcesOffset != 0);
  for (uint32_t i = 0; i < 2; ++i) {
    CHECK(p.steps()[i].extent == mk::device::kSourcedExtent);  // one source, shared by both steps
    CHECK(p.steps()[i].extentBound == kBound);
  }
  uint64_t source = 0;
  std::memcpy(&source, p.image.data() + h.extentSourcesOffset, sizeof source);
  CHECK((source >> mk::device::kOperandShift) == 3u);  // rank 0, buffer 3
  CHECK((source & mk::device::kOperandOffsetMask) == 4u);

  s.buffers[3].dtype = mk::DType::Float32;
  const std::string msg = errorOf(s, 0);
  CAPTURE(msg);
  CHECK(msg.find("invalid-schedule") == 0);
  CHECK(msg.find("runtime extent 'tokens' is read from element 1 of buffer 3, which is not an int32 element") !=
        std::string::npos);
}
