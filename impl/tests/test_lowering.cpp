// CPU tests of the lowering (packed schedule -> resident-kernel program). No GPU needed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "gemm/gemm_lane_params.hpp"
#include "lowering/lowering.hpp"
#include "lowering/packets.hpp"
#include "lowering_test_util.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/device/compute_lane_device.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"

namespace {

using mk::BufRef;
using mk::Schedule;
using mk::Step;
using mk::StepKind;
using mk::runtime::LoweredProgram;
using mk::runtime::LowerOptions;
using mk::runtime::lowerRank;

BufRef ref(uint32_t rank, uint16_t buffer, uint64_t offset) { return mk::bufRef(rank, buffer, offset); }

/// Two ranks, buffers input(0) output(1) scratch(2) of `count` elements each; no lanes yet.
Schedule twoRanks(uint64_t count, mk::DType dt = mk::DType::Float32) {
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  s.nFlags = 4;
  s.nBarriers = 1;
  const char* names[] = {"input", "output", "scratch"};
  const mk::BufferKind kinds[] = {mk::BufferKind::Input, mk::BufferKind::Output, mk::BufferKind::Scratch};
  for (int b = 0; b < 3; ++b) {
    mk::BufferDecl d;
    d.name = names[b];
    d.dtype = dt;
    d.kind = kinds[b];
    d.count = {count, count};
    s.buffers.push_back(d);
  }
  s.lanes.resize(2);
  s.info.op = "custom";
  return s;
}

Step copy(BufRef dst, BufRef src, uint64_t count, StepKind kind = StepKind::Copy) {
  Step st;
  st.kind = kind;
  st.dst = dst;
  st.a = src;
  st.count = count;
  return st;
}
Step wait(uint32_t rank, uint32_t id, uint64_t value) {
  Step st;
  st.kind = StepKind::Wait;
  st.flag = mk::FlagRef{rank, id};
  st.value = value;
  return st;
}

/// A one-shot all-reduce by hand: put input into the peer's scratch with a signal, wait, reduce.
Schedule oneShot(uint64_t count) {
  Schedule s = twoRanks(count);
  for (uint32_t r = 0; r < 2; ++r) {
    const uint32_t peer = 1 - r;
    mk::Lane mover, reducer;
    Step put = copy(ref(peer, 2, 0), ref(r, 0, 0), count, StepKind::Put);
    put.flags = mk::kStepSignal;
    put.flag = mk::FlagRef{peer, 0};
    put.value = 1;
    mover.steps.push_back(put);
    reducer.steps.push_back(wait(r, 0, 1));
    Step red;
    red.kind = StepKind::Reduce;
    red.dst = ref(r, 1, 0);
    red.a = ref(r, 0, 0);
    red.b = ref(r, 2, 0);
    red.count = count;
    reducer.steps.push_back(red);
    s.lanes[r] = {mover, reducer};
  }
  return s;
}

std::string errorOf(const Schedule& s, uint32_t rank, const LowerOptions& opt = {}) {
  return mkt::loweringErrorOf(s, rank, opt);
}

}  // namespace

TEST_CASE("lowering: a one-shot schedule becomes lanes with encoded operands and a signal") {
  const uint64_t count = 1021;
  const LoweredProgram p = lowerRank(oneShot(count), 1);
  REQUIRE(p.nLanes == 2);
  const auto& h = p.header();
  CHECK(h.magic == mk::device::kProgramMagic);
  CHECK(h.rank == 1);
  CHECK(h.nSteps == 3);
  CHECK(h.nFlags == 4);
  const auto* steps = p.steps();
  // Put: dst = (rank 0, scratch) binding 0 * 3 + 2, src = (rank 1, input) binding 1 * 3 + 0.
  CHECK(steps[0].kind == static_cast<uint8_t>(StepKind::Put));
  CHECK((steps[0].dst >> mk::device::kOperandShift) == 2);
  CHECK((steps[0].a >> mk::device::kOperandShift) == 3);
  CHECK((steps[0].bits & mk::device::kLsSignal) != 0);
  CHECK(steps[0].flagRank == 0);
  CHECK(steps[0].entryMask == 0);  // scratch is engine memory: no entry check
  CHECK(steps[1].kind == static_cast<uint8_t>(StepKind::Wait));
  CHECK(steps[1].flagRank == 1);
  CHECK(steps[1].value == 1);
  CHECK(steps[2].kind == static_cast<uint8_t>(StepKind::Reduce));
  CHECK((steps[2].b >> mk::device::kOperandShift) == 5);
}

TEST_CASE("lowering: a small schedule gives each lane one CTA and leaves the rest idle") {
  LowerOptions opt;
  opt.nWorkers = 16;
  const LoweredProgram p = lowerRank(oneShot(64), 0, opt);
  CHECK(p.activeWorkers == 2);
  CHECK(p.lanes()[0].ctaCount == 1);
  CHECK(p.lanes()[1].ctaBegin == 1);
  CHECK(p.ctas()[0].lane == 0);
  CHECK(p.ctas()[1].lane == 1);
  for (uint32_t w = 2; w < 16; ++w) CHECK(p.ctas()[w].lane == 0xFFFF);
  CHECK(p.header().nSyncPoints == 0);
}

TEST_CASE("lowering: large data steps get many CTAs and a signal gets its own sync point") {
  LowerOptions opt;
  opt.nWorkers = 64;
  opt.minBytesPerCta = 4096;
  const LoweredProgram p = lowerRank(oneShot(1u << 20), 0, opt);
  const auto* lanes = p.lanes();
  CHECK(lanes[0].ctaCount + lanes[1].ctaCount == 64);
  CHECK(lanes[0].ctaCount > 1);
  const auto* steps = p.steps();
  CHECK(steps[0].activeCtas == lanes[0].ctaCount);
  CHECK(p.header().nSyncPoints == 1);
  CHECK(steps[0].arriveSync == 0);
  // Every worker belongs to exactly one lane, in lane order.
  std::vector<uint32_t> perLane(2, 0);
  for (uint32_t w = 0; w < 64; ++w) {
    REQUIRE(p.ctas()[w].lane < 2);
    CHECK(p.ctas()[w].indexInLane == perLane[p.ctas()[w].lane]);
    ++perLane[p.ctas()[w].lane];
  }
  CHECK(perLane[0] == lanes[0].ctaCount);
}

