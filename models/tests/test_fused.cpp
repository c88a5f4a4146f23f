// The fused operators: generation, verification on the CPU executor, the closed form against the uncontended
// timeline, the split choice, and bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/exec/verify_fused.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;

namespace {

using test::expectError;

std::vector<uint32_t> layout(uint32_t nRanks, uint32_t perNode) {
  std::vector<uint32_t> nodeOf(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) nodeOf[r] = r / perNode;
  return nodeOf;
}

/// Round, distinct prices (the CTA split on), so that a formula that forgets a term cannot agree by accident.
Profile fusedProfile() {
  Profile p;
  p.source = "test";
  p.nvlink = LinkCost{0.7, 300};
  p.network = LinkCost{3.1, 45};
  p.local = LinkCost{0.4, 2000};
  p.reduceGBs = 1100;
  p.flagUs = 0.6;
  p.localFlagUs = 0.3;
  p.dispatchUs = 2.5;
  p.proxyUs = 1.9;
  p.gemmTflops = 600;
  p.sms = 100;
  p.ctaGBs = 20;
  return p;
}

/// Every communication lane's CTAs, and every rank's lanes summing to `ctas`.
uint32_t laneCtas(const Schedule& s, uint32_t rank) {
  uint32_t sum = 0;
  for (const Lane& l : s.lanes[rank]) sum += l.ctas;
  return sum;
}

}  // namespace

TEST_CASE("fused: names parse back and unknown ones are refused with the list") {
  for (FusedOp op : fusedOps()) CHECK(parseFusedOp(toString(op)) == op);
  CHECK(parseFusedOp("gemm_rs") == FusedOp::GemmReduceScatter);
  CHECK_FALSE(parseFusedOp("gemm-rx"));
  expectError([] { requireFusedOp("gemm-rx", "--op"); }, ErrorCode::InvalidArgument,
              {"unknown --op 'gemm-rx'", "gemm-rs, ag-gemm, gemm-ar"});
  for (TileOrder o : {TileOrder::Auto, TileOrder::OwnFirst, TileOrder::OwnLast, TileOrder::Interleaved})
    CHECK(parseTileOrder(toString(o)) == o);
  CHECK(parseMatrixLayout("col") == MatrixLayout::ColMajor);
  CHECK(parseMatrixLayout("row") == MatrixLayout::RowMajor);
  CHECK_FALSE(parseMatrixLayout("diagonal"));
}

TEST_CASE("fused: shards split rows evenly and k or n in whole units of 8") {
  const auto rs =
      fusedShards(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 10, 16, 40}, 3);  // 5 units of 8 over 3 ranks
  CHECK(rs[0].rows == 4);
  CHECK(rs[2].rowBegin == 7);
  CHECK(rs[0].kLen == 16);
  CHECK(rs[1].kBegin == 16);
  CHECK(rs[2].kLen == 8);
  CHECK(rs[1].cols == 16);
  const auto ag = fusedShards(FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 10, 40, 16}, 3);
  CHECK(ag[0].cols == 16);
  CHECK(ag[2].colBegin == 32);
  CHECK(ag[2].kLen == 16);
}

