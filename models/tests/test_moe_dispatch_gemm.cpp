// The moe-dispatch-gemm generator (mk/algorithms/moe.hpp) on the CPU executor against the FP32 reference of
// verifyMoeDispatchGemm: placements inside one node and across nodes, uniform, skewed and given routings, the
// capacity, the spec's refusals and the extents' expected values.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "layout.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;

namespace {

MoeDispatchGemmSpec smallSpec(uint32_t tokens) {
  MoeDispatchGemmSpec spec;
  spec.experts = 2;
  spec.topk = 2;
  spec.tokens = tokens;
  spec.hidden = 16;
  spec.outCols = 8;
  return spec;
}

void checkVerifies(const Schedule& s, const MoeDispatchGemmSpec& spec, uint64_t seed, MoeRouting routing,
                   const MoeIds& ids = {}) {
  const VerifyResult v = verifyMoeDispatchGemm(s, spec, seed, routing, ids);
  INFO(v.detail);
  CHECK(v.ok);
  CHECK(v.checked == uint64_t{s.nRanks} * s.nRanks * spec.experts * spec.capacityOr() * spec.outCols);
}

}  // namespace

TEST_CASE("moe-dispatch-gemm: one node of 3 ranks, uniform routing with an odd token count, matches the reference") {
  const MoeDispatchGemmSpec spec = smallSpec(7);
  const Schedule s = generateMoeDispatchGemm(spec, {0, 0, 0});
  CHECK(validate(s).empty());
  CHECK(test::countKind(s, StepKind::ProxyPut) == 0);
  CHECK(test::countKind(s, StepKind::Route) == 3);
  CHECK(test::countKind(s, StepKind::Gather) == 3 * 6);
  CHECK(test::countKind(s, StepKind::GroupedGemm) == 3 * 3);
  for (uint64_t seed : {1, 2}) checkVerifies(s, spec, seed, MoeRouting::Uniform);
}

TEST_CASE("moe-dispatch-gemm: 2 nodes of 2 ranks send across nodes by proxyput and match the reference") {
  MoeDispatchGemmSpec spec = smallSpec(9);
  spec.topk = 3;
  const Schedule s = generateMoeDispatchGemm(spec, {0, 0, 1, 1});
  CHECK(validate(s).empty());
  // Per rank: its counts to the 2 ranks of the other node and one block per expert there (2 ranks x 2 experts).
  CHECK(test::countKind(s, StepKind::ProxyPut) == 4 * (2 + 4));
  for (uint32_t r = 0; r < 4; ++r) {
    REQUIRE(s.lanes[r].size() == 3);
    CHECK(s.lanes[r][2].role == LaneRole::InterSend);
  }
  checkVerifies(s, spec, 3, MoeRouting::Uniform);
  checkVerifies(s, spec, 4, MoeRouting::Skewed);
}

TEST_CASE("moe-dispatch-gemm: a skewed routing fills one expert, experts with no token keep their rows untouched") {
  MoeDispatchGemmSpec spec = smallSpec(5);
  spec.topk = 1;
  const Schedule s = generateMoeDispatchGemm(spec, {0, 0, 0});
  checkVerifies(s, spec, 7, MoeRouting::Skewed);
  const MoeIds skewed = moeRouting(spec, 3, MoeRouting::Skewed, 7);
  for (const auto& rank : skewed)
    for (int32_t id : rank) CHECK(id == skewed[0][0]);
  // Given: expert 3 (rank 1's second) gets no token from anyone, rank 2's tokens all go to expert 0.
  const MoeIds given = {{0, 1, 2, 4, 5}, {5, 4, 2, 1, 0}, {0, 0, 0, 0, 0}};
  checkVerifies(s, spec, 8, MoeRouting::Given, given);
  // The check sees a schedule that drops work: without rank 0's last grouped GEMM (rank 2's 5 tokens for expert 0)
  // those rows stay untouched.
  Schedule dropped = s;
  dropped.lanes[0][1].steps.pop_back();
  const VerifyResult v = verifyMoeDispatchGemm(dropped, spec, 8, MoeRouting::Given, given);
  CHECK_FALSE(v.ok);
  CHECK(v.detail.find("rank 0 out[") != std::string::npos);
  test::expectError(
      [&] {
        verifyMoeDispatchGemm(s, spec, 8, MoeRouting::Given, {{0, 1}});
      },
      ErrorCode::InvalidArgument, "given ids for 1 ranks, expected 3");
}

