// The moe-dispatch-gemm generator (mk/algorithms/moe.hpp) on the CPU executor against the FP32 reference of
// verifyMoeDispatchGemm: placements inside one node and across nodes, uniform, skewed and given routings, the
// capacity, the spec's refusals and the extents' expected values.
#include <doctest/doctest.h>

#include <algorithm>
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
  // Per rank, to the other node's relay only: the count of its distinct tokens there, their rows and their ids.
  CHECK(test::countKind(s, StepKind::ProxyPut) == 4 * 3);
  for (uint32_t r = 0; r < 4; ++r) {
    REQUIRE(s.lanes[r].size() == 4);
    CHECK(s.lanes[r][2].role == LaneRole::InterSend);
    CHECK(s.lanes[r][3].role == LaneRole::InterRecv);  // each rank relays for the source of the same local index
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
  test::expectError(
      [&] {
        generateMoeDispatchGemm(smallSpec(4), {0, 7});
      },
      ErrorCode::InvalidArgument, "moe-dispatch-gemm: node id 7 is not below the experts in total, 4");
  // One node may have any id: no node lists are needed.
  CHECK(validate(generateMoeDispatchGemm(smallSpec(4), {4000000000u, 4000000000u})).empty());
}

TEST_CASE("moe-dispatch-gemm: extents read the counts and are priced at the routing model's expected value") {
  MoeDispatchGemmSpec spec = smallSpec(9);
  spec.imbalance = 2.0;
  const Schedule s = generateMoeDispatchGemm(spec, {0, 0, 1});
  // 12 per expert, then per node, per (source, other node) and per (source, expert of another node)
  REQUIRE(s.extents.size() == 12 + 2 + 3 + 8);
  for (const ExtentDecl& d : s.extents) {
    CHECK(d.bound == 9);
    if (d.name.rfind("to", 0) == 0 || d.name.rfind("from", 0) == 0 || d.name.rfind("fwd", 0) == 0)
      CHECK(d.expected == doctest::Approx(9.0 * 2 / 6 * 2.0));  // T topk / (R E) x imbalance
    CHECK(d.sourced());
  }
  CHECK(s.extents[12].name == "node0");
  CHECK(s.extents[12].expected == 9.0);  // 9 x 14/15 x 2, capped at the bound
  CHECK(s.extents[7].name == "from0.1");
  // The JSON form keeps it: read back, it is the same schedule.
  const std::string json = scheduleToJson(s);
  CHECK(json.find("\"op\":\"moe-dispatch-gemm\"") != std::string::npos);
  CHECK(scheduleToJson(scheduleFromJson(json)) == json);
  CHECK(s.extents[7].sourceElement == 1);
  spec.imbalance = 10.0;  // capped at the capacity
  CHECK(generateMoeDispatchGemm(spec, {0, 0, 1}).extents[0].expected == 9.0);
  // Uniform: a node's extent is T x P(a token names one of its experts), P = 1 - C(G - g, topk) / C(G, topk).
  spec.imbalance = 1.0;
  const Schedule u = generateMoeDispatchGemm(spec, {0, 0, 1});
  auto expectedOf = [&u](const std::string& name) {
    for (const ExtentDecl& d : u.extents)
      if (d.name == name) return d.expected;
    FAIL("no extent " << name);
    return 0.0;
  };
  CHECK(expectedOf("node0") == doctest::Approx(9.0 * (1 - 2.0 / 6 * 1.0 / 5)));  // node 0: 4 of 6 experts
  CHECK(expectedOf("node1") == doctest::Approx(9.0 * (1 - 4.0 / 6 * 3.0 / 5)));  // node 1: 2 of 6
  CHECK(expectedOf("relay0.1") == expectedOf("node1"));
  CHECK(expectedOf("relay2.0") == expectedOf("node0"));
  CHECK(expectedOf("fwd2.0") == doctest::Approx(9.0 * 2 / 6));
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
    // Tokens of a rank naming one of node 1's 4 experts of 8 (topk 2) x imbalance, capped at T
    const double rows = std::min(64.0, 64.0 * (1 - 4.0 / 8 * 3.0 / 7) * imbalance);
    std::vector<uint64_t> bytes;  // rank 0's network lane: the count, the rows, the ids
    for (const Step& st : s.lanes[0][2].steps)
      if (st.kind == StepKind::ProxyPut) bytes.push_back(st.bytes);
    REQUIRE(bytes.size() == 3);
    CHECK(bytes[0] == 4);
    CHECK(double(bytes[1]) == doctest::Approx(rows * 256 * 2).epsilon(1e-4));
    CHECK(double(bytes[2]) == doctest::Approx(rows * 2 * 4).epsilon(1e-3));
    const double us = simulateUncontended(s, p).totalUs;
    CHECK(us > previousUs);
    previousUs = us;
  }
}