TEST_CASE("lowering: a step reading what another CTA of its lane wrote gets a lane barrier") {
  Schedule s = twoRanks(1u << 16);
  mk::Lane lane;
  lane.steps.push_back(copy(ref(0, 2, 0), ref(0, 0, 0), 1u << 16));            // scratch <- input
  lane.steps.push_back(copy(ref(0, 1, 0), ref(0, 2, 0), 1u << 16));            // same pieces: no barrier
  lane.steps.push_back(copy(ref(0, 1, 0), ref(0, 2, 100), (1u << 16) - 100));  // shifted: barrier
  lane.steps.push_back(copy(ref(0, 0, 0), ref(0, 1, 5), 1000));                // reads output: barrier
  s.lanes[0] = {lane};
  s.lanes[1] = {};
  LowerOptions opt;
  opt.nWorkers = 8;
  opt.minBytesPerCta = 1024;
  const LoweredProgram p = lowerRank(s, 0, opt);
  const auto* steps = p.steps();
  REQUIRE(p.lanes()[0].ctaCount == 8);
  CHECK((steps[0].bits & mk::device::kLsBarrierBefore) == 0);
  CHECK((steps[1].bits & mk::device::kLsBarrierBefore) == 0);
  CHECK((steps[2].bits & mk::device::kLsBarrierBefore) != 0);
  CHECK((steps[3].bits & mk::device::kLsBarrierBefore) != 0);
  CHECK(steps[2].barrierSync != steps[3].barrierSync);
  CHECK(p.header().nSyncPoints == 2);
}

TEST_CASE("lowering: a write into a peer's user buffer waits for that peer to enter the op") {
  Schedule s = twoRanks(100);
  mk::Lane lane;
  lane.steps.push_back(copy(ref(1, 1, 0), ref(0, 0, 0), 100, StepKind::Put));  // into rank 1's output
  lane.steps.push_back(copy(ref(0, 1, 0), ref(1, 0, 0), 100));                 // read rank 1's input
  lane.steps.push_back(copy(ref(1, 2, 0), ref(0, 0, 0), 100, StepKind::Put));  // scratch: no entry check
  s.lanes[0] = {lane};
  const LoweredProgram p = lowerRank(s, 0);
  CHECK(p.steps()[0].entryMask == 2);
  CHECK(p.steps()[1].entryMask == 2);
  CHECK(p.steps()[2].entryMask == 0);
}

TEST_CASE("lowering: a ProxyPut is one CTA's command with its remote signal and entry check") {
  Schedule s = twoRanks(4096);
  s.nodeOf = {0, 1};
  s.nBarriers = 0;
  mk::Lane lane;
  lane.ctas = 1;
  Step pp = copy(ref(1, 1, 0), ref(0, 0, 0), 4096, StepKind::ProxyPut);  // into rank 1's output, with a signal
  pp.flags = mk::kStepSignal;
  pp.flag = mk::FlagRef{1, 3};
  pp.value = 1;
  lane.steps.push_back(copy(ref(0, 0, 0), ref(0, 2, 0), 4096));  // many CTAs write the source first
  lane.steps.push_back(pp);
  lane.steps.push_back(copy(ref(0, 0, 0), ref(0, 2, 0), 4096));                   // and overwrite it afterwards
  lane.steps.push_back(copy(ref(1, 2, 0), ref(0, 2, 0), 0, StepKind::ProxyPut));  // a pure signal into scratch
  s.lanes[0] = {lane};
  LowerOptions opt;
  opt.minBytesPerCta = 1024;  // the copies want several CTAs
  const LoweredProgram p = lowerRank(s, 0, opt);
  REQUIRE(p.lanes()[0].ctaCount > 1);
  const auto* st = p.steps();
  CHECK(st[1].kind == static_cast<uint8_t>(StepKind::ProxyPut));
  CHECK(st[1].activeCtas == 1);
  CHECK((st[1].bits & mk::device::kLsRemoteSignal) != 0);
  CHECK((st[1].bits & mk::device::kLsSignal) == 0);  // raised by the receiving side, not by this GPU
  CHECK(st[1].flagRank == 1);
  CHECK(st[1].flagId == 3);
  CHECK(st[1].entryMask == 2);
  CHECK((st[1].bits & mk::device::kLsBarrierBefore) != 0);  // the source was written by other CTAs
  CHECK((st[2].bits & mk::device::kLsBarrierBefore) != 0);  // the source is overwritten after the proxy read it
  CHECK(st[3].entryMask == 0);
  CHECK((st[3].bits & mk::device::kLsRemoteSignal) == 0);
}

TEST_CASE("lowering: a ProxyPut inside a node or from another rank's memory is refused") {
  Schedule s = twoRanks(16);
  s.nBarriers = 0;
  mk::Lane lane;
  lane.steps.push_back(copy(ref(1, 2, 0), ref(0, 0, 0), 16, StepKind::ProxyPut));
  s.lanes[0] = {lane};
  std::string msg = errorOf(s, 0);
  CHECK(msg.find("own node") != std::string::npos);
  CHECK(msg.find("rank 0 lane 0") != std::string::npos);
  s.nodeOf = {0, 1};
  s.lanes[0][0].steps[0].a = ref(1, 0, 0);
  msg = errorOf(s, 0);
  CHECK(msg.find("source must be this rank's") != std::string::npos);
}

// ---- compute lanes: Gemm steps -------------------------------------------------------------------------

namespace {

/// Two ranks: ab (Input, bf16: A then B), c (Output, `out`), scratch (Scratch, bf16), one Gemm shape
/// m x n x k (A at 0, B right after A, both dense), rank 0's lane 0 runs C = A * B.
Schedule gemmSchedule(uint32_t m, uint32_t n, uint32_t k, mk::DType out = mk::DType::BFloat16, bool colB = false) {
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  s.nFlags = 2;
  const uint64_t ldb = colB ? k : n;
  const uint64_t aCount = uint64_t{m} * k, bCount = colB ? uint64_t{n} * ldb : uint64_t{k} * ldb;
  const uint64_t abCount = (aCount + 7) / 8 * 8 + bCount;
  auto decl = [](const char* name, mk::DType dt, mk::BufferKind kind, uint64_t count) {
    mk::BufferDecl d;
    d.name = name;
    d.dtype = dt;
    d.kind = kind;
    d.count = {count, count};
    return d;
  };
  s.buffers = {decl("ab", mk::DType::BFloat16, mk::BufferKind::Input, abCount),
               decl("c", out, mk::BufferKind::Output, uint64_t{m} * n),
               decl("scratch", mk::DType::BFloat16, mk::BufferKind::Scratch, uint64_t{m} * n)};
  mk::GemmShape g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = static_cast<uint32_t>(ldb);
  g.ldc = n;
  s.gemms = {g};
  s.lanes.resize(2);
  mk::Lane lane;
  lane.role = mk::LaneRole::Compute;
  Step st;
  st.kind = StepKind::Gemm;
  st.aux = 0;
  st.flags = colB ? mk::kStepBColMajor : 0;
  st.dst = ref(0, 1, 0);
  st.a = ref(0, 0, 0);
  st.b = ref(0, 0, (aCount + 7) / 8 * 8);
  lane.steps.push_back(st);
  s.lanes[0] = {lane};
  s.info.op = "custom";
  return s;
}

const mk::device::LoweredGemm& loweredGemm(const LoweredProgram& p, uint32_t i) {
  return reinterpret_cast<const mk::device::LoweredGemm*>(p.image.data() + p.header().gemmsOffset)[i];
}

}  // namespace

