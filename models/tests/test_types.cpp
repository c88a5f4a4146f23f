// Tests of the Schedule IR's vocabulary (types.hpp) and the small queries of schedule.hpp.
#include <doctest/doctest.h>

#include <string>
#include <type_traits>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/schedule/types.hpp"

namespace {

using namespace mk;

/// Every value of an enum whose values are 0..n-1 prints a distinct name that parses back to it.
template <typename E, typename Parse>
void checkRoundTrip(int n, Parse parse, std::vector<std::string> expected) {
  REQUIRE(expected.size() == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto v = static_cast<E>(i);
    const std::string name = toString(v);
    CAPTURE(name);
    CHECK(name == expected[static_cast<std::size_t>(i)]);
    const auto back = parse(name);
    REQUIRE(back.has_value());
    CHECK(*back == v);
  }
}

}  // namespace

TEST_CASE("types: dtype names round trip through parseDType") {
  checkRoundTrip<DType>(5, parseDType, {"float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2"});
}

TEST_CASE("types: dtype aliases fp32 f32 bf16 fp16 f16 half e4m3 e5m2 parse") {
  CHECK(parseDType("e4m3") == DType::Float8E4M3);
  CHECK(parseDType("fp8_e4m3") == DType::Float8E4M3);
  CHECK(parseDType("e5m2") == DType::Float8E5M2);
  CHECK(parseDType("fp8_e5m2") == DType::Float8E5M2);
  CHECK_FALSE(parseDType("fp8").has_value());  // a training recipe (workload.hpp), not one element type
  CHECK(parseDType("fp32") == DType::Float32);
  CHECK(parseDType("f32") == DType::Float32);
  CHECK(parseDType("bf16") == DType::BFloat16);
  CHECK(parseDType("fp16") == DType::Float16);
  CHECK(parseDType("f16") == DType::Float16);
  CHECK(parseDType("half") == DType::Float16);
}

TEST_CASE("types: reduction op names round trip through parseRedOp") {
  checkRoundTrip<RedOp>(4, parseRedOp, {"sum", "max", "min", "lse-merge"});
}

TEST_CASE("types: a collective takes the element-wise operators only, and lse-merge is refused with the list") {
  CHECK(requireRedOp("max") == RedOp::Max);
  CHECK_THROWS_WITH_AS(requireRedOp("lse-merge", "--redop"),
                       doctest::Contains("unknown --redop 'lse-merge' (expected sum, max, min)"), Error);
  CHECK(redOpInfo(RedOp::LseMerge).shape == RedOpShape::LseRows);
  CHECK(redOpInfo(RedOp::Sum).shape == RedOpShape::Elementwise);
}

TEST_CASE("types: algorithm and inter-node phase names round trip") {
  checkRoundTrip<Algorithm>(5, parseAlgorithm, {"one-shot", "two-shot", "ring", "hierarchical", "direct"});
  checkRoundTrip<InterPhase>(5, parseInterPhase, {"auto", "ring", "rhd", "bruck", "bruck-half"});
  CHECK_FALSE(parseAlgorithm("auto").has_value());  // "auto" is a request (policy.hpp), not an algorithm
  CHECK_FALSE(parseAlgorithm("Ring").has_value());
  CHECK_FALSE(parseInterPhase("tree").has_value());
}

TEST_CASE("types: a bad op dtype redop or algorithm word has one spelling, naming where it came from") {
  auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(toString(e.code())) + ": " + e.message();
    }
    return "no error";
  };
  CHECK(message([] { requireCollOp("allsum", "--op"); }) ==
        "invalid-argument: unknown --op 'allsum' (expected allreduce, allgather, reducescatter, broadcast, alltoall)");
  CHECK(message([] { requireDType("int7", "dtype"); }) ==
        "invalid-argument: unknown dtype 'int7' (expected float32, bfloat16, float16, float8_e4m3, float8_e5m2)");
  CHECK(message([] { requireRedOp("prod", "--redop"); }) ==
        "invalid-argument: unknown --redop 'prod' (expected sum, max, min)");
  CHECK(message([] { requireAlgorithm(CollOp::AllReduce, "star"); }) ==
        "not-found: unknown algorithm 'star' for allreduce (expected one-shot, two-shot, ring, hierarchical)");
  CHECK(message([] { requireAlgorithm(CollOp::Broadcast, "one-shot"); }) ==
        "not-found: unknown algorithm 'one-shot' for broadcast (expected direct, ring)");
  CHECK(requireCollOp("all-reduce") == CollOp::AllReduce);  // the aliases of the parsers are kept
  CHECK(requireDType("bf16") == DType::BFloat16);
  CHECK(requireRedOp("min") == RedOp::Min);
  CHECK(requireAlgorithm(CollOp::AllToAll, "direct") == Algorithm::Direct);
}

TEST_CASE("types: lane role names round trip through parseLaneRole") {
  checkRoundTrip<LaneRole>(4, parseLaneRole, {"compute", "intra", "inter-send", "inter-recv"});
}

