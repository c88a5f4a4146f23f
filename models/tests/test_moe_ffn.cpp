// The moe-ffn generator (mk/algorithms/moe.hpp) on the CPU executor against the double reference of verifyMoeFfn:
// placements of one rank up to uneven nodes with both returns across nodes, every topk, uniform, skewed and given
// routings, the packed form, a dropped step caught, the spec's and the combine's refusals, and the cost attributes.
// The returns' network bytes and their choice by price: test_moe_ffn_return.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "layout.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"
#include "moe_ffn_case.hpp"

using namespace mk;

using test::checkVerifies;
using test::ffnSpec;

TEST_CASE("moe-ffn: every placement, E 1..3 and topk 1..min(4, R x E) match the reference") {
  const std::vector<std::vector<uint32_t>> placements = {{0}, {0, 0}, {0, 0, 0, 0}, {0, 0, 1, 1}, {0, 0, 0, 1, 1}};
  uint64_t seed = 1;
  for (const auto& nodeOf : placements)
    for (uint32_t E = 1; E <= 3; ++E) {
      const auto R = static_cast<uint32_t>(nodeOf.size());
      for (uint32_t K = 1; K <= std::min<uint32_t>(4, R * E); ++K)
        for (MoeCombineReturn ret : {MoeCombineReturn::PerBlock, MoeCombineReturn::NodeSum}) {
          const uint32_t T = 3 + 2 * ((K + E) % 3);  // odd token counts: 3, 5, 7
          const MoeFfnSpec spec = ffnSpec(E, K, T, ret);
          const Schedule s = generateMoeFfn(spec, nodeOf);
          INFO("ranks " << R << " nodes " << nodeOf.back() + 1 << " E " << E << " topk " << K << " tokens " << T
                        << " return " << toString(ret));
          REQUIRE(validate(s).empty());
          CHECK(s.info.op == "moe-ffn");
          // Summed across nodes: one more per (source, other node), on the source's relay there.
          const uint32_t nodes = nodeOf.back() + 1;
          const bool summed = nodes > 1 && ret == MoeCombineReturn::NodeSum;
          CHECK(test::countKind(s, StepKind::Combine) == (summed ? R * nodes : R));
          CHECK(s.info.algo == (nodes == 1 ? "direct" : summed ? "node-dedup-combine" : "node-dedup"));
          CHECK(test::countKind(s, StepKind::GroupedGemm) == 2 * R * R);
          checkVerifies(s, spec, ++seed, MoeRouting::Uniform);
          checkVerifies(s, spec, ++seed, MoeRouting::Skewed);  // one expert gets every token, the others none
        }
    }
}

TEST_CASE("moe-ffn: the packed form runs the same, older images are refused") {
  const MoeFfnSpec spec = ffnSpec(2, 2, 5);
  const Schedule s = generateMoeFfn(spec, {0, 0, 1});
  const std::vector<uint8_t> image = pack(s);
  Schedule unpacked = unpack(image);
  CHECK(pack(unpacked) == image);
  for (std::size_t b = 0; b < s.buffers.size(); ++b) unpacked.buffers[b].name = s.buffers[b].name;
  for (std::size_t e = 0; e < s.extents.size(); ++e) unpacked.extents[e].name = s.extents[e].name;
  checkVerifies(unpacked, spec, 3, MoeRouting::Uniform);
  uint64_t gated = 0;
  for (const auto& lanes : unpacked.lanes)
    for (const Lane& lane : lanes)
      for (const Step& st : lane.steps) gated += st.kind == StepKind::GroupedGemm && (st.flags & kStepSwiGLU);
  CHECK(gated == 3 * 3);
  // JSON too, the epilogue flag and the combine's sizes by name.
  const std::string json = scheduleToJson(s);
  CHECK(json.find("\"swiglu\":true") != std::string::npos);
  CHECK(json.find("\"kind\":\"combine\",\"count\":80,\"topk\":2,\"experts\":6,\"row\":16") != std::string::npos);
  // Across nodes the relays' sums and the tokens' ranks' final combines name their buckets (route.hpp).
  CHECK(json.find("\"topk\":2,\"experts\":6,\"row\":16,\"buckets\":\"own-node\"") != std::string::npos);
  CHECK(json.find("\"topk\":2,\"experts\":6,\"row\":16,\"buckets\":\"nodes\"") != std::string::npos);
  CHECK(scheduleToJson(scheduleFromJson(json)) == json);
  std::vector<uint8_t> old = image;
  const uint32_t four = 4;
  std::memcpy(old.data() + sizeof(uint32_t), &four, sizeof four);  // the header's version, after the magic
  test::expectError([&] { unpack(old); }, ErrorCode::ParseError, "unsupported version 4");
}

