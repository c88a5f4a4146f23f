// The fused operators on the GPU (docs/fused-operators.md): gemm-rs, ag-gemm and gemm-ar through Communicator on one
// rank and on 2 to 4 ranks sharing GPU 0 (CommConfig::shareGpus), compared element by element with the exact product
// under mk::verifyFused's tolerance (fresh random inputs; m odd, n and k multiples of 8 but not of the 128-wide
// tiles, k split unevenly); gemm-ar's outputs also bit-identical across ranks. Bad calls are refused before anything
// runs and leave the outputs untouched.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine_test_util.hpp"
#include "fused_check.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/communicator.hpp"

namespace {

using mk::FusedOp;
using mk::FusedOptions;
using mk::FusedSpec;
using mk::MatrixLayout;

constexpr uint16_t kSentinel = 0x7FC1;  // a bf16 NaN: any element the op fails to write fails the check

mk::CommConfig fusedConfig(uint32_t ranks) {
  mk::CommConfig cfg;
  cfg.computeLanes = true;
  cfg.shareGpus = ranks > 1;
  cfg.pollBudgetMs = 5000;
  return cfg;
}

/// Per-rank device copies of a, b and c (c filled with the sentinel).
struct RankBuffers {
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> a, b, c;
  RankBuffers(const mkbench::FusedHostData& d) {
    for (uint32_t r = 0; r < d.ranks; ++r) {
      a.push_back(std::make_unique<mkt::DeviceBuffer>(0, d.a[r].size() * 2));
      b.push_back(std::make_unique<mkt::DeviceBuffer>(0, d.b[r].size() * 2));
      c.push_back(std::make_unique<mkt::DeviceBuffer>(0, mkbench::fusedOutputCount(d, r) * 2));
      a[r]->upload(d.a[r].data(), d.a[r].size() * 2);
      b[r]->upload(d.b[r].data(), d.b[r].size() * 2);
    }
    sentinel();
  }
  void sentinel() {
    for (auto& x : c) {
      const std::vector<uint16_t> h(x->bytes() / 2, kSentinel);
      x->upload(h.data(), x->bytes());
    }
  }
};

/// Call the op on every rank (one group, one thread), then wait.
void runOnEveryRank(std::vector<mk::Communicator>& comms, mkt::Streams& st, const FusedSpec& spec,
                    const RankBuffers& buf, const FusedOptions& opt) {
  {
    mkt::GroupGuard group;
    for (size_t r = 0; r < comms.size(); ++r)
      comms[r].fused(spec, buf.a[r]->get(), buf.b[r]->get(), buf.c[r]->get(), st.s[r], opt);
  }
  st.sync(comms);
}

/// Every element of every rank's c against the reference; gemm-ar: bit-identical across ranks.
void checkEveryRank(const mkbench::FusedHostData& d, const RankBuffers& buf) {
  std::vector<uint16_t> first;
  for (uint32_t r = 0; r < d.ranks; ++r) {
    std::vector<uint16_t> c(mkbench::fusedOutputCount(d, r));
    buf.c[r]->download(c.data(), c.size() * 2);
    const mkbench::FusedCheck chk = mkbench::checkFusedOutput(d, r, c.data());
    CAPTURE(r);
    CHECK_MESSAGE(chk.ok(), chk.first);
    CHECK(chk.checked == c.size());
    if (d.spec.op == FusedOp::GemmAllReduce) {
      if (r == 0)
        first = c;
      else
        CHECK_MESSAGE(c == first, "gemm-ar outputs differ between rank 0 and rank " << r);
    }
  }
}

FusedSpec spec(FusedOp op, uint64_t m, uint64_t n, uint64_t k, MatrixLayout lb = MatrixLayout::RowMajor) {
  FusedSpec s;
  s.op = op;
  s.m = m;
  s.n = n;
  s.k = k;
  s.layoutB = lb;
  return s;
}

/// Every op, both B layouts, the planned options and each order with small tiles (several tiles per shard, the last
/// one shorter), on `ranks` ranks of GPU 0.
void everyOp(uint32_t ranks, uint64_t m, uint64_t n, uint64_t k) {
  auto comms = mk::Communicator::createLocal(std::vector<int>(ranks, 0), fusedConfig(ranks));
  mkt::Streams st(comms);
  uint64_t seed = 1000 * ranks + std::random_device{}() % 1000;
  for (FusedOp op : mk::fusedOps())
    for (MatrixLayout lb : {MatrixLayout::RowMajor, MatrixLayout::ColMajor}) {
      const FusedSpec s = spec(op, m, n, k, lb);
      std::vector<FusedOptions> opts(1);  // planned
      if (ranks > 1)
        for (mk::TileOrder o : {mk::TileOrder::OwnFirst, mk::TileOrder::OwnLast, mk::TileOrder::Interleaved}) {
          FusedOptions x;
          x.order = o;
          x.tileRows = 40;
          opts.push_back(x);
        }
      for (const FusedOptions& opt : opts) {
        CAPTURE(mk::toString(op));
        CAPTURE(mk::toString(lb));
        CAPTURE(mk::toString(opt.order));
        const mkbench::FusedHostData d = mkbench::makeFusedInputs(s, ranks, ++seed);
        RankBuffers buf(d);
        runOnEveryRank(comms, st, s, buf, opt);
        checkEveryRank(d, buf);
      }
    }
}

}  // namespace