TEST_CASE("lowering: a Gemm step becomes a tiled step with its aux record") {
  LowerOptions opt;
  opt.nWorkers = 100;
  const Schedule s = gemmSchedule(1000, 520, 72, mk::DType::BFloat16, true);
  const LoweredProgram p = lowerRank(s, 0, opt);
  const auto& h = p.header();
  REQUIRE(h.nGemms == 1);
  CHECK(h.gemmsOffset % 16 == 0);
  CHECK(h.gemmsOffset >= h.ctasOffset + opt.nWorkers * sizeof(mk::device::CtaAssignment));
  CHECK(h.totalBytes == p.image.size());
  const mk::device::LoweredStep& st = p.steps()[0];
  CHECK(st.kind == static_cast<uint8_t>(StepKind::Gemm));
  CHECK(st.count == 0);  // index into the aux table
  CHECK(st.dtype == static_cast<uint8_t>(mk::DType::BFloat16));
  const auto& g = loweredGemm(p, 0);
  CHECK(g.m == 1000);
  CHECK(g.n == 520);
  CHECK(g.k == 72);
  CHECK(g.lda == 72);
  CHECK(g.ldb == 72);
  CHECK(g.ldc == 520);
  CHECK((g.flags & mk::device::kLgBColMajor) != 0);
  CHECK((g.flags & mk::device::kLgTmaStore) != 0);  // bf16 output, n % 8 == 0, no accumulation
  CHECK((g.blockN == 128 || g.blockN == 256));
  // The lane asked for one CTA per 128 x 128 tile (8 x 5 = 40) and got them; every one runs tiles
  // unless the wide tile left fewer tiles than CTAs.
  CHECK(p.lanes()[0].ctaCount == 40);
  CHECK(g.tiles == 8 * ((520 + g.blockN - 1) / g.blockN));
  CHECK(g.ctas == std::min<uint32_t>(40, g.tiles));
  CHECK(st.activeCtas == g.ctas);
  // Operands: A and B in binding 0 (rank 0 ab), C in binding 1 (rank 0 c); B 16-byte aligned after A.
  CHECK((g.a >> mk::device::kOperandShift) == 0);
  CHECK((g.b >> mk::device::kOperandShift) == 0);
  CHECK((g.b & mk::device::kOperandOffsetMask) == 1000ull * 72 * 2);
  CHECK((g.dst >> mk::device::kOperandShift) == 1);
  CHECK(g.lane == 0);
  CHECK(g.step == 0);
  // Rank 1 has no Gemm step: no aux table.
  CHECK(lowerRank(s, 1, opt).header().nGemms == 0);
}

TEST_CASE("lowering: fp32 output and accumulation take the direct epilogue") {
  Schedule s = gemmSchedule(128, 256, 64, mk::DType::Float32);
  CHECK((loweredGemm(lowerRank(s, 0), 0).flags & mk::device::kLgTmaStore) == 0);
  s = gemmSchedule(128, 256, 64);
  s.lanes[0][0].steps[0].flags |= mk::kStepAccumulate;
  const LoweredProgram acc = lowerRank(s, 0);
  CHECK((loweredGemm(acc, 0).flags & mk::device::kLgTmaStore) == 0);
  CHECK((loweredGemm(acc, 0).flags & mk::device::kLgAccumulate) != 0);
  s = gemmSchedule(128, 100, 64);  // n % 8 != 0: the TMA store would write past n (docs/gemm.md)
  s.gemms[0].ldb = 104;
  s.gemms[0].ldc = 104;
  s.buffers[0].count = {100000, 100000};
  s.buffers[1].count = {128 * 104, 128 * 104};
  CHECK((loweredGemm(lowerRank(s, 0), 0).flags & mk::device::kLgTmaStore) == 0);
}

TEST_CASE("lowering: a Gemm step and a Put of its tile in a multi-CTA lane are separated by a lane barrier") {
  Schedule s = gemmSchedule(512, 512, 64);
  Step put = copy(ref(1, 2, 0), ref(0, 1, 0), 512 * 512, StepKind::Put);
  s.buffers[2].dtype = mk::DType::BFloat16;
  put.flags = mk::kStepSignal;
  put.flag = mk::FlagRef{1, 0};
  put.value = 1;
  s.lanes[0][0].steps.push_back(put);
  LowerOptions opt;
  opt.nWorkers = 32;
  const LoweredProgram p = lowerRank(s, 0, opt);
  REQUIRE(p.lanes()[0].ctaCount > 1);
  CHECK((p.steps()[0].bits & mk::device::kLsBarrierBefore) == 0);
  CHECK((p.steps()[1].bits & mk::device::kLsBarrierBefore) != 0);  // the Put reads tiles other CTAs wrote
  CHECK((p.steps()[1].bits & mk::device::kLsSignal) != 0);
}