TEST_CASE("types: link class names round trip through parseLinkClass") {
  checkRoundTrip<LinkClass>(4, parseLinkClass, {"none", "local", "nvlink", "network"});
}

TEST_CASE("types: step kind names round trip and proxy-put is an alias") {
  checkRoundTrip<StepKind>(13, parseStepKind,
                           {"copy", "reduce", "put", "proxyput", "signal", "wait", "gemm", "barrier", "grouped-gemm",
                            "route", "gather", "attention", "combine"});
  CHECK(parseStepKind("proxy-put") == StepKind::ProxyPut);
}

TEST_CASE("types: the step-kind table answers what sites used to spell out kind by kind") {
  CHECK(kStepKindCount == 14);
  CHECK_FALSE(isStepKind(static_cast<uint8_t>(kStepKindCount)));
  CHECK(std::string(kindInfo(static_cast<StepKind>(200)).name) == "?");  // no out-of-range read
  CHECK(kindInfo(static_cast<StepKind>(200)).fields == 0);
  // Which steps raise a flag: a Signal always, a Put or ProxyPut with kStepSignal, nothing else.
  CHECK(incrementsFlag(StepKind::Signal, 0));
  CHECK(incrementsFlag(StepKind::Put, kStepSignal));
  CHECK(incrementsFlag(StepKind::ProxyPut, kStepSignal));
  CHECK_FALSE(incrementsFlag(StepKind::Put, 0));
  CHECK_FALSE(incrementsFlag(StepKind::Wait, kStepSignal));
  CHECK_FALSE(incrementsFlag(StepKind::Copy, kStepSignal));
  CHECK(kindInfo(StepKind::Wait).waits);
  CHECK(kindInfo(StepKind::Barrier).waits);
  CHECK(kindInfo(StepKind::ProxyPut).remote);
  CHECK_FALSE(kindInfo(StepKind::Put).remote);
  CHECK(kindInfo(StepKind::Put).protocol);
  CHECK_FALSE(kindInfo(StepKind::Copy).protocol);
  // Every kind but attention's backward runs on the GPU engine (grouped gemm, route, gather and combine since their
  // resident-kernel handlers); the lowering refuses it.
  for (const StepKindInfo& k : kStepKinds) CHECK(k.gpu == (k.kind != StepKind::AttentionGrad));
  CHECK(kindInfo(StepKind::Combine).extent == StepExtent::Indexed);
  CHECK(kindInfo(StepKind::Route).extent == StepExtent::Indexed);
  CHECK((kindInfo(StepKind::Gather).fields & kFieldExtent) != 0);
  CHECK(kindInfo(StepKind::GroupedGemm).extent == StepExtent::Tile);
  CHECK((kindInfo(StepKind::GroupedGemm).fields & kFieldCount) != 0);
}

TEST_CASE("types: buffer kind names round trip through parseBufferKind") {
  checkRoundTrip<BufferKind>(4, parseBufferKind, {"input", "output", "scratch", "inout"});
}

TEST_CASE("types: unknown empty and mis-cased names are rejected") {
  for (const char* bad : {"", "Float32", "float64", "int8", " fp32", "bf16 "}) {
    CAPTURE(bad);
    CHECK_FALSE(parseDType(bad).has_value());
  }
  CHECK_FALSE(parseRedOp("prod").has_value());
  CHECK_FALSE(parseRedOp("SUM").has_value());
  CHECK_FALSE(parseLaneRole("inter_send").has_value());
  CHECK_FALSE(parseLaneRole("").has_value());
  CHECK_FALSE(parseLinkClass("pcie").has_value());
  CHECK_FALSE(parseStepKind("pt").has_value());
  CHECK_FALSE(parseStepKind("proxy_put").has_value());
  CHECK_FALSE(parseBufferKind("temp").has_value());
}

TEST_CASE("types: out of range enum values print a placeholder instead of crashing") {
  CHECK(std::string(toString(static_cast<DType>(7))) == "?");
  CHECK(dtypeSize(static_cast<DType>(6)) == 0);
  CHECK(std::string(toString(static_cast<StepKind>(200))) == "?");
  CHECK(std::string(toString(static_cast<LaneRole>(9))) == "?");
  CHECK(std::string(toString(static_cast<BufferKind>(4))) == "?");
  CHECK(std::string(toString(static_cast<LinkClass>(4))) == "?");
  CHECK(std::string(toString(static_cast<RedOp>(4))) == "?");
}

TEST_CASE("types: dtypeSize is 4 bytes for float32, 2 for the 16-bit types and 1 for FP8") {
  CHECK(dtypeSize(DType::Float32) == 4);
  CHECK(dtypeSize(DType::BFloat16) == 2);
  CHECK(dtypeSize(DType::Float16) == 2);
  CHECK(dtypeSize(DType::Float8E4M3) == 1);
  CHECK(dtypeSize(DType::Float8E5M2) == 1);
  static_assert(dtypeSize(DType::Float32) == 4, "usable in constant expressions");
  for (std::size_t t = 0; t < kDTypeCount; ++t)  // the device's copy of the sizes
    CHECK(((kDTypeSizeNibbles >> (4 * t)) & 15u) == kDTypes[t].size);
}