TEST_CASE("fused gpu: one rank runs every op as a plain GEMM of odd shape exactly") { everyOp(1, 203, 136, 264); }

TEST_CASE("fused gpu: two ranks sharing GPU 0 run every op, order and B layout within the tolerance") {
  everyOp(2, 301, 200, 264);
}

TEST_CASE("fused gpu: three ranks sharing GPU 0 split m and k unevenly and still match") { everyOp(3, 257, 136, 200); }

TEST_CASE("fused gpu: four ranks sharing GPU 0 run every op within the tolerance") { everyOp(4, 333, 264, 392); }

TEST_CASE("fused gpu: repeated ops on the same buffers reuse the cached schedule and stay exact") {
  auto comms = mk::Communicator::createLocal({0, 0}, fusedConfig(2));
  mkt::Streams st(comms);
  const FusedSpec s = spec(FusedOp::GemmAllReduce, 517, 392, 520);
  mkbench::FusedHostData d = mkbench::makeFusedInputs(s, 2, 7);
  RankBuffers buf(d);
  for (int i = 0; i < 3; ++i) {
    buf.sentinel();
    runOnEveryRank(comms, st, s, buf, {});
    checkEveryRank(d, buf);
  }
  // Back to back in one group: the second op's fence waits for the first (same buffers).
  {
    mkt::GroupGuard group;
    for (int i = 0; i < 4; ++i)
      for (size_t r = 0; r < comms.size(); ++r)
        comms[r].gemmAllReduce(buf.a[r]->get(), buf.b[r]->get(), buf.c[r]->get(), s.m, s.n, s.k, s.dtype, st.s[r]);
  }
  st.sync(comms);
  checkEveryRank(d, buf);
}

TEST_CASE("fused gpu: execute() runs a generated fused schedule with a and b bound separately") {
  auto comms = mk::Communicator::createLocal({0, 0}, fusedConfig(2));
  mkt::Streams st(comms);
  const FusedSpec s = spec(FusedOp::GemmReduceScatter, 263, 136, 328);
  const mk::FusedPlan plan = comms[0].fusedPlan(s);
  CHECK(plan.opt.ctas == comms[0].workerCtas());
  const mk::Schedule sched = mk::generate(s, {0, 0}, plan.opt);
  const mkbench::FusedHostData d = mkbench::makeFusedInputs(s, 2, 11);
  RankBuffers buf(d);
  {
    mkt::GroupGuard group;
    for (size_t r = 0; r < comms.size(); ++r)
      comms[r].execute(sched, {buf.a[r]->get(), buf.b[r]->get()}, {buf.c[r]->get()}, st.s[r]);
  }
  st.sync(comms);
  checkEveryRank(d, buf);
}

TEST_CASE("fused gpu: bad calls are refused before anything runs and write nothing") {
  auto comms = mk::Communicator::createLocal({0, 0}, fusedConfig(2));
  mkt::Streams st(comms);
  const FusedSpec good = spec(FusedOp::GemmReduceScatter, 128, 128, 128);
  const mkbench::FusedHostData d = mkbench::makeFusedInputs(good, 2, 3);
  RankBuffers buf(d);
  const uint64_t before = comms[0].nextOpIndex();
  auto call = [&](const FusedSpec& s, const void* a, const void* b, const FusedOptions& opt) {
    return mkt::errorOf([&] { comms[0].fused(s, a, b, buf.c[0]->get(), st.s[0], opt); });
  };
  std::string msg = call(spec(FusedOp::GemmReduceScatter, 128, 100, 128), buf.a[0]->get(), buf.b[0]->get(), {});
  CHECK(msg.find("N = 100") != std::string::npos);
  FusedSpec fp16 = good;
  fp16.dtype = mk::DType::Float16;
  msg = call(fp16, buf.a[0]->get(), buf.b[0]->get(), {});
  CHECK(msg.find("bfloat16") != std::string::npos);
  msg = call(good, buf.a[0]->get(), buf.b[0]->get() + 2, {});
  CHECK(msg.find("not 16-byte aligned") != std::string::npos);
  FusedOptions all;
  all.commCtas = comms[0].workerCtas();
  msg = call(good, buf.a[0]->get(), buf.b[0]->get(), all);
  CHECK(msg.find("compute lane without CTAs") != std::string::npos);
  msg = call(good, buf.a[0]->get(), buf.c[0]->get(), {});
  CHECK(msg.find("overlaps B") != std::string::npos);
  CHECK(comms[0].nextOpIndex() == before);
  // Nothing ran: c still holds the sentinel everywhere; then a good op on both ranks still works.
  std::vector<uint16_t> c(mkbench::fusedOutputCount(d, 0));
  buf.c[0]->download(c.data(), c.size() * 2);
  bool untouched = true;
  for (uint16_t v : c) untouched = untouched && v == kSentinel;
  CHECK(untouched);
  runOnEveryRank(comms, st, good, buf, {});
  checkEveryRank(d, buf);
}

TEST_CASE("fused gpu: a communicator without compute lanes refuses fused ops as Unsupported") {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  auto comms = mk::Communicator::createLocal({0, 0}, cfg);
  mkt::DeviceBuffer a(0, 4096), b(0, 4096), c(0, 4096);
  const std::string msg = mkt::errorOf(
      [&] { comms[0].gemmReduceScatter(a.get(), b.get(), c.get(), 32, 32, 32, mk::DType::BFloat16, nullptr); });
  CHECK(msg.find("computeLanes") != std::string::npos);
}