TEST_CASE("lowering: bad Gemm shapes and dtypes are refused with named errors") {
  auto expect = [](const Schedule& s, const char* code, std::initializer_list<const char*> parts) {
    const std::string msg = errorOf(s, 0);
    CAPTURE(msg);
    CHECK(msg.find(code) == 0);
    CHECK(msg.find("rank 0 lane 0") != std::string::npos);
    for (const char* part : parts) CHECK(msg.find(part) != std::string::npos);
  };
  Schedule s = gemmSchedule(64, 64, 64);
  s.gemms[0].k = 0;
  expect(s, "unsupported", {"gemms[0]", "m, n and k >= 1"});
  s = gemmSchedule(64, 64, 64);
  s.gemms[0].lda = 32;
  expect(s, "invalid-schedule", {"lda 32 < k 64"});
  s = gemmSchedule(64, 64, 64);
  s.gemms[0].ldb = 60;
  expect(s, "invalid-schedule", {"ldb 60 < n 64"});
  s = gemmSchedule(64, 64, 64);
  s.gemms[0].lda = 68;
  s.buffers[0].count = {100000, 100000};
  expect(s, "unsupported", {"lda 68", "multiple of 8"});
  s = gemmSchedule(64, 64, 64);
  s.buffers[1].dtype = mk::DType::Float16;
  expect(s, "unsupported", {"C must be a bfloat16 or float32 buffer", "float16"});
  s = gemmSchedule(64, 64, 64);
  s.buffers[0].dtype = mk::DType::Float32;
  expect(s, "unsupported", {"A and B must be bfloat16", "float32"});
  s = gemmSchedule(64, 64, 64);
  s.lanes[0][0].steps[0].b.offset += 4;  // 8 bytes past a 16-byte boundary
  s.buffers[0].count = {100000, 100000};
  expect(s, "unsupported", {"B (b)", "multiple of 16"});
  s = gemmSchedule(64, 64, 64);
  s.lanes[0][0].steps[0].dst.rank = 1;
  expect(s, "unsupported", {"C (dst) lives on rank 1"});
  s = gemmSchedule(64, 64, 64);
  s.lanes[0][0].steps[0].aux = 3;
  expect(s, "invalid-schedule", {"gemm index 3"});
  s = gemmSchedule(64, 64, 64);
  s.buffers[1].count = {64 * 63, 64 * 63};
  expect(s, "invalid-schedule", {"C (dst)", "fall outside buffer 'c'"});
  s = gemmSchedule(64, 64, 64);
  s.lanes[0][0].steps[0].dst = ref(0, 0, 0);  // C over A
  s.buffers[0].count = {100000, 100000};
  expect(s, "invalid-schedule", {"overlaps"});
}

TEST_CASE("lowering: an operand past the end of its buffer names rank lane and step") {
  Schedule s = twoRanks(100);
  mk::Lane lane;
  lane.steps.push_back(wait(0, 0, 0));
  lane.steps.push_back(copy(ref(0, 1, 90), ref(0, 0, 0), 11));
  s.lanes[0] = {lane};
  const std::string msg = errorOf(s, 0);
  CHECK(msg.find("invalid-schedule") != std::string::npos);
  CHECK(msg.find("rank 0 lane 0") != std::string::npos);
  CHECK(msg.find("step 1") != std::string::npos);
  CHECK(msg.find("[90, 101)") != std::string::npos);
}

TEST_CASE("lowering: a wait on another rank's flag is refused") {
  Schedule s = twoRanks(8);
  mk::Lane lane;
  lane.steps.push_back(wait(1, 0, 1));
  s.lanes[0] = {lane};
  const std::string msg = errorOf(s, 0);
  CHECK(msg.find("own rank") != std::string::npos);
}

TEST_CASE("lowering: operands of different dtypes are refused") {
  Schedule s = twoRanks(8);
  s.buffers[2].dtype = mk::DType::BFloat16;
  mk::Lane lane;
  lane.steps.push_back(copy(ref(0, 1, 0), ref(0, 2, 0), 8));
  s.lanes[0] = {lane};
  CHECK(errorOf(s, 0).find("different dtypes") != std::string::npos);
}

TEST_CASE("lowering: FP8 buffers are refused and lse-merge lowers with its row width in extentUnit") {
  Schedule fp8 = twoRanks(8, mk::DType::Float8E4M3);
  mk::Lane lane;
  lane.steps.push_back(copy(ref(0, 1, 0), ref(0, 2, 0), 8));
  fp8.lanes[0] = {lane};
  CHECK(errorOf(fp8, 0).find("does not move float8_e4m3 elements yet") != std::string::npos);
  Schedule lse = twoRanks(8);
  Step merge = copy(ref(0, 1, 0), ref(0, 0, 0), 8, StepKind::Reduce);
  merge.b = ref(0, 2, 0);
  merge.op = mk::RedOp::LseMerge;
  merge.aux = 3;  // two rows of 3 values and their lse
  lane.steps = {merge};
  lse.lanes[0] = {lane};
  const LoweredProgram p = lowerRank(lse, 0);  // twoRanks: float32 buffers
  CHECK(p.steps()[0].extentUnit == 3);
  CHECK(p.steps()[0].activeCtas == 1);
  lse.buffers[0].dtype = lse.buffers[1].dtype = lse.buffers[2].dtype = mk::DType::BFloat16;
  CHECK(errorOf(lse, 0).find("merges float32 lse rows of a fixed count only") != std::string::npos);
}

TEST_CASE("lowering: more lanes than worker CTAs is refused naming the knob") {
  Schedule s = twoRanks(8);
  s.lanes[0].assign(5, mk::Lane{});
  LowerOptions opt;
  opt.nWorkers = 4;
  const std::string msg = errorOf(s, 0, opt);
  CHECK(msg.find("5 lanes") != std::string::npos);
  CHECK(msg.find("workerCtas") != std::string::npos);
}

TEST_CASE("lowering: barriers in a schedule spanning nodes are refused naming the way out") {
  Schedule s = twoRanks(8);
  s.nodeOf = {0, 1};
  const std::string msg = errorOf(s, 0);
  CHECK(msg.find("node-local") != std::string::npos);
  CHECK(msg.find("flags") != std::string::npos);
}

TEST_CASE("lowering: flags beyond the engine's limit are refused") {
  Schedule s = twoRanks(8);
  s.nFlags = mk::device::kMaxFlags + 1;
  CHECK(errorOf(s, 0).find("flags per rank") != std::string::npos);
}

TEST_CASE("lowering: scratch buffers are laid out 256-byte aligned in one arena") {
  Schedule s = twoRanks(10);
  mk::BufferDecl extra;
  extra.name = "scratch2";
  extra.dtype = mk::DType::Float16;
  extra.kind = mk::BufferKind::Scratch;
  extra.count = {3, 7};
  s.buffers.push_back(extra);
  const LoweredProgram p = lowerRank(s, 0);
  CHECK(p.buffers[2].scratchOffset == 0);
  CHECK(p.buffers[3].scratchOffset == 256);
  CHECK(p.scratchBytes == 512);
}