TEST_CASE("types: the dtype table gives FP8 float32 accumulation and per-tensor or per-block scales") {
  for (DType t : {DType::Float8E4M3, DType::Float8E5M2}) {
    CAPTURE(toString(t));
    CHECK(dtypeInfo(t).accumulate == DType::Float32);
    CHECK(dtypeInfo(t).scales == (scaleBit(ScaleKind::PerTensor) | scaleBit(ScaleKind::PerBlock)));
  }
  CHECK(dtypeInfo(DType::BFloat16).scales == scaleBit(ScaleKind::None));
  CHECK(dtypeInfo(DType::Float8E4M3).maxFinite == 448.0);
  CHECK_FALSE(dtypeInfo(DType::Float8E4M3).infinities);
  CHECK(dtypeInfo(DType::Float8E5M2).maxFinite == 57344.0);
}

TEST_CASE("types: wire structs keep their packed sizes and enum widths") {
  CHECK(sizeof(BufRef) == 16);
  CHECK(sizeof(FlagRef) == 8);
  CHECK(sizeof(PackedHeader) == 64);
  CHECK(sizeof(PackedBuffer) == 16);
  CHECK(sizeof(PackedLane) == 32);
  CHECK(sizeof(PackedStep) == 96);
  CHECK(sizeof(PackedGemm) == 32);
  CHECK(sizeof(DType) == 1);
  CHECK(sizeof(StepKind) == 1);
  CHECK(std::is_trivially_copyable_v<Step>);
  CHECK(static_cast<int>(StepKind::Barrier) == 7);
  CHECK(kPackMagic == 0x43534B4Du);
}

namespace {

Schedule twoRankSchedule() {
  Schedule s;
  s.nRanks = 3;
  s.nodeOf = {0, 0, 1};
  s.lanes.resize(3);
  BufferDecl in;
  in.name = "in";
  in.count = {4, 4, 4};
  BufferDecl out;
  out.name = "out";
  out.count = {4, 4, 4};
  s.buffers = {in, out};
  Lane l0;
  l0.role = LaneRole::Intra;
  l0.steps.resize(3);
  l0.steps[2].kind = StepKind::Wait;
  Lane l1;
  l1.role = LaneRole::InterSend;
  l1.steps.resize(18);
  l1.steps[17].kind = StepKind::Wait;
  s.lanes[0] = {l0};
  s.lanes[2] = {l0, l1};
  return s;
}

}  // namespace

TEST_CASE("schedule: describeStep names rank lane role step and kind") {
  const Schedule s = twoRankSchedule();
  CHECK(describeStep(s, 2, 1, 17) == "rank 2 lane 1 (inter-send) step 17 (wait)");
  CHECK(describeStep(s, 0, 0, 0) == "rank 0 lane 0 (intra) step 0 (copy)");
}

TEST_CASE("schedule: describeStep tolerates out of range rank lane and step") {
  const Schedule s = twoRankSchedule();
  CHECK(describeStep(s, 9, 0, 1) == "rank 9 lane 0 (?) step 1 (?)");
  CHECK(describeStep(s, 1, 0, 0) == "rank 1 lane 0 (?) step 0 (?)");
  CHECK(describeStep(s, 2, 0, 99) == "rank 2 lane 0 (intra) step 99 (?)");
}

TEST_CASE("schedule: bufferIndex finds declared names and returns -1 otherwise") {
  const Schedule s = twoRankSchedule();
  CHECK(s.bufferIndex("in") == 0);
  CHECK(s.bufferIndex("out") == 1);
  CHECK(s.bufferIndex("scratch") == -1);
  CHECK(s.bufferIndex("") == -1);
}

TEST_CASE("schedule: stepCount sums the steps of every lane of every rank") {
  Schedule s = twoRankSchedule();
  CHECK(s.stepCount() == 3 + 3 + 18);
  s.lanes[1].emplace_back();
  s.lanes[1].back().steps.resize(5);
  CHECK(s.stepCount() == 29);
  CHECK(Schedule{}.stepCount() == 0);
}

TEST_CASE("schedule: linkBetween is local on one rank nvlink in a node and network across") {
  const Schedule s = twoRankSchedule();
  CHECK(linkBetween(s, 1, 1) == LinkClass::Local);
  CHECK(linkBetween(s, 0, 1) == LinkClass::NVLink);
  CHECK(linkBetween(s, 1, 0) == LinkClass::NVLink);
  CHECK(linkBetween(s, 0, 2) == LinkClass::Network);
  CHECK(linkBetween(s, 0, 3) == LinkClass::None);
}