TEST_CASE("moe-dispatch-gemm: a routing over the capacity is refused by the route with no output written") {
  MoeDispatchGemmSpec spec = smallSpec(5);
  spec.capacity = 3;
  const Schedule s = generateMoeDispatchGemm(spec, {0, 1});
  CHECK(validate(s).empty());
  checkVerifies(s, spec, 1, MoeRouting::Given, {{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}, {3, 2, 1, 0, 3, 2, 1, 0, 3, 2}});
  test::expectError([&] { verifyMoeDispatchGemm(s, spec, 1, MoeRouting::Skewed); }, ErrorCode::InvalidArgument,
                    "routes 5 tokens to expert");
  HostMemory mem = HostMemory::allocate(s);
  for (uint32_t r = 0; r < 2; ++r)
    for (uint32_t t = 0; t < 10; ++t) mem.as<int32_t>(r, 0)[t] = t % 2;  // 5 tokens to experts 0 and 1 each
  test::expectError([&] { execute(s, mem); }, ErrorCode::InvalidArgument, "above the capacity 3");
  for (uint32_t r = 0; r < 2; ++r)
    for (uint64_t i = 0; i < s.buffers[7].count[r]; ++i) CHECK(mem.as<float>(r, 7)[i] == 0.0f);
}

TEST_CASE("moe-dispatch-gemm: bad specs are refused naming the field") {
  auto refused = [](auto edit, uint32_t ranks, const char* part) {
    MoeDispatchGemmSpec spec = smallSpec(4);
    edit(spec);
    test::expectError([&] { generateMoeDispatchGemm(spec, std::vector<uint32_t>(ranks, 0)); },
                      ErrorCode::InvalidArgument, {"moe-dispatch-gemm: ", part});
  };
  refused([](MoeDispatchGemmSpec& s) { s.topk = 7; }, 3, "topk 7 is larger than the experts in total, 6");
  refused([](MoeDispatchGemmSpec& s) { s.experts = 0; }, 3, "experts must be >= 1 (got 0)");
  refused([](MoeDispatchGemmSpec& s) { s.tokens = 0; }, 3, "tokens must be >= 1 (got 0)");
  refused([](MoeDispatchGemmSpec& s) { s.hidden = 0; }, 3, "hidden must be >= 1 (got 0)");
  refused([](MoeDispatchGemmSpec& s) { s.topk = 0; }, 3, "topk must be >= 1 (got 0)");
  refused([](MoeDispatchGemmSpec& s) { s.capacity = 0; }, 3, "capacity must be >= 1 (got 0)");
  refused([](MoeDispatchGemmSpec& s) { s.hidden = 12; }, 3, "hidden 12 is not a multiple of 8");
  refused([](MoeDispatchGemmSpec& s) { s.outCols = 20; }, 3, "outCols 20 is not a multiple of 8");
  refused([](MoeDispatchGemmSpec& s) { s.imbalance = 0.5; }, 3, "imbalance 0.5");
  refused(
      [](MoeDispatchGemmSpec& s) {
        s.tokens = 1u << 30;
        s.experts = 1u << 16;
      },
      3, "buffer recv (experts in total x capacity x hidden) on 3 ranks holds more than 2^50 elements");
  refused([](MoeDispatchGemmSpec&) {}, 0, "no ranks");
}

TEST_CASE("moe-dispatch-gemm: extents read the counts and are priced at the routing model's expected value") {
  MoeDispatchGemmSpec spec = smallSpec(9);
  spec.imbalance = 2.0;
  const Schedule s = generateMoeDispatchGemm(spec, {0, 0, 1});
  REQUIRE(s.extents.size() == 12);
  for (const ExtentDecl& d : s.extents) {
    CHECK(d.bound == 9);
    CHECK(d.expected == doctest::Approx(9.0 * 2 / 6 * 2.0));  // T topk / (R E) x imbalance
    CHECK(d.sourced());
  }
  CHECK(s.extents[7].name == "from0.1");
  // The JSON form keeps it: read back, it is the same schedule.
  const std::string json = scheduleToJson(s);
  CHECK(json.find("\"op\":\"moe-dispatch-gemm\"") != std::string::npos);
  CHECK(scheduleToJson(scheduleFromJson(json)) == json);
  CHECK(s.extents[7].sourceElement == 1);
  spec.imbalance = 10.0;  // capped at the capacity
  CHECK(generateMoeDispatchGemm(spec, {0, 0, 1}).extents[0].expected == 9.0);
}

TEST_CASE("moe-dispatch-gemm: the cost model prices the blocks at the expected tokens, more with imbalance") {
  MoeDispatchGemmSpec spec = smallSpec(64);
  spec.hidden = 256;
  spec.outCols = 128;
  const Profile p = defaultProfile(topologyPreset("h200x2"));
  double previousUs = 0;
  for (double imbalance : {1.0, 4.0}) {
    spec.imbalance = imbalance;
    const Schedule s = generateMoeDispatchGemm(spec, {0, 0, 1, 1});
    const double rows = 64.0 * 2 / 8 * imbalance;  // T topk / (R E) x imbalance
    for (const Step& st : s.lanes[0][2].steps)     // rank 0's network lane: counts, then blocks
      if (st.kind == StepKind::ProxyPut) CHECK(st.bytes == (st.extent == kNoExtent ? 2 * 4 : rows * 256 * 2));
    const double us = simulateUncontended(s, p).totalUs;
    CHECK(us > previousUs);
    previousUs = us;
  }
}