TEST_CASE("fused: bad shapes are refused naming the dimension and what it must divide by") {
  auto check = [](FusedSpec s, uint32_t p, ErrorCode code, std::vector<std::string> parts) {
    expectError([&] { validateFusedSpec(s, p); }, code, parts);
    expectError([&] { generate(s, layout(p, p), FusedOptions{16, TileOrder::OwnFirst, 8, 4, 1}); }, code, parts);
  };
  check(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 64, 64, 1001}, 2, ErrorCode::InvalidArgument,
        {"gemm-rs", "K = 1001 is not a multiple of 8", "TMA", "K % 8 = 1"});
  check(FusedSpec{FusedOp::GemmAllReduce, DType::BFloat16, 64, 1001, 64}, 2, ErrorCode::InvalidArgument,
        {"N = 1001 is not a multiple of 8"});
  check(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 64, 64, 24}, 4, ErrorCode::InvalidArgument,
        {"K = 24", "3 units for 4 ranks", "at least 8 x ranks = 32"});
  check(FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 64, 16, 64}, 4, ErrorCode::InvalidArgument,
        {"N = 16", "at least 8 x ranks = 32"});
  check(FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 3, 64, 64}, 4, ErrorCode::InvalidArgument,
        {"ag-gemm: M = 3", "4 ranks a row block of A"});
  check(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 0, 64, 64}, 1, ErrorCode::InvalidArgument,
        {"M must be >= 1 (got 0)"});
  check(FusedSpec{FusedOp::GemmReduceScatter, DType::Float32, 64, 64, 64}, 2, ErrorCode::Unsupported,
        {"dtype float32 is not supported", "16-bit inputs"});
  check(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, uint64_t{1} << 33, 64, 64}, 2,
        ErrorCode::InvalidArgument, {"exceeds 2^32 - 1"});
}

TEST_CASE("fused: a split that leaves a lane without CTAs or options left open are refused") {
  const FusedSpec s = FusedSpec{FusedOp::GemmAllReduce, DType::BFloat16, 64, 64, 64};
  // gemm-ar on 2 nodes of 2: send over NVLink, send over the network, reduce.
  expectError(
      [&] {
        generate(s, layout(4, 2), FusedOptions{16, TileOrder::OwnFirst, 16, 2, 1});
      },
      ErrorCode::InvalidArgument,
      {"leaves a communication lane without CTAs", "commCtas 2", "3 communication lanes", "send over the network",
       "commCtas must be at least 3"});
  expectError(
      [&] {
        generate(s, layout(4, 2), FusedOptions{16, TileOrder::OwnFirst, 16, 16, 1});
      },
      ErrorCode::InvalidArgument, {"leaves the compute lane without CTAs", "commCtas 16 of ctas 16"});
  expectError(
      [&] {
        generate(s, layout(2, 2), FusedOptions{0, TileOrder::OwnFirst, 16, 4, 1});
      },
      ErrorCode::InvalidArgument, {"tileRows must be >= 1"});
  expectError(
      [&] {
        generate(s, layout(2, 2), FusedOptions{16, TileOrder::Auto, 16, 4, 1});
      },
      ErrorCode::InvalidArgument, {"order must be own-first, own-last or interleaved", "planFused"});
  // One rank: nothing to split, the compute lane gets every CTA.
  const Schedule one = generate(s, {0}, FusedOptions{16, TileOrder::OwnFirst, 16, 0, 1});
  REQUIRE(one.lanes[0].size() == 1);
  CHECK(one.lanes[0][0].ctas == 16);
}

TEST_CASE("fused: the split is Lane::ctas: compute gets the rest, network lanes one each") {
  const FusedSpec s = FusedSpec{FusedOp::GemmAllReduce, DType::BFloat16, 64, 64, 64};
  const Schedule sch = generate(s, layout(6, 3), FusedOptions{16, TileOrder::OwnLast, 100, 21, 2});
  for (uint32_t r = 0; r < sch.nRanks; ++r) {
    CAPTURE(r);
    CHECK(laneCtas(sch, r) == 100);
    std::vector<uint32_t> compute;
    for (const Lane& l : sch.lanes[r]) {
      if (l.role == LaneRole::Compute) compute.push_back(l.ctas);
      if (l.role == LaneRole::InterSend) CHECK(l.ctas == 1);
      CHECK(l.ctas >= 1);
    }
    CHECK(compute == std::vector<uint32_t>{40, 39});  // 79 compute CTAs, the first lane one more
  }
  expectError(
      [&] {
        generate(s, layout(2, 2), FusedOptions{16, TileOrder::OwnFirst, 8, 6, 3});
      },
      ErrorCode::InvalidArgument, {"leaves a compute lane without CTAs: 2 compute CTAs for 3 compute lanes"});
  expectError(
      [&] {
        generate(s, layout(2, 2), FusedOptions{16, TileOrder::OwnFirst, 8, 6, 0});
      },
      ErrorCode::InvalidArgument, {"computeLanes must be >= 1"});
}