TEST_CASE("moe-ffn: a dropped step is caught by the check, bad input data by the route and the combine") {
  const MoeFfnSpec spec = ffnSpec(2, 2, 5);
  const Schedule s = generateMoeFfn(spec, {0, 0});
  const MoeIds given = {{0, 1, 2, 3, 0, 2, 1, 3, 0, 3}, {3, 2, 3, 0, 3, 1, 2, 0, 3, 2}};  // expert 1: 3 tokens
  checkVerifies(s, spec, 8, MoeRouting::Given, given);
  // Without rank 1's second grouped GEMM for source 0, the rows rank 0's tokens get back from rank 1 are stale.
  Schedule dropped = s;
  std::vector<Step>& compute = dropped.lanes[1][1].steps;
  REQUIRE(dropped.lanes[1][1].role == LaneRole::Compute);
  uint32_t seen = 0;
  for (auto it = compute.begin(); it != compute.end(); ++it)
    if (it->kind == StepKind::GroupedGemm && ++seen == 2) {
      compute.erase(it);
      break;
    }
  REQUIRE(seen == 2);
  const VerifyResult v = verifyMoeFfn(dropped, spec, 8, MoeRouting::Given, given);
  CHECK_FALSE(v.ok);
  CHECK(v.detail.find("rank 0 y[") != std::string::npos);
  // Ids out of range are refused by the route; a NaN weight by the combine, before it writes "y".
  test::expectError(
      [&] {
        verifyMoeFfn(s, spec, 8, MoeRouting::Given, {given[0], std::vector<int32_t>(10, 4)});
      },
      ErrorCode::InvalidArgument, "names expert 4");
  HostMemory mem = HostMemory::allocate(s);
  const int ids = s.bufferIndex("ids"), weights = s.bufferIndex("weights"), y = s.bufferIndex("y");
  for (uint32_t r = 0; r < 2; ++r) {
    std::memcpy(mem.as<int32_t>(r, static_cast<uint16_t>(ids)), given[r].data(), 10 * sizeof(int32_t));
    for (uint32_t i = 0; i < 10; ++i) mem.as<float>(r, static_cast<uint16_t>(weights))[i] = 0.5f;
  }
  mem.as<float>(1, static_cast<uint16_t>(weights))[7] = std::numeric_limits<float>::quiet_NaN();
  test::expectError([&] { execute(s, mem); }, ErrorCode::InvalidArgument,
                    {"rank 1 token 3 k 1", "weight nan is not finite (weights)"});
  for (uint64_t i = 0; i < 5 * 16; ++i) CHECK(mem.as<float>(1, static_cast<uint16_t>(y))[i] == 0.0f);
}

TEST_CASE("moe-ffn: a routing over the capacity is refused at the route") {
  for (MoeCombineReturn ret : {MoeCombineReturn::PerBlock, MoeCombineReturn::NodeSum}) {
    MoeFfnSpec spec = ffnSpec(2, 1, 5, ret);
    spec.capacity = 3;
    const Schedule s = generateMoeFfn(spec, {0, 1});
    checkVerifies(s, spec, 1, MoeRouting::Given, {{0, 1, 2, 3, 0}, {3, 2, 1, 0, 3}});
    test::expectError([&] { verifyMoeFfn(s, spec, 1, MoeRouting::Skewed); }, ErrorCode::InvalidArgument,
                      "routes 5 tokens to expert");
  }
}