TEST_CASE("lowering: ctaPiece splits any count into disjoint covering pieces") {
  for (uint64_t count : {1ull, 7ull, 255ull, 256ull, 1021ull, 65536ull, 1000003ull})
    for (uint32_t active : {1u, 2u, 3u, 8u, 64u}) {
      uint64_t next = 0;
      for (uint32_t i = 0; i < active; ++i) {
        uint64_t b = 0, e = 0;
        mk::device::ctaPiece(count, active, i, &b, &e);
        CAPTURE(count);
        CAPTURE(active);
        CHECK(b == next);
        CHECK(e >= b);
        if (e > b) CHECK(b % 256 == 0);
        next = e;
      }
      CHECK(next == count);
    }
}

TEST_CASE("lowering: the packed form lowers to the same program as the schedule") {
  const Schedule s = oneShot(777);
  for (uint32_t r = 0; r < 2; ++r) {
    const LoweredProgram a = lowerRank(s, r);
    const LoweredProgram b = mk::runtime::lowerPacked(mk::packRank(s, r), r);
    CHECK(a.image == b.image);
  }
}

TEST_CASE("lowering: every generated collective lowers on 2 and 4 ranks") {
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll}) {
    const auto algos = mk::algorithmsFor(op);
    CAPTURE(mk::toString(op));
    REQUIRE(!algos.empty());
    for (const auto& algo : algos)
      for (uint32_t ranks : {2u, 4u})
        for (uint64_t count : {1ull, 1021ull, (1ull << 20) + 3})
          for (uint32_t chunks : {1u, 4u}) {
            mk::CollectiveSpec spec;
            spec.op = op;
            spec.algo = algo;
            spec.count = count;
            mk::GenOptions g;
            g.chunks = chunks;
            const Schedule s = mk::generate(spec, std::vector<uint32_t>(ranks, 0), g);
            CAPTURE(algo);
            CAPTURE(ranks);
            CAPTURE(count);
            uint64_t steps = 0;
            for (uint32_t r = 0; r < ranks; ++r) {
              const LoweredProgram p = lowerRank(s, r);
              steps += p.header().nSteps;
              CHECK(p.activeWorkers <= p.header().nWorkers);
              for (uint32_t l = 0; l < p.nLanes; ++l) CHECK(p.lanes()[l].ctaCount >= 1);
            }
            CHECK(steps == s.stepCount());
          }
  }
}

// Every generator's schedule must lower on an 8-GPU NVSwitch node too, with the largest pipelining and channel
// counts the engine picks (flags, sync points and lanes stay within limits).
TEST_CASE("lowering: every generated collective lowers across 2 and 4 nodes") {
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll})
    for (const auto& algo : mk::algorithmsFor(op))
      for (const std::vector<uint32_t>& nodeOf :
           {std::vector<uint32_t>{0, 1}, std::vector<uint32_t>{0, 0, 1, 1}, std::vector<uint32_t>{0, 1, 2, 3},
            std::vector<uint32_t>{0, 0, 1, 1, 2, 2, 3, 3}}) {
        mk::CollectiveSpec spec;
        spec.op = op;
        spec.algo = algo;
        spec.count = 1021;
        mk::GenOptions g;
        g.chunks = 2;
        const Schedule s = mk::generate(spec, nodeOf, g);
        CAPTURE(mk::toString(op));
        CAPTURE(mk::toString(algo));
        CAPTURE(nodeOf.size());
        uint64_t steps = 0, proxyPuts = 0;
        for (uint32_t r = 0; r < s.nRanks; ++r) {
          const LoweredProgram p = lowerRank(s, r);
          steps += p.header().nSteps;
          for (uint32_t i = 0; i < p.header().nSteps; ++i)
            if (p.steps()[i].kind == static_cast<uint8_t>(StepKind::ProxyPut)) {
              ++proxyPuts;
              CHECK(p.steps()[i].activeCtas == 1);
            }
        }
        CHECK(steps == s.stepCount());
        CHECK(proxyPuts > 0);
      }
}

TEST_CASE("lowering: every generated collective lowers on 8 ranks of one node with deep pipelines") {
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll}) {
    for (const auto& algo : mk::algorithmsFor(op))
      for (uint64_t count : {1ull, 1021ull * 8, (1ull << 24) + 5})
        for (uint32_t chunks : {1u, 8u})
          for (uint32_t channels : {1u, 2u}) {
            mk::CollectiveSpec spec;
            spec.op = op;
            spec.algo = algo;
            spec.count = count;
            mk::GenOptions g;
            g.chunks = chunks;
            g.channels = channels;
            const Schedule s = mk::generate(spec, std::vector<uint32_t>(8, 0), g);
            CAPTURE(mk::toString(op));
            CAPTURE(algo);
            CAPTURE(count);
            CAPTURE(chunks);
            CAPTURE(channels);
            uint64_t steps = 0;
            for (uint32_t r = 0; r < 8; ++r) {
              const LoweredProgram p = lowerRank(s, r);
              steps += p.header().nSteps;
              CHECK(p.activeWorkers <= p.header().nWorkers);
            }
            CHECK(steps == s.stepCount());
          }
  }
}

TEST_CASE("lowering: an op completes on local completion only when no peer step touches this rank's user buffers") {
  // One-shot: peers write only into scratch, so each rank's stream may move on once its own steps are done.
  // Two-shot and ring: peers read the input or write the output, so every rank must be done first.
  for (const char* algo : {"one-shot", "two-shot", "ring"}) {
    CAPTURE(algo);
    mk::CollectiveSpec spec;
    spec.op = mk::CollOp::AllReduce;
    spec.count = 4099;
    spec.algo = mk::requireAlgorithm(spec.op, algo);
    const Schedule s = mk::generate(spec, {0, 0});
    const bool local = std::string(algo) == "one-shot";
    for (uint32_t r = 0; r < 2; ++r)
      CHECK(((lowerRank(s, r).header().flags & mk::device::kProgLocalCompletion) != 0) == local);
  }
  // The flag looks at operands a step really uses: a Copy's unused `b` (rank 0, buffer 0 by default) on
  // rank 1 does not make rank 0's input "touched".
  Schedule s = twoRanks(64);
  s.lanes.assign(2, {});
  s.lanes[1].push_back(mk::Lane{});
  Step c;
  c.kind = StepKind::Copy;
  c.count = 64;
  c.dst = ref(1, 1, 0);
  c.a = ref(1, 0, 0);
  s.lanes[1][0].steps.push_back(c);
  CHECK((lowerRank(s, 0).header().flags & mk::device::kProgLocalCompletion) != 0);
  s.lanes[1][0].steps[0].a = ref(0, 0, 0);  // now rank 1 reads rank 0's input
  CHECK((lowerRank(s, 0).header().flags & mk::device::kProgLocalCompletion) == 0);
}