TEST_CASE("fused: every op verifies on 1 to 8 ranks, one and two nodes, odd shapes, bf16 and fp16") {
  uint64_t seed = 0xf05ed;
  int cases = 0;
  for (FusedOp op : fusedOps())
    for (uint32_t p : {1u, 2u, 3u, 4u, 5u, 8u})
      for (uint32_t perNode : {p, (p + 1) / 2}) {
        if (perNode == p && p > 1 && p % 2 == 1 && op == FusedOp::AllGatherGemm) continue;  // keep the run short
        if (perNode != p && p < 2) continue;
        // Not multiples of the tile: M odd, N a multiple of 8 but not of 128, K split unevenly.
        const uint64_t m = 13 + 6 * p, n = 8 * (3 + p), k = 8 * (2 * p + 1);
        for (DType t : {DType::BFloat16, DType::Float16}) {
          const bool colB = (seed & 1) != 0;
          FusedSpec fs = FusedSpec{op, t, m, n, k};
          fs.layoutB = colB ? MatrixLayout::ColMajor : MatrixLayout::RowMajor;
          const TileOrder order =
              std::array<TileOrder, 3>{TileOrder::OwnFirst, TileOrder::OwnLast, TileOrder::Interleaved}[(seed / 2) % 3];
          const auto nodeOf = layout(p, perNode);
          const FusedOptions opt =
              FusedOptions{static_cast<uint32_t>(3 + p % 3), order, 12, 6, static_cast<uint32_t>(1 + seed % 3)};
          const std::string opName = toString(op);
          CAPTURE(opName);
          CAPTURE(p);
          CAPTURE(perNode);
          const std::string tName = toString(t);
          CAPTURE(tName);
          const std::string orderName = toString(order);
          CAPTURE(orderName);
          CAPTURE(colB);
          const Schedule s = generate(fs, nodeOf, opt);
          const auto issues = validateAll(s);
          REQUIRE_MESSAGE(issues.empty(), (issues.empty() ? std::string() : issues.front().message));
          for (InputKind kind : {InputKind::SmallIntegers, InputKind::Uniform}) {
            const VerifyResult v = verifyFused(s, fs, ++seed, kind);
            REQUIRE_MESSAGE(v.ok, v.detail);
            const uint64_t perRank = op == FusedOp::GemmAllReduce ? m * n : op == FusedOp::AllGatherGemm ? 0 : 0;
            if (op == FusedOp::GemmAllReduce) CHECK(v.checked == p * perRank);
            if (op != FusedOp::GemmAllReduce) CHECK(v.checked == m * n);
          }
          ++cases;
        }
      }
  CHECK(cases > 50);
}

TEST_CASE("fused: verification catches a missing partial, a wrong tile and a wrong rank's copy") {
  const FusedSpec fs = FusedSpec{FusedOp::GemmAllReduce, DType::BFloat16, 40, 32, 64};
  const Schedule good = generate(fs, layout(4, 4), FusedOptions{7, TileOrder::OwnFirst, 12, 6, 1});
  REQUIRE(verifyFused(good, fs, 7, InputKind::SmallIntegers).ok);
  // Drop one Reduce step of rank 1: a peer's partial is missing from one of its tiles.
  Schedule dropped = good;
  for (Lane& l : dropped.lanes[1]) {
    auto it = std::find_if(l.steps.begin(), l.steps.end(), [](const Step& st) { return st.kind == StepKind::Reduce; });
    if (it != l.steps.end()) {
      it->count = 1;  // still valid, but reduces one element instead of the tile
      break;
    }
  }
  const VerifyResult v = verifyFused(dropped, fs, 7, InputKind::SmallIntegers);
  CHECK_FALSE(v.ok);
  CHECK(v.detail.find("rank ") != std::string::npos);
  // A schedule of another op is named, not run.
  expectError(
      [&] {
        verifyFused(good, FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 40, 32, 64}, 1);
      },
      ErrorCode::InvalidArgument, {"verifyFused", "buffer 'c' of rank 0 has 1280 elements, expected 320"});
}