namespace {

/// The bytes per-node deduplication sends across nodes, straight from the ids: per source and other node, its
/// distinct tokens naming an expert there, each as H bf16 features plus topk int32 ids, and one int32 count.
uint64_t dedupBytes(const MoeDispatchGemmSpec& spec, const std::vector<uint32_t>& nodeOf, const MoeIds& ids) {
  const auto R = static_cast<uint32_t>(nodeOf.size());
  uint64_t bytes = 0;
  for (uint32_t src = 0; src < R; ++src)
    for (uint32_t n = 0; n <= *std::max_element(nodeOf.begin(), nodeOf.end()); ++n) {
      if (n == nodeOf[src]) continue;
      uint64_t distinct = 0;
      for (uint32_t t = 0; t < spec.tokens; ++t) {
        bool there = false;
        for (uint32_t k = 0; k < spec.topk; ++k)
          there = there || nodeOf[static_cast<uint32_t>(ids[src][uint64_t{t} * spec.topk + k]) / spec.experts] == n;
        distinct += there;
      }
      bytes += distinct * (spec.hidden * 2 + spec.topk * 4) + 4;
    }
  return bytes;
}

void checkDedup(const std::vector<uint32_t>& nodeOf, const MoeDispatchGemmSpec& spec, MoeRouting routing,
                const MoeIds& given = {}) {
  const Schedule s = generateMoeDispatchGemm(spec, nodeOf);
  CHECK(validate(s).empty());
  const MoeIds ids = routing == MoeRouting::Given ? given : moeRouting(spec, s.nRanks, routing, 11);
  ExecStats stats;
  const VerifyResult v = verifyMoeDispatchGemm(s, spec, 11, MoeRouting::Given, ids, &stats);
  INFO(v.detail);
  CHECK(v.ok);
  CHECK(v.checked == uint64_t{s.nRanks} * s.nRanks * spec.experts * spec.capacityOr() * spec.outCols);
  CHECK(stats.bytes(StepKind::ProxyPut) == dedupBytes(spec, nodeOf, ids));
}

}  // namespace

TEST_CASE("moe-dispatch-gemm: across nodes each token crosses once per node, the bytes counted by the executor") {
  MoeDispatchGemmSpec spec = smallSpec(6);
  spec.topk = 3;
  const std::vector<uint32_t> twoByTwo{0, 0, 1, 1};
  checkDedup(twoByTwo, spec, MoeRouting::Uniform);
  checkDedup(twoByTwo, spec, MoeRouting::Skewed);
  // Expert 1 gets no token; token 0 of every rank names experts 4, 5 and 6: ranks 2 and 3 of node 1 (whole node).
  const std::vector<int32_t> rank = {4, 5, 6, 0, 2, 3, 7, 6, 5, 0, 3, 4, 2, 7, 0, 6, 4, 2};
  const MoeIds given(4, rank);
  checkDedup(twoByTwo, spec, MoeRouting::Given, given);
  // The per-rank volume would be larger: token 0 alone names 2 ranks of node 1.
  const Schedule s = generateMoeDispatchGemm(spec, twoByTwo);
  CHECK(s.info.algo == "node-dedup");
  // Uneven nodes of 2, 1 and 3 ranks: relays wrap (node 1's one rank relays for both ranks of node 0).
  const std::vector<uint32_t> uneven{0, 0, 1, 2, 2, 2};
  spec.tokens = 5;
  checkDedup(uneven, spec, MoeRouting::Uniform);
  checkDedup(uneven, spec, MoeRouting::Skewed);
  MoeIds skewed(6, std::vector<int32_t>(uint64_t{5} * 3));
  for (uint32_t r = 0; r < 6; ++r)
    for (uint32_t t = 0; t < 5; ++t)
      for (uint32_t k = 0; k < 3; ++k)  // every token to experts on ranks 3, 4 and 5 (node 2), rank 2's none
        skewed[r][t * 3 + k] = static_cast<int32_t>(6 + 2 * k + (t + r) % 2);
  checkDedup(uneven, spec, MoeRouting::Given, skewed);
  const Schedule u = generateMoeDispatchGemm(spec, uneven);
  REQUIRE(u.lanes[2].size() == 4);  // rank 2, node 1's only rank, relays for every other rank
  uint64_t relayRoutes = 0;
  for (const Step& st : u.lanes[2][3].steps) relayRoutes += st.kind == StepKind::Route;
  CHECK(relayRoutes == 5);
  // Rank 0 relays for ranks 2 and 3 (local index 0) and 5 (local index 2, wrapping on node 0's 2 ranks).
  REQUIRE(u.lanes[0].size() == 4);
  relayRoutes = 0;
  for (const Step& st : u.lanes[0][3].steps) relayRoutes += st.kind == StepKind::Route;
  CHECK(relayRoutes == 3);
}