TEST_CASE("moe-ffn: bad specs are refused naming the field") {
  auto refused = [](auto edit, uint32_t ranks, const char* part) {
    MoeFfnSpec spec = ffnSpec(2, 2, 4);
    edit(spec);
    test::expectError([&] { generateMoeFfn(spec, std::vector<uint32_t>(ranks, 0)); }, ErrorCode::InvalidArgument,
                      {"moe-ffn: ", part});
  };
  refused([](MoeFfnSpec& s) { s.topk = 7; }, 3, "topk 7 is larger than the experts in total, 6");
  refused([](MoeFfnSpec& s) { s.experts = 0; }, 3, "experts must be >= 1 (got 0)");
  refused([](MoeFfnSpec& s) { s.tokens = 0; }, 3, "tokens must be >= 1 (got 0)");
  refused([](MoeFfnSpec& s) { s.topk = 0; }, 3, "topk must be >= 1 (got 0)");
  refused([](MoeFfnSpec& s) { s.ffn = 0; }, 3, "ffn must be >= 1 (got 0)");
  refused([](MoeFfnSpec& s) { s.hidden = 0; }, 3, "hidden must be >= 1 (got 0)");
  refused([](MoeFfnSpec& s) { s.ffn = 12; }, 3, "ffn 12 is not a multiple of 8");
  refused([](MoeFfnSpec& s) { s.hidden = 12; }, 3, "hidden 12 is not a multiple of 8");
  refused([](MoeFfnSpec& s) { s.capacity = 0; }, 3, "capacity must be >= 1 (got 0)");
  refused([](MoeFfnSpec& s) { s.capacity = 5; }, 3, "capacity 5 is larger than tokens 4");
  refused([](MoeFfnSpec& s) { s.imbalance = 0.5; }, 3, "imbalance 0.5");
  refused([](MoeFfnSpec&) {}, 0, "no ranks");
  refused([](MoeFfnSpec& s) { s.combineReturn = static_cast<MoeCombineReturn>(7); }, 3,
          "combineReturn 7 is not one of auto, per-block, node-sum");
  test::expectError(
      [&] {
        generateMoeFfn(ffnSpec(2, 2, 4), {0, 7});
      },
      ErrorCode::InvalidArgument, "moe-ffn: node id 7 is not below the experts in total, 4");
}

TEST_CASE("moe-ffn: the validator refuses a SwiGLU epilogue it cannot run and a combine past its operands") {
  const MoeFfnSpec spec = ffnSpec(1, 1, 3);
  const Schedule s = generateMoeFfn(spec, {0});
  auto issues = [](const Schedule& bad) {
    std::string all;
    for (const ValidationIssue& issue : validateAll(bad)) all += issue.message + "\n";
    return all;
  };
  Schedule accumulate = s;
  for (auto& lane : accumulate.lanes[0])
    for (Step& st : lane.steps)
      if (st.kind == StepKind::GroupedGemm && (st.flags & kStepSwiGLU)) st.flags |= kStepAccumulate;
  CHECK(issues(accumulate).find("swiglu: gemms[0] needs an even n") != std::string::npos);
  Schedule plain = s;
  for (auto& lane : plain.lanes[0])
    for (Step& st : lane.steps)
      if (st.kind == StepKind::GroupedGemm && (st.flags & kStepSwiGLU)) st.flags &= ~kStepSwiGLU;
  CHECK(issues(plain).find("gemms[0]: ldc 8 < n 16 (C is row-major m x n)") != std::string::npos);
  Schedule combine = s;
  for (auto& lane : combine.lanes[0])
    for (Step& st : lane.steps)
      if (st.kind == StepKind::Combine) st.value = combineValue(2, 16);  // one expert block more than "back" holds
  CHECK(issues(combine).find("a (weights, rows)") != std::string::npos);
}

