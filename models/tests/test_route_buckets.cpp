// A route's lists other than the experts (route.hpp, RouteBuckets): per node, each token once (DeepEP's per-node
// deduplication), and a relay's route over the tokens that arrived, restricted to its node's experts; their JSON and
// packed forms, the validator's and the executor's refusals and their price.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/schedule/validate.hpp"

using namespace mk;

namespace {

constexpr uint32_t kTokens = 4, kTopk = 2, kExperts = 6, kCapacity = 4;

/// 3 ranks on uneven nodes {0}, {1, 2}, experts 0-1 on rank 0, 2-3 on rank 1, 4-5 on rank 2. Rank 0 routes its ids
/// to node lists; rank 1 routes the first n[0] of its ids (an extent with a source) to its node's experts.
Schedule bucketSchedule() {
  Schedule s;
  s.nRanks = 3;
  s.nodeOf = {0, 1, 1};
  s.buffers = {{"ids", DType::Int32, BufferKind::Input, std::vector<uint64_t>(3, kTokens * kTopk)},
               {"layout", DType::Int32, BufferKind::Scratch, std::vector<uint64_t>(3, kExperts * (kCapacity + 1))},
               {"n", DType::Int32, BufferKind::Input, std::vector<uint64_t>(3, 1)}};
  ExtentDecl arrived{"arrived", kTokens, 2.0};
  arrived.sourceBuffer = 2;
  arrived.sourceElement = 0;
  s.extents = {arrived};
  Step route;
  route.kind = StepKind::Route;
  route.count = kTokens * kTopk;
  route.aux = kTopk;
  route.value = routeValue(kExperts, kCapacity);
  s.lanes.resize(3);
  for (uint32_t r : {0u, 1u}) {
    route.dst = bufRef(r, 1, 0);
    route.a = bufRef(r, 0, 0);
    route.flags = r == 0 ? kStepRouteNodes : kStepRouteOwnNode;
    route.extent = r == 0 ? kNoExtent : 0;
    s.lanes[r].push_back(Lane{LaneRole::Intra, 1, {route}});
  }
  fillCostAttributes(s);
  return s;
}

/// Token 0 names experts 3 and 4 (ranks 1 and 2: both on node 1), token 1 experts 0 and 1 (node 0 only), token 2
/// experts 5 and 0, token 3 experts 1 and 2; rank 1 has received 3 of them.
HostMemory bucketInputs(const Schedule& s) {
  HostMemory mem = HostMemory::allocate(s);
  const int32_t ids[kTokens * kTopk] = {3, 4, 0, 1, 5, 0, 1, 2};
  for (uint32_t r = 0; r < 3; ++r) {
    std::memcpy(mem.as<int32_t>(r, 0), ids, sizeof ids);
    mem.as<int32_t>(r, 2)[0] = 3;
  }
  return mem;
}

/// The layout as counts then lists, -1 past each count.
std::vector<int32_t> layoutOf(const std::vector<std::vector<int32_t>>& lists) {
  std::vector<int32_t> out(kExperts * (kCapacity + 1), -1);
  for (uint32_t e = 0; e < kExperts; ++e) {
    out[e] = static_cast<int32_t>(lists[e].size());
    for (std::size_t i = 0; i < lists[e].size(); ++i) out[kExperts + e * kCapacity + i] = lists[e][i];
  }
  return out;
}

std::vector<int32_t> layoutAt(HostMemory& mem, uint32_t rank) {
  const int32_t* p = mem.as<int32_t>(rank, 1);
  return {p, p + kExperts * (kCapacity + 1)};
}

}  // namespace

TEST_CASE("route buckets: node lists take a token once, a relay's lists its node's experts of the arrived tokens") {
  const Schedule s = bucketSchedule();
  CHECK(validate(s).empty());
  HostMemory mem = bucketInputs(s);
  execute(s, mem);
  // Node 1's list has token 0 once although two of its experts (on two ranks) are named by it.
  CHECK(layoutAt(mem, 0) == layoutOf({{1, 2, 3}, {0, 2, 3}, {}, {}, {}, {}}));
  // Rank 1 (node 1) lists experts 2-5 of tokens 0-2 only: token 3's expert 2 has not arrived, 0 and 1 are skipped.
  CHECK(layoutAt(mem, 1) == layoutOf({{}, {}, {}, {0}, {0}, {2}}));
  // JSON and packed forms keep the lists and the extent, and run the same.
  const std::string json = scheduleToJson(s);
  CHECK(json.find("\"buckets\":\"nodes\"") != std::string::npos);
  CHECK(json.find("\"buckets\":\"own-node\"") != std::string::npos);
  CHECK(json.find("\"extent\":\"arrived\"") != std::string::npos);
  const Schedule back = scheduleFromJson(json);
  CHECK(scheduleToJson(back) == json);
  const Schedule unpacked = unpack(pack(s));
  CHECK(pack(unpacked) == pack(s));
  for (const Schedule* other : {&back, &unpacked}) {
    HostMemory m = bucketInputs(s);
    execute(*other, m);
    CHECK(m.bytes == mem.bytes);
  }
  // Priced at the extent's expected 2 of 4 tokens: half the ids, the whole layout.
  CHECK(s.lanes[1][0].steps[0].bytes == (kTokens * kTopk / 2 + kExperts * (kCapacity + 1)) * 4);
  CHECK(s.lanes[0][0].steps[0].bytes == (kTokens * kTopk + kExperts * (kCapacity + 1)) * 4);
}

TEST_CASE("route buckets: uneven experts, tokens split by an extent and unknown buckets are refused") {
  Schedule s = bucketSchedule();
  s.lanes[0][0].steps[0].flags |= kStepRouteOwnNode;
  CHECK(validateAll(s).front().message.find("kStepRouteNodes and kStepRouteOwnNode are both set") != std::string::npos);
  s = bucketSchedule();
  s.extents[0].bound = kTokens * kTopk;  // 1 id per unit of extent, not a whole token
  CHECK(validateAll(s).front().message.find("count per unit of extent 'arrived' is not a whole number of tokens") !=
        std::string::npos);
  s = bucketSchedule();
  for (uint32_t r : {0u, 1u}) s.lanes[r][0].steps[0].value = routeValue(5, kCapacity);
  s.buffers[1].count.assign(3, 5 * (kCapacity + 1));
  const auto issues = validateAll(s);
  REQUIRE(!issues.empty());
  CHECK(issues.front().message.find("experts must be a multiple of nRanks (experts 5, 3 ranks)") != std::string::npos);
  HostMemory mem = bucketInputs(s);
  test::expectError([&] { execute(s, mem); }, ErrorCode::InvalidSchedule, "experts must be a multiple of nRanks");
  // The relay's route reads its extent's source: a write of it on another lane, not ordered, is a race.
  s = bucketSchedule();
  Step write;
  write.kind = StepKind::Copy;
  write.count = 1;
  write.dst = bufRef(1, 2, 0);
  write.a = bufRef(1, 0, 0);
  s.lanes[1].push_back(Lane{LaneRole::Intra, 1, {write}});
  fillCostAttributes(s);
  REQUIRE(!validateAll(s).empty());
  CHECK(validateAll(s).front().message.find("race on rank 1 buffer 'n' elements [0, 1)") != std::string::npos);
  std::string json = scheduleToJson(bucketSchedule());
  json.replace(json.find("\"nodes\""), 7, "\"racks\"");
  test::expectError([&] { scheduleFromJson(json); }, ErrorCode::ParseError,
                    "buckets: unknown buckets 'racks' (expected experts, nodes, own-node)");
}