TEST_CASE("lowering: Gemm operands bound to misaligned user pointers are refused before an op is enqueued") {
  const Schedule s = gemmSchedule(128, 256, 64);
  const LoweredProgram p = lowerRank(s, 0);
  alignas(16) static char base[64];
  CHECK_NOTHROW(mk::runtime::checkComputeOperands(p, 0, base, base + 16));
  try {
    mk::runtime::checkComputeOperands(p, 0, base + 8, base + 16);
    FAIL("a misaligned A / B was accepted");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    const std::string msg = e.what();
    CHECK(msg.find("rank 0 lane 0 step 0 (gemm): A at input") != std::string::npos);
    CHECK(msg.find("16-byte aligned") != std::string::npos);
  }
  try {
    mk::runtime::checkComputeOperands(p, 0, base, base + 4);
    FAIL("a misaligned C was accepted");
  } catch (const mk::Error& e) {
    CHECK(std::string(e.what()).find("C at output") != std::string::npos);
  }
  CHECK_THROWS_AS(mk::runtime::checkComputeOperands(p, 0, nullptr, base), mk::Error);
  // Rank 1 has no Gemm step: nothing to check.
  CHECK_NOTHROW(mk::runtime::checkComputeOperands(lowerRank(s, 1), 1, base + 2, base + 2));
}

// ---- compute lanes: tile split, lane barriers and the per-op GemmParams ------------------------------------

namespace {

/// Run the tile engine's persistent loop on the CPU for every CTA of the step, as the kernel does (CTA i of
/// activeCtas runs units i, i + activeCtas, ... < tilesM x tilesN, tile coordinates by gemmTileCoord), and
/// check that every output tile runs exactly once and every active CTA gets at least one tile.
void checkTileSplit(const mk::device::LoweredGemm& g, const mk::device::LoweredStep& st, uint32_t laneCtas) {
  const mk::device::GemmParams p = mk::runtime::gemmLaneParams(g, 1);
  CHECK(st.activeCtas == g.ctas);
  CHECK(g.ctas >= 1);
  CHECK(g.ctas <= laneCtas);
  CHECK(g.ctas <= g.tiles);
  const uint32_t units = p.tilesM * p.tilesN;  // what runGemmStep hands gemmRunTiles
  REQUIRE(units == g.tiles);
  std::vector<uint8_t> seen(units, 0);
  uint32_t idle = 0;
  for (uint32_t cta = 0; cta < st.activeCtas; ++cta) {
    uint32_t mine = 0;
    for (uint32_t unit = cta; unit < units; unit += st.activeCtas) {
      uint32_t tile = 0, split = 0, kBegin = 0, kEnd = 0, tileM = 0, tileN = 0;
      mk::device::gemmUnit(p, unit, tile, split, kBegin, kEnd);
      mk::device::gemmTileCoord(p, tile, tileM, tileN);
      REQUIRE(tileM < p.tilesM);
      REQUIRE(tileN < p.tilesN);
      CHECK(kBegin == 0);
      CHECK(kEnd == p.kIters);
      ++seen[uint64_t{tileM} * p.tilesN + tileN];
      ++mine;
    }
    if (mine == 0) ++idle;
  }
  CHECK(idle == 0);
  CHECK(std::count(seen.begin(), seen.end(), uint8_t{1}) == static_cast<std::ptrdiff_t>(units));
}

}  // namespace

TEST_CASE("lowering: every Gemm tile runs exactly once and every active CTA of the lane gets one") {
  // The bench shapes of the hang report (8192^2 x 4096 on 131 CTAs: 2048 wide tiles, 16 per CTA), the
  // 116-CTA shapes, the 2-GPU test's shape, remainders, one CTA, and more tiles than 16 bits count.
  const uint32_t cases[][4] = {{8192, 8192, 4096, 131},  {4096, 4096, 2048, 131}, {4096, 4096, 2048, 116},
                               {1024, 8192, 14336, 116}, {700, 1104, 200, 128},   {700, 520, 200, 128},
                               {129, 1000, 8, 128},      {300, 200, 104, 3},      {128, 128, 64, 1},
                               {1000, 520, 72, 7},       {65536, 40000, 64, 131}};
  for (const auto& c : cases) {
    CAPTURE(c[0]);
    CAPTURE(c[1]);
    CAPTURE(c[2]);
    CAPTURE(c[3]);
    LowerOptions opt;
    opt.nWorkers = c[3];
    const LoweredProgram p = lowerRank(gemmSchedule(c[0], c[1], c[2]), 0, opt);
    REQUIRE(p.header().nGemms == 1);
    const auto& g = loweredGemm(p, 0);
    CHECK((g.blockN == 128 || g.blockN == 256));
    // The lane asked for one CTA per 128 x 128 tile, capped by the workers.
    const uint64_t want = ((uint64_t{c[0]} + 127) / 128) * ((uint64_t{c[1]} + 127) / 128);
    CHECK(p.lanes()[0].ctaCount == std::min<uint64_t>(want, c[3]));
    checkTileSplit(g, p.steps()[0], p.lanes()[0].ctaCount);
  }
}