TEST_CASE("fused: every Gemm step is one the GPU engine takes (TMA alignment, own memory, 16-bit operands)") {
  for (FusedOp op : fusedOps())
    for (MatrixLayout lb : {MatrixLayout::RowMajor, MatrixLayout::ColMajor}) {
      FusedSpec fs = FusedSpec{op, DType::BFloat16, 301, 264, 520};
      fs.layoutB = lb;
      const Schedule s = generate(fs, layout(4, 2), FusedOptions{96, TileOrder::OwnFirst, 64, 8, 1});
      uint64_t gemms = 0;
      for (uint32_t r = 0; r < s.nRanks; ++r)
        for (const Lane& l : s.lanes[r])
          for (const Step& st : l.steps) {
            if (st.kind != StepKind::Gemm) continue;
            ++gemms;
            const GemmShape& g = s.gemms[st.aux];
            CHECK(g.lda % 8 == 0);
            CHECK(g.ldb % 8 == 0);
            CHECK(g.ldc % 8 == 0);
            for (const BufRef* ref : {&st.dst, &st.a, &st.b}) {
              CHECK(ref->rank == r);
              CHECK(ref->offset % 8 == 0);  // 16 bytes of a 16-bit type
              CHECK(s.buffers[ref->buffer].dtype == DType::BFloat16);
            }
            CHECK(((st.flags & kStepBColMajor) != 0) == (lb == MatrixLayout::ColMajor));
            CHECK((st.flags & kStepAccumulate) == 0);
          }
      CHECK(gemms == 4 * 4 * 1);  // a 96-row tile of each 76- or 75-row shard, on each of 4 ranks
    }
}

TEST_CASE("fused: the closed form equals the uncontended timeline, tiles even or not") {
  int cases = 0;
  for (FusedOp op : fusedOps())
    for (uint32_t p : {1u, 2u, 4u, 6u})
      for (uint32_t perNode : {p, std::max(1u, p / 2)}) {
        if (perNode != p && p < 2) continue;
        for (TileOrder order : {TileOrder::OwnFirst, TileOrder::OwnLast, TileOrder::Interleaved})
          for (int variant = 0; variant < 5; ++variant) {
            Profile prof = fusedProfile();
            if (variant == 1) {  // the split not modelled: comm lanes at link rate
              prof.sms = 0;
            } else if (variant == 2) {  // Put issue below alpha, user-buffer extras
              prof.putIssueUs = 0.2;
              prof.userPutUs = 0.35;
              prof.peerUserUs = 1.5;
            } else if (variant == 3) {  // NVLink-bound
              prof.nvlink.bwGBs = 40;
              prof.ctaGBs = 3;
            }
            // Even (every shard 3 tiles of 64 rows, k split evenly), or not (odd m, a short last tile, k uneven).
            const bool even = variant != 4;
            const uint64_t m = even ? uint64_t{p} * 3 * 64 : 61 * p + 3, n = 256, k = even ? 64 * p : 8 * (3 * p + 1);
            const FusedSpec fs = FusedSpec{op, DType::BFloat16, m, n, k};
            const uint32_t comm = 6 + static_cast<uint32_t>(variant);
            const FusedOptions opt =
                FusedOptions{even ? 64u : 27u, order, 40, comm, static_cast<uint32_t>(1 + variant % 3)};
            Topology topo = topologyPreset("dgx-h100", 1);
            topo.node.gpus = perNode;
            topo.nodes = (p + perNode - 1) / perNode;
            topo.node.nics = perNode;
            const std::string opName = toString(op);
            CAPTURE(opName);
            CAPTURE(p);
            CAPTURE(perNode);
            const std::string orderName = toString(order);
            CAPTURE(orderName);
            CAPTURE(variant);
            const FusedEstimate e = fusedClosedForm(fs, opt, topo, p, prof);
            const Schedule s = generate(fs, topo.layout(p), opt);
            const Timeline tl = simulateUncontended(s, prof);
            CHECK(e.totalUs == doctest::Approx(tl.totalUs).epsilon(1e-12));
            CHECK(e.totalUs >= e.dispatchUs + e.boundUs - 1e-9);
            ++cases;
          }
      }
  CHECK(cases >= 200);
}