TEST_CASE("moe-ffn: extents price the FFN and the return at the routing model's expected rows") {
  MoeFfnSpec spec = ffnSpec(2, 2, 9);
  spec.hidden = 64;
  spec.ffn = 32;
  const Profile p = defaultProfile(topologyPreset("h200x2"));
  double previousUs = 0;
  for (double imbalance : {1.0, 3.0}) {
    spec.imbalance = imbalance;
    const Schedule s = generateMoeFfn(spec, {0, 0, 1, 1});
    // A node's partial sums: a row per token naming one of its 4 experts of 8 (topk 2), 1 - (4 x 3) / (8 x 7).
    const double rows = std::min(9.0, 9.0 * (1.0 - 12.0 / 56.0) * imbalance);
    uint64_t returned = 0;
    for (const Lane& lane : s.lanes[0])
      for (const Step& st : lane.steps)
        if (st.kind == StepKind::ProxyPut && st.dst.buffer == s.bufferIndex("back")) {
          CHECK(double(st.bytes) == doctest::Approx(rows * 64 * 4).epsilon(1e-3));  // whole elements
          ++returned;
        }
    CHECK(returned == 1);  // rank 0 relays for rank 2 (local index 0) only
    const double us = simulateUncontended(s, p).totalUs;
    CHECK(us > previousUs);
    previousUs = us;
  }
}

TEST_CASE("combine: each token's rows found from the ids, weighted and summed, bad ids and positions refused") {
  // 3 tokens, topk 2, 2 experts, rows of 2: "back" holds the weights, then each expert's block of 3 rows.
  const uint32_t T = 3, K = 2, G = 2, H = 2;
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.buffers = {{"y", DType::Float32, BufferKind::Output, {T * H}},
               {"back", DType::Float32, BufferKind::Input, {T * K + G * T * H}},
               {"ids", DType::Int32, BufferKind::Input, {T * K}}};
  Step c;
  c.kind = StepKind::Combine;
  c.count = T * H;
  c.aux = K;
  c.value = combineValue(G, H);
  c.dst = bufRef(0, 0, 0);
  c.a = bufRef(0, 1, 0);
  c.b = bufRef(0, 2, 0);
  s.lanes = {{Lane{LaneRole::Compute, 1, {c}}}};
  fillCostAttributes(s);
  REQUIRE(validate(s).empty());
  CHECK(s.lanes[0][0].steps[0].flops == 2.0 * T * K * H);
  auto run = [&](const std::vector<int32_t>& ids, HostMemory& mem) {
    std::copy(ids.begin(), ids.end(), mem.as<int32_t>(0, 2));
    float* back = mem.as<float>(0, 1);
    for (uint32_t i = 0; i < T * K + G * T * H; ++i) back[i] = 0.25f * float(i % 7) - 0.5f;
    execute(s, mem);
  };
  const std::vector<int32_t> ids = {1, 0, 1, 1, 0, 0};  // token 1 names expert 1 twice: both rows are summed
  HostMemory mem = HostMemory::allocate(s);
  run(ids, mem);
  const float* back = mem.as<float>(0, 1);
  std::vector<uint32_t> seen(G, 0);
  for (uint32_t t = 0; t < T; ++t) {
    double want[H] = {0, 0};
    for (uint32_t k = 0; k < K; ++k) {
      const auto j = static_cast<uint32_t>(ids[t * K + k]);
      const uint32_t row = T * K + (j * T + seen[j]++) * H;
      for (uint32_t h = 0; h < H; ++h) want[h] += double(back[t * K + k]) * back[row + h];
    }
    for (uint32_t h = 0; h < H; ++h) CHECK(mem.as<float>(0, 0)[t * H + h] == static_cast<float>(want[h]));
  }
  HostMemory bad = HostMemory::allocate(s);
  test::expectError(
      [&] {
        run({1, 0, 1, 1, 0, 1}, bad);
      },
      ErrorCode::InvalidArgument, {"token 2 k 1: expert 1 is named more than 3 times"});
  test::expectError(
      [&] {
        run({1, 0, 2, 1, 0, 1}, bad);
      },
      ErrorCode::InvalidArgument, {"token 1 k 0 names expert 2, outside [0, 2) (experts)"});
  for (uint32_t i = 0; i < T * H; ++i) CHECK(bad.as<float>(0, 0)[i] == 0.0f);  // nothing written
  // JSON round trip of the step and the validator's refusal of a wrong dtype.
  CHECK(scheduleToJson(scheduleFromJson(scheduleToJson(s))) == scheduleToJson(s));
  Schedule wrong = s;
  wrong.buffers[1].dtype = DType::BFloat16;
  std::string all;
  for (const ValidationIssue& issue : validateAll(wrong)) all += issue.message;
  CHECK(all.find("a combine reads float32 weights and rows") != std::string::npos);
  // Buckets per node: one kind at a time; the extent's units whole tokens.
  Schedule both = s;
  both.lanes[0][0].steps[0].flags = kStepRouteNodes | kStepRouteOwnNode;
  all.clear();
  for (const ValidationIssue& issue : validateAll(both)) all += issue.message;
  CHECK(all.find("kStepRouteNodes and kStepRouteOwnNode are both set") != std::string::npos);
  Schedule ragged = s;
  ragged.extents.push_back(ExtentDecl{"half", 2, 2.0});  // count 6 = 2 x 3: 3 elements a unit, not whole rows of 2
  ragged.lanes[0][0].steps[0].extent = 0;
  all.clear();
  for (const ValidationIssue& issue : validateAll(ragged)) all += issue.message;
  CHECK(all.find("count per unit of extent 'half' is not a whole number of tokens") != std::string::npos);
}