TEST_CASE("lowering: Gemm steps get lane barriers exactly where another CTA's tiles or pieces are touched") {
  LowerOptions opt;
  opt.nWorkers = 32;
  const uint64_t aCount = 512 * 64;
  // (a) a Copy writes A (in ctaPiece pieces), then a Gemm reads it by tiles: barrier before the Gemm.
  {
    Schedule s = gemmSchedule(512, 512, 64);
    Step& gemm = s.lanes[0][0].steps[0];
    gemm.a = ref(0, 2, 0);  // A from scratch (bf16)
    s.lanes[0][0].steps.insert(s.lanes[0][0].steps.begin(), copy(ref(0, 2, 0), ref(0, 0, 0), aCount));
    const LoweredProgram p = lowerRank(s, 0, opt);
    REQUIRE(p.lanes()[0].ctaCount > 1);
    CHECK((p.steps()[0].bits & mk::device::kLsBarrierBefore) == 0);
    CHECK((p.steps()[1].bits & mk::device::kLsBarrierBefore) != 0);
    CHECK(p.header().nSyncPoints == 1);
  }
  // (b) a second Gemm accumulates into the same C (tiles of other CTAs when the widths differ): barrier.
  {
    Schedule s = gemmSchedule(512, 512, 64);
    Step second = s.lanes[0][0].steps[0];
    second.flags |= mk::kStepAccumulate;
    s.lanes[0][0].steps.push_back(second);
    const LoweredProgram p = lowerRank(s, 0, opt);
    CHECK(p.header().nGemms == 2);
    CHECK(p.steps()[0].count == 0);
    CHECK(p.steps()[1].count == 1);
    CHECK((p.steps()[1].bits & mk::device::kLsBarrierBefore) != 0);
  }
  // (c) two Gemms reading the same A and B into disjoint outputs: no barrier, the CTAs run them back to back.
  {
    Schedule s = gemmSchedule(512, 512, 64);
    Step second = s.lanes[0][0].steps[0];
    second.dst = ref(0, 2, 0);  // C of the second one in scratch (bf16, m x n)
    s.lanes[0][0].steps.push_back(second);
    const LoweredProgram p = lowerRank(s, 0, opt);
    CHECK((p.steps()[0].bits & mk::device::kLsBarrierBefore) == 0);
    CHECK((p.steps()[1].bits & mk::device::kLsBarrierBefore) == 0);
    CHECK(p.header().nSyncPoints == 0);
    checkTileSplit(loweredGemm(p, 0), p.steps()[0], p.lanes()[0].ctaCount);
    checkTileSplit(loweredGemm(p, 1), p.steps()[1], p.lanes()[0].ctaCount);
  }
  // (d) a lane of one CTA never needs a lane barrier (its steps are ordered by the CTA's own barriers).
  {
    Schedule s = gemmSchedule(512, 512, 64);
    Step second = s.lanes[0][0].steps[0];
    second.flags |= mk::kStepAccumulate;
    s.lanes[0][0].steps.push_back(second);
    LowerOptions one;
    one.nWorkers = 1;
    const LoweredProgram p = lowerRank(s, 0, one);
    CHECK(p.lanes()[0].ctaCount == 1);
    CHECK((p.steps()[1].bits & mk::device::kLsBarrierBefore) == 0);
    CHECK(p.header().nSyncPoints == 0);
    CHECK(loweredGemm(p, 0).ctas == 1);
  }
}

