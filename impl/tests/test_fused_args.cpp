// CPU tests of the fused calls' checks (engine/fused_args.hpp): everything Communicator::gemmReduceScatter,
// allGatherGemm and gemmAllReduce refuse before anything runs, and the plan they run. No GPU needed.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/fused_args.hpp"
#include "engine/resources.hpp"
#include "gemm/gemm_lane.hpp"
#include "lowering/lowering.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"

namespace {

using mk::DType;
using mk::FusedOp;
using mk::FusedOptions;
using mk::FusedSpec;

FusedSpec spec(FusedOp op, uint64_t m, uint64_t n, uint64_t k, DType dt = DType::BFloat16) {
  FusedSpec s;
  s.op = op;
  s.dtype = dt;
  s.m = m;
  s.n = n;
  s.k = k;
  return s;
}

/// The message of the mk::Error `f` throws (and its code), or "" when it throws nothing.
std::string errorOf(const std::function<void()>& f, mk::ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const mk::Error& e) {
    if (code) *code = e.code();
    return e.message();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Env {
  mk::Topology topo = mk::topologyPreset("h200x2");
  mk::Profile prof = mk::defaultProfile(topo);
};

}  // namespace

TEST_CASE("fused call: shapes that do not divide are refused naming the dimension and its divisor") {
  Env e;
  mk::ErrorCode code{};
  std::string msg = errorOf(
      [&] { mk::runtime::planFusedCall(spec(FusedOp::GemmAllReduce, 64, 100, 64), {}, e.topo, 2, e.prof, 64, true); },
      &code);
  CHECK(code == mk::ErrorCode::InvalidArgument);
  CHECK(has(msg, "N = 100"));
  CHECK(has(msg, "multiple of 8"));
  msg = errorOf([&] {
    mk::runtime::planFusedCall(spec(FusedOp::GemmReduceScatter, 64, 64, 1001), {}, e.topo, 2, e.prof, 64, true);
  });
  CHECK(has(msg, "K = 1001"));
  msg = errorOf([&] {
    mk::runtime::planFusedCall(spec(FusedOp::GemmReduceScatter, 64, 64, 24), {}, e.topo, 4, e.prof, 32, true);
  });
  CHECK(has(msg, "at least 8 x ranks = 32"));
  msg = errorOf(
      [&] { mk::runtime::planFusedCall(spec(FusedOp::AllGatherGemm, 3, 64, 64), {}, e.topo, 4, e.prof, 32, true); });
  CHECK(has(msg, "M = 3"));
}

TEST_CASE("fused call: float16, float32 and a communicator without compute lanes are Unsupported") {
  Env e;
  mk::ErrorCode code{};
  std::string msg = errorOf(
      [&] {
        mk::runtime::planFusedCall(spec(FusedOp::GemmReduceScatter, 64, 64, 64, DType::Float16), {}, e.topo, 2, e.prof,
                                   64, true);
      },
      &code);
  CHECK(code == mk::ErrorCode::Unsupported);
  CHECK(has(msg, "float16"));
  CHECK(has(msg, "bfloat16"));
  code = {};
  msg = errorOf(
      [&] {
        mk::runtime::planFusedCall(spec(FusedOp::GemmReduceScatter, 64, 64, 64, DType::Float32), {}, e.topo, 2, e.prof,
                                   64, true);
      },
      &code);
  CHECK(code == mk::ErrorCode::Unsupported);
  code = {};
  msg = errorOf(
      [&] { mk::runtime::planFusedCall(spec(FusedOp::GemmAllReduce, 64, 64, 64), {}, e.topo, 2, e.prof, 64, false); },
      &code);
  CHECK(code == mk::ErrorCode::Unsupported);
  CHECK(has(msg, "computeLanes"));
}

TEST_CASE("fused call: a split without CTAs for a lane, or ctas other than the workers, is refused") {
  Env e;
  FusedOptions opt;
  opt.commCtas = 64;  // all of them: the compute lane gets none
  std::string msg = errorOf([&] {
    mk::runtime::planFusedCall(spec(FusedOp::GemmReduceScatter, 256, 256, 256), opt, e.topo, 2, e.prof, 64, true);
  });
  CHECK(has(msg, "gemm-rs"));
  CHECK(has(msg, "compute lane without CTAs"));
  opt.commCtas = 1;  // gemm-rs needs a send lane and a reduce lane on every rank
  msg = errorOf([&] {
    mk::runtime::planFusedCall(spec(FusedOp::GemmReduceScatter, 256, 256, 256), opt, e.topo, 2, e.prof, 64, true);
  });
  CHECK(has(msg, "communication lane without CTAs"));
  FusedOptions ctas;
  ctas.ctas = 32;
  msg = errorOf([&] {
    mk::runtime::planFusedCall(spec(FusedOp::AllGatherGemm, 256, 256, 256), ctas, e.topo, 2, e.prof, 64, true);
  });
  CHECK(has(msg, "FusedOptions::ctas 32"));
  CHECK(has(msg, "64 worker CTAs"));
}

TEST_CASE("fused call: the plan divides the communicator's workers and is concrete") {
  Env e;
  for (FusedOp op : mk::fusedOps()) {
    const mk::FusedPlan p = mk::runtime::planFusedCall(spec(op, 1000, 520, 264), {}, e.topo, 2, e.prof, 60, true);
    CHECK(p.opt.ctas == 60);
    CHECK(p.opt.commCtas >= 1);
    CHECK(p.opt.commCtas < 60);
    CHECK(p.opt.tileRows >= 1);
    CHECK(p.opt.order != mk::TileOrder::Auto);
    CHECK(p.opt.computeLanes >= 1);
  }
}

TEST_CASE("fused call: operands null, misaligned for TMA or overlapping c are refused naming the operand") {
  const FusedSpec s = spec(FusedOp::GemmReduceScatter, 64, 64, 64);
  alignas(16) static uint16_t a[64 * 32], b[32 * 64], c[32 * 64];
  CHECK(errorOf([&] { mk::runtime::checkFusedOperands(s, 2, 0, a, b, c); }).empty());
  CHECK(has(errorOf([&] { mk::runtime::checkFusedOperands(s, 2, 0, nullptr, b, c); }), "A 0 is null"));
  const std::string mis = errorOf([&] { mk::runtime::checkFusedOperands(s, 2, 1, a, b + 1, c); });
  CHECK(has(mis, "rank 1's B"));
  CHECK(has(mis, "not 16-byte aligned"));
  CHECK(has(errorOf([&] { mk::runtime::checkFusedOperands(s, 2, 0, a, b, a + 8); }), "overlaps A"));
  // The counts follow fusedShards: rank 1 of gemm-ar holds K_1 = 32 columns of A and all of C.
  const mk::runtime::FusedOperandCounts n =
      mk::runtime::fusedOperandCounts(spec(FusedOp::GemmAllReduce, 64, 64, 64), 2, 1);
  CHECK(n.a == 64 * 32);
  CHECK(n.b == 32 * 64);
  CHECK(n.c == 64 * 64);
}

TEST_CASE("fused call: the schedule cache key tells shapes and options apart") {
  const FusedSpec s = spec(FusedOp::GemmReduceScatter, 64, 64, 64);
  FusedOptions o;
  o.tileRows = 16;
  o.order = mk::TileOrder::OwnLast;
  o.ctas = 8;
  o.commCtas = 2;
  o.computeLanes = 1;
  const auto k0 = mk::runtime::ScheduleKey::fusedOp(s, o);
  CHECK(k0 == mk::runtime::ScheduleKey::fusedOp(s, o));
  FusedSpec s2 = s;
  s2.k = 72;
  FusedOptions o2 = o;
  o2.commCtas = 3;
  for (const auto& other : {mk::runtime::ScheduleKey::fusedOp(s2, o), mk::runtime::ScheduleKey::fusedOp(s, o2)}) {
    CHECK(other != k0);
    CHECK((other < k0) != (k0 < other));
    CHECK(other.digest() != k0.digest());
  }
  CHECK(k0 != mk::runtime::ScheduleKey::customImage(0, 0));
}

TEST_CASE("fused call: a generated schedule's Gemm operands bound per buffer pass the TMA check, misaligned fail") {
  const FusedSpec s = spec(FusedOp::GemmReduceScatter, 40, 24, 32);
  FusedOptions o;
  o.tileRows = 8;
  o.order = mk::TileOrder::OwnLast;
  o.ctas = 8;
  o.commCtas = 2;
  o.computeLanes = 1;
  const mk::Schedule sch = mk::generate(s, {0, 0}, o);
  mk::runtime::LowerOptions lo;
  lo.nWorkers = 8;
  const mk::runtime::LoweredProgram p = mk::runtime::lowerPacked(mk::packRank(sch, 1), 1, lo);
  std::vector<uint64_t> bases(sch.buffers.size(), 0);
  bases[static_cast<size_t>(sch.bufferIndex("a"))] = 0x10000;
  bases[static_cast<size_t>(sch.bufferIndex("b"))] = 0x20000;
  bases[static_cast<size_t>(sch.bufferIndex("c"))] = 0x30000;
  CHECK_NOTHROW(mk::runtime::checkComputeOperands(p, 1, bases));
  bases[static_cast<size_t>(sch.bufferIndex("b"))] = 0x20008;
  CHECK(has(errorOf([&] { mk::runtime::checkComputeOperands(p, 1, bases); }), "B at input"));
}

TEST_CASE("fused call: the engine's default tile is the whole GEMM on one rank and >= 1024 rows otherwise") {
  Env e;
  const mk::FusedPlan one =
      mk::runtime::planFusedCall(spec(FusedOp::GemmReduceScatter, 4096, 4096, 2048), {}, e.topo, 1, e.prof, 128, true);
  CHECK(one.opt.tileRows == 4096);
  CHECK(one.tileDefault);
  const mk::FusedPlan two =
      mk::runtime::planFusedCall(spec(FusedOp::GemmAllReduce, 16384, 16384, 8192), {}, e.topo, 2, e.prof, 63, true);
  CHECK(two.opt.tileRows >= mk::runtime::kEngineMinTileRows);
  // Capped by the largest shard: 600 rows on 2 ranks are shards of 300.
  CHECK(mk::runtime::engineTileRows(spec(FusedOp::AllGatherGemm, 600, 64, 64), 2, 63) == 300);
  FusedOptions given;
  given.tileRows = 40;
  CHECK(mk::runtime::planFusedCall(spec(FusedOp::AllGatherGemm, 600, 64, 64), given, e.topo, 2, e.prof, 63, true)
            .opt.tileRows == 40);
}