TEST_CASE("fused: the bound follows the resource: compute-heavy is tensor, a slow link is nvlink or network") {
  const Topology one = topologyPreset("dgx-h100", 1);
  Profile prof = fusedProfile();
  const FusedSpec big = FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 4 * 512, 512, 8192};
  CHECK(fusedClosedForm(big, FusedOptions{128, TileOrder::OwnLast, 96, 8, 1}, one, 4, prof).bound ==
        FusedBound::Tensor);
  prof.nvlink.bwGBs = 5;
  const FusedSpec thin = FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 4 * 512, 512, 64};
  CHECK(fusedClosedForm(thin, FusedOptions{128, TileOrder::OwnLast, 96, 8, 1}, one, 4, prof).bound ==
        FusedBound::NvLink);
  const Topology two = topologyPreset("dgx-h100", 2);
  Profile slowNet = fusedProfile();
  slowNet.network.bwGBs = 1;
  const FusedEstimate e = fusedClosedForm(FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 16 * 256, 16 * 64, 512},
                                          FusedOptions{256, TileOrder::OwnFirst, 96, 8, 1}, two, 16, slowNet);
  CHECK(e.bound == FusedBound::Network);
  CHECK(e.networkUs > e.tensorUs);
}

TEST_CASE("fused: planFused takes the split and order with the lowest closed form and fills the defaults") {
  const Topology topo = topologyPreset("dgx-h100", 1);
  const Profile prof = defaultProfile(topo);
  for (FusedOp op : fusedOps()) {
    const FusedSpec fs = FusedSpec{op, DType::BFloat16, 4096, 4096, 2048};
    const FusedPlan plan = planFused(fs, FusedOptions{}, topo, 8, prof);
    const std::string opName = toString(op);
    CAPTURE(opName);
    CHECK(plan.ctasDefault);
    CHECK(plan.opt.ctas == topo.node.sms - kEngineReservedSms);
    CHECK(plan.tileDefault);
    CHECK(plan.opt.tileRows == fusedDefaultTileRows(fs, 8, plan.opt.ctas));
    CHECK(plan.splitByModel);
    CHECK(plan.orderByModel);
    CHECK(plan.opt.order != TileOrder::Auto);
    CHECK(plan.opt.commCtas >= 1);
    CHECK(plan.opt.commCtas < plan.opt.ctas);
    // No other split or order is better by more than the grid search can miss (it looks at every 4th split,
    // then around the best): every split of every order, within 1 %.
    double best = plan.estimate.totalUs;
    for (TileOrder order : {TileOrder::OwnFirst, TileOrder::OwnLast, TileOrder::Interleaved})
      for (uint32_t c = 3; c + plan.opt.computeLanes <= plan.opt.ctas; ++c) {
        FusedOptions o = plan.opt;
        o.order = order;
        o.commCtas = c;
        best = std::min(best, fusedClosedForm(fs, o, topo, 8, prof).totalUs);
      }
    CHECK(plan.estimate.totalUs <= best * 1.01);
    // An explicit split is kept.
    FusedOptions given;
    given.commCtas = 9;
    given.order = TileOrder::OwnLast;
    const FusedPlan kept = planFused(fs, given, topo, 8, prof);
    CHECK(kept.opt.commCtas == 9);
    CHECK(kept.opt.order == TileOrder::OwnLast);
    CHECK_FALSE(kept.splitByModel);
  }
  FusedOptions tooMany;
  tooMany.ctas = 500;
  expectError(
      [&] {
        planFused(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 64, 64, 64}, tooMany, topo, 2, prof);
      },
      ErrorCode::InvalidArgument, {"ctas 500 exceeds the GPU's 132 SMs"});
}