TEST_CASE("compute lanes: the per-op GemmParams follow the lowered record and refuse one that disagrees") {
  Schedule s = gemmSchedule(1000, 520, 72, mk::DType::BFloat16, true);
  s.lanes[0][0].steps[0].flags |= mk::kStepAccumulate;
  LowerOptions opt;
  opt.nWorkers = 20;
  const LoweredProgram prog = lowerRank(s, 0, opt);
  mk::device::LoweredGemm g = loweredGemm(prog, 0);
  const mk::device::GemmParams p = mk::runtime::gemmLaneParams(g, 12345);
  CHECK(p.m == 1000);
  CHECK(p.n == 520);
  CHECK(p.k == 72);
  CHECK(p.ldc == 520);
  CHECK(p.blockN == g.blockN);
  CHECK(p.tilesM == 8);
  CHECK(p.tilesN == (520 + g.blockN - 1) / g.blockN);
  CHECK(p.kIters == 2);
  CHECK(p.splitK == 1);
  CHECK(p.kItersPerSplit == 2);
  CHECK(p.bRowMajor == 0);
  CHECK(p.accumulate == 1);
  CHECK(p.tmaStoreC == 0);  // accumulation takes the direct epilogue
  CHECK(p.out == mk::device::GemmOut::BFloat16);
  CHECK(p.tag == 0);  // lane 0 step 0
  CHECK(p.waitLimitNs == 12345);
  // The engine's waits get half of the communicator's budget (and never 0, which would mean 10 s).
  CHECK(mk::runtime::gemmLaneWaitLimitNs(10'000'000'000ull) == 5'000'000'000ull);
  CHECK(mk::runtime::gemmLaneWaitLimitNs(1) == 1);
  auto refused = [](const mk::device::LoweredGemm& bad, const char* part) {
    try {
      (void)mk::runtime::gemmLaneParams(bad, 1);
      FAIL("a disagreeing record was accepted");
    } catch (const mk::Error& e) {
      CHECK(e.code() == mk::ErrorCode::Internal);
      CAPTURE(e.what());
      CHECK(std::string(e.what()).find("lane 0 step 0 (gemm)") != std::string::npos);
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
  };
  mk::device::LoweredGemm bad = g;
  bad.tiles += 1;
  refused(bad, "tiles");
  bad = g;
  bad.ctas = bad.tiles + 1;  // a CTA without a tile
  refused(bad, "CTAs");
  bad = g;
  bad.blockN = 64;
  refused(bad, "width");
}

namespace {
/// A collective with its puts as LL packets (GenOptions::protocol = LL), `ranks` ranks of one node.
Schedule packetSchedule(uint32_t ranks, uint64_t count, uint32_t chunks, mk::DType dt = mk::DType::Float16,
                        mk::CollOp op = mk::CollOp::AllReduce, mk::Algorithm algo = mk::Algorithm::OneShot) {
  mk::CollectiveSpec spec;
  spec.op = op;
  spec.algo = algo;
  spec.count = count;
  spec.dtype = dt;
  mk::GenOptions g;
  g.chunks = chunks;
  g.protocol = mk::Protocol::LL;
  return mk::generate(spec, std::vector<uint32_t>(ranks, 0), g);
}
}  // namespace

TEST_CASE("lowering: LL packet puts land where the receiver's wait unpacks them") {
  for (uint32_t ranks : {2u, 4u})
    for (uint32_t chunks : {1u, 3u})
      for (uint64_t count : {1ull, 1021ull, 4099ull}) {
        CAPTURE(ranks);
        CAPTURE(chunks);
        CAPTURE(count);
        const Schedule s = packetSchedule(ranks, count, chunks);
        std::vector<LoweredProgram> p;
        for (uint32_t r = 0; r < ranks; ++r) p.push_back(lowerRank(s, r));
        // Sender side: every Put is a packet Put (no signal bit), its offset names a packet run its receiver unpacks
        // from the sender's own source, with the same count.
        uint64_t puts = 0;
        for (uint32_t q = 0; q < ranks; ++q)
          for (uint32_t i = 0; i < p[q].header().nSteps; ++i) {
            const auto& st = p[q].steps()[i];
            if (st.kind != static_cast<uint8_t>(StepKind::Put)) continue;
            ++puts;
            CHECK((st.bits & mk::device::kLsPacket) != 0);
            CHECK((st.bits & mk::device::kLsSignal) == 0);
            CHECK(st.value % 16 == 0);
            const LoweredProgram& rcv = p[st.flagRank];
            const auto* runs = reinterpret_cast<const mk::device::LoweredPacketRecv*>(rcv.image.data() +
                                                                                      rcv.header().packetRecvsOffset);
            uint32_t matches = 0;
            for (uint32_t k = 0; k < rcv.header().nPacketRecvs; ++k)
              if (runs[k].areaOffset == st.value) {
                ++matches;
                CHECK(runs[k].sender == q);
                CHECK(runs[k].count == st.count);
              }
            CHECK(matches == 1);
          }
        CHECK(puts == uint64_t{ranks} * (ranks - 1) * std::min<uint64_t>(chunks, count));
        // Receiver side: every Wait unpacks ranks-1 runs, and the runs of one rank never overlap in its area.
        for (uint32_t r = 0; r < ranks; ++r) {
          const auto* runs = reinterpret_cast<const mk::device::LoweredPacketRecv*>(p[r].image.data() +
                                                                                    p[r].header().packetRecvsOffset);
          for (uint32_t i = 0; i < p[r].header().nSteps; ++i) {
            const auto& st = p[r].steps()[i];
            if (st.kind != static_cast<uint8_t>(StepKind::Wait)) continue;
            CHECK((st.bits & mk::device::kLsPacket) != 0);
            CHECK(st.count == ranks - 1);
            CHECK(st.value + st.count <= p[r].header().nPacketRecvs);
          }
          std::vector<std::pair<uint64_t, uint64_t>> spans;
          for (uint32_t k = 0; k < p[r].header().nPacketRecvs; ++k)
            spans.emplace_back(runs[k].areaOffset, runs[k].areaOffset + mk::runtime::packetBytes(runs[k].count * 2));
          std::sort(spans.begin(), spans.end());
          for (size_t k = 1; k < spans.size(); ++k) CHECK(spans[k - 1].second <= spans[k].first);
        }
      }
}

TEST_CASE("lowering: every put of the packet generators lowers as a packet put, every wait of theirs unpacks") {
  // The cost model prices these generators' puts as packets; the engine must send every one as a packet.
  const std::pair<mk::CollOp, mk::Algorithm> gens[] = {{mk::CollOp::AllReduce, mk::Algorithm::OneShot},
                                                       {mk::CollOp::AllReduce, mk::Algorithm::TwoShot},
                                                       {mk::CollOp::AllGather, mk::Algorithm::Direct}};
  for (const auto& [op, algo] : gens)
    for (uint32_t ranks : {2u, 3u, 8u})
      for (uint32_t chunks : {1u, 4u})
        for (uint64_t count : {1ull, 1021ull}) {
          CAPTURE(mk::toString(op));
          CAPTURE(mk::toString(algo));
          CAPTURE(ranks);
          CAPTURE(chunks);
          CAPTURE(count);
          const Schedule s = packetSchedule(ranks, count, chunks, mk::DType::BFloat16, op, algo);
          uint64_t puts = 0, packetPuts = 0;
          for (uint32_t r = 0; r < ranks; ++r) {
            const LoweredProgram p = lowerRank(s, r);
            for (uint32_t i = 0; i < p.header().nSteps; ++i) {
              const auto& st = p.steps()[i];
              const bool packet = (st.bits & mk::device::kLsPacket) != 0;
              if (st.kind == static_cast<uint8_t>(StepKind::Put)) {
                ++puts;
                packetPuts += packet ? 1 : 0;
              }
              // Two-shot's reducer -> sender signal is a local Signal, not a put: that wait stays a flag wait.
              if (st.kind == static_cast<uint8_t>(StepKind::Wait) && !packet) CHECK(algo == mk::Algorithm::TwoShot);
            }
          }
          CHECK(puts > 0);
          CHECK(packetPuts == puts);
        }
}

TEST_CASE("lowering: LL packets need the whole schedule and fit the packet area") {
  const Schedule s = packetSchedule(2, 1021, 1);
  CHECK_THROWS_WITH_AS(mk::runtime::lowerPacked(mk::packRank(s, 0), 0),
                       doctest::Contains("lower it from the whole schedule"), mk::Error);
  // 2 ranks x 300 Ki fp32 elements: 2.4 MB of packets into each rank, past its 1 MiB area.
  const Schedule big = packetSchedule(2, 300 * 1024, 1, mk::DType::Float32);
  CHECK_THROWS_WITH_AS(lowerRank(big, 0), doctest::Contains("packet area holds"), mk::Error);
}

TEST_CASE("lowering: LL bits on flags that do not take packets run as plain puts with their signal") {
  // Packet puts are all-or-nothing per flag: the hand-made one-shot with its put marked LL takes packets; with a
  // second, plain signal into the same flag (or a wait below the puts' sum) the put stays a plain put + signal.
  auto lowered = [](bool extraSignal, uint64_t threshold) {
    Schedule s = oneShot(1021);
    for (uint32_t r = 0; r < 2; ++r) {
      s.lanes[r][0].steps[0].flags |= mk::kStepLL;
      s.lanes[r][1].steps[0].value = threshold;
      if (extraSignal) {
        Step sig;
        sig.kind = StepKind::Signal;
        sig.flag = mk::FlagRef{1 - r, 0};
        sig.value = 1;
        s.lanes[r][0].steps.push_back(sig);
      }
    }
    return lowerRank(s, 0);
  };
  auto packetBits = [](const LoweredProgram& p) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < p.header().nSteps; ++i) n += (p.steps()[i].bits & mk::device::kLsPacket) ? 1 : 0;
    return n;
  };
  const LoweredProgram packets = lowered(false, 1);
  CHECK(packetBits(packets) == 2);  // the put and the wait
  CHECK(packets.header().nPacketRecvs == 1);
  for (const LoweredProgram& p : {lowered(true, 2), lowered(false, 2)}) {
    CHECK(packetBits(p) == 0);
    CHECK(p.header().nPacketRecvs == 0);
    CHECK((p.steps()[0].bits & mk::device::kLsSignal) != 0);
  }
}

TEST_CASE("lowering: attention-grad is refused, naming the CPU executor") {
  for (const StepKind kind : {StepKind::AttentionGrad}) {
    Schedule s = gemmSchedule(64, 64, 64);
    s.lanes[0][0].steps[0].kind = kind;
    const std::string msg = errorOf(s, 0);
    CAPTURE(msg);
    CHECK(msg.find("unsupported") == 0);
    CHECK(msg.find(std::string("the GPU engine does not run ") + mk::toString(kind) +
                   " steps yet; run the schedule on the CPU executor") != std::string::npos);
  }
}