TEST_CASE("swiglu: a grouped GEMM with the epilogue writes silu(gate) x up of each interleaved column pair") {
  const uint32_t m = 3, n = 6, k = 8;  // C: m x n / 2, ldc 4 (a column of padding left untouched)
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.buffers = {{"a", DType::BFloat16, BufferKind::Input, {m * k}},
               {"b", DType::BFloat16, BufferKind::Input, {k * n}},
               {"c", DType::Float32, BufferKind::Output, {m * 4}}};
  s.gemms = {GemmShape{m, n, k, k, n, 4}};
  Step g;
  g.kind = StepKind::GroupedGemm;
  g.count = 1;
  g.flags = kStepSwiGLU;
  g.dst = bufRef(0, 2, 0);
  g.a = bufRef(0, 0, 0);
  g.b = bufRef(0, 1, 0);
  s.lanes = {{Lane{LaneRole::Compute, 1, {g}}}};
  fillCostAttributes(s);
  REQUIRE(validate(s).empty());
  CHECK(s.lanes[0][0].steps[0].bytes == (m * k + k * n) * 2 + m * n / 2 * 4);
  HostMemory mem = HostMemory::allocate(s);
  for (uint32_t i = 0; i < m * k; ++i) mem.as<uint16_t>(0, 0)[i] = floatToBf16(0.125f * float(int(i % 9) - 4));
  for (uint32_t i = 0; i < k * n; ++i) mem.as<uint16_t>(0, 1)[i] = floatToBf16(0.25f * float(int(i % 7) - 3));
  for (uint32_t i = 0; i < m * 4; ++i) mem.as<float>(0, 2)[i] = 7.0f;
  execute(s, mem);
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t f = 0; f < n / 2; ++f) {
      double gate = 0, up = 0;
      for (uint32_t kk = 0; kk < k; ++kk) {
        const double x = bf16ToFloat(mem.as<uint16_t>(0, 0)[i * k + kk]);
        gate += x * bf16ToFloat(mem.as<uint16_t>(0, 1)[kk * n + 2 * f]);
        up += x * bf16ToFloat(mem.as<uint16_t>(0, 1)[kk * n + 2 * f + 1]);
      }
      const double want = gate / (1 + std::exp(-gate)) * up;
      CHECK(mem.as<float>(0, 2)[i * 4 + f] == doctest::Approx(want).epsilon(1e-6));
    }
    CHECK(mem.as<float>(0, 2)[i * 4 + 3] == 7.0f);  // past n / 2: not written
  }
  Schedule odd = s;  // n odd: no pairs; the shape then needs ldc >= n / 2 only for this step
  odd.gemms[0].n = 5;
  odd.gemms[0].ldb = 5;
  std::string all;
  for (const ValidationIssue& issue : validateAll(odd)) all += issue.message;
  CHECK(all.find("swiglu: gemms[0] needs an even n") != std::string::npos);
  Schedule plain = s;  // the epilogue on a plain gemm step is refused
  plain.lanes[0][0].steps[0].kind = StepKind::Gemm;
  all.clear();
  for (const ValidationIssue& issue : validateAll(plain)) all += issue.message;
  CHECK(all.find("swiglu: only a grouped-gemm step carries the SwiGLU epilogue") != std::string::npos);
}