TEST_CASE("fused: thin shards get more compute lanes, each tile's SMs kept busy") {
  // ag-gemm on 8 ranks at m = n = 8192: a 1024 x 1024 tile has 64 engine tiles for ~118 compute CTAs.
  const Topology topo = topologyPreset("dgx-h100", 1);
  const Profile prof = defaultProfile(topo);
  const FusedSpec fs = FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 8192, 8192, 4096};
  const FusedPlan plan = planFused(fs, FusedOptions{}, topo, 8, prof);
  CHECK(plan.lanesByModel);
  CHECK(plan.opt.computeLanes >= 2);
  FusedOptions one = plan.opt;
  one.computeLanes = 1;
  const FusedEstimate oneLane = fusedClosedForm(fs, one, topo, 8, prof);
  CHECK(oneLane.bound == FusedBound::Tensor);
  CHECK(plan.estimate.tensorUs < 0.6 * oneLane.tensorUs);  // each lane's SMs have a tile each
  CHECK(plan.estimate.totalUs < 0.9 * oneLane.totalUs);    // now NVLink bounds it
  // Where a tile already fills the GPU, one lane is kept (ties keep fewer lanes).
  const FusedPlan wide = planFused(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 8192, 8192, 4096},
                                   FusedOptions{}, topologyPreset("h200x2", 1), 2, prof);
  CHECK(wide.opt.computeLanes == 1);
}

TEST_CASE("fused: the default tile is one wave of the kernel's CTAs, capped at the tallest shard") {
  // N = 4096: 32 column tiles of 128; 128 CTAs need 4 rows of tiles = 512 rows.
  CHECK(fusedDefaultTileRows(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 8192, 4096, 2048}, 2, 128) == 512);
  // ag-gemm on 8 ranks: 512 columns per rank, 4 column tiles: 32 rows of tiles, capped at the 1024-row shard.
  CHECK(fusedDefaultTileRows(FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 8192, 4096, 2048}, 8, 128) == 1024);
  CHECK(fusedDefaultTileRows(FusedSpec{FusedOp::GemmAllReduce, DType::BFloat16, 100, 64, 64}, 1, 128) == 100);
}

TEST_CASE("fused: the layered baseline is the GEMM alone plus our own collective of the same bytes") {
  const Topology topo = topologyPreset("dgx-h100", 1);
  const Profile prof = defaultProfile(topo);
  const LayeredEstimate rs =
      layeredEstimate(FusedSpec{FusedOp::GemmReduceScatter, DType::BFloat16, 4096, 4096, 2048}, topo, 8, prof);
  CHECK(rs.gemmUs == doctest::Approx(2.0 * 4096 * 4096 * 256 / (prof.gemmTflops * 1e6)));
  CHECK(rs.collectiveUs > 0);
  CHECK(rs.collective.rfind("reducescatter", 0) == 0);
  CHECK(rs.boundUs() == std::max(rs.gemmUs, rs.collectiveUs));
  const LayeredEstimate ar =
      layeredEstimate(FusedSpec{FusedOp::GemmAllReduce, DType::BFloat16, 4096, 4096, 2048}, topo, 8, prof);
  CHECK(ar.collectiveUs > rs.collectiveUs);
  CHECK(layeredEstimate(FusedSpec{FusedOp::AllGatherGemm, DType::BFloat16, 64, 64, 64}, topo, 1, prof).collectiveUs ==
        0);
}
