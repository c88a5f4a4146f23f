// The fused operators across processes on the CPU: each forked process is one node and runs its ranks' lanes on the
// CPU reference executor; the fused schedule's cross-node pieces (ProxyPut of tiles and partials) go through the host
// command FIFO, the proxy and the socket transport over 127.0.0.1, as mk-bench gemm-rs|ag-gemm|gemm-ar
// --ranks-per-node runs them on the GPU. Every rank's C is compared element-wise with the exact product
// (mk::verifyFused). Shapes as the bench's: m a multiple of the ranks, each rank's rows an odd number of tiles.
#include <doctest/doctest.h>
#include <signal.h>

#include <thread>

#include "mk/algorithms/fused.hpp"
#include "mk/exec/verify_fused.hpp"
#include "mk/proxy/exec_port.hpp"
#include "proxy_test_util.hpp"

namespace {

constexpr uint32_t kTileRows = 8;

/// The bench's shape scaled down: every rank owns 3 tiles of C's rows (gemm-rs; m / p rows each), k and n split in
/// whole 8-element pieces over the ranks.
mk::FusedSpec benchShape(mk::FusedOp op, uint32_t p) {
  return mk::FusedSpec{op, mk::DType::BFloat16, 3 * kTileRows * p, 16 * p + 8, 16 * p};
}

/// Every op, tile order and input kind on `nodeOf`, this process holding the ranks of `node`; 0 when every held
/// rank's C matched, else a code naming the stage that failed.
int runFusedLayout(int node, const std::vector<uint32_t>& nodeOf, uint16_t port) {
  int nodes = 0;
  for (uint32_t n : nodeOf) nodes = std::max(nodes, static_cast<int>(n) + 1);
  const auto p = static_cast<uint32_t>(nodeOf.size());
  const std::vector<uint32_t> mine = mkt::ranksOf(nodeOf, node);
  mk::TcpBootstrap boot(mkt::bootOptions(node, nodes, port, 20000));
  mk::proxy::ExecPortOptions po;
  po.transport = mkt::socketOptions(nullptr, 5000);
  po.fifoCapacity = 8;  // small: lanes meet back-pressure
  mk::proxy::ExecProxyPort proxyPort(boot, p, mine, po);
  mk::ExecOptions opt;
  opt.localRanks = mine;
  opt.proxy = &proxyPort;
  opt.stallTimeout = std::chrono::milliseconds(5000);
  const mk::TileOrder orders[] = {mk::TileOrder::OwnFirst, mk::TileOrder::OwnLast, mk::TileOrder::Interleaved};
  uint64_t seed = 1;
  for (mk::FusedOp op : mk::fusedOps())
    for (mk::TileOrder order : orders) {
      mk::FusedSpec spec = benchShape(op, p);
      spec.layoutB = seed % 2 ? mk::MatrixLayout::ColMajor : mk::MatrixLayout::RowMajor;
      const mk::Schedule s = mk::generate(spec, nodeOf, mk::FusedOptions{kTileRows, order, 12, 6, 1});
      const mk::InputKind kind = seed % 2 ? mk::InputKind::Uniform : mk::InputKind::SmallIntegers;
      const mk::VerifyResult v = mk::verifyFused(s, spec, seed++, kind, opt);
      if (!v.ok || v.checked == 0) {
        std::fprintf(stderr, "node %d: %s %s: %s\n", node, mk::toString(op), mk::toString(order), v.detail.c_str());
        return 2;
      }
    }
  uint64_t handled = 0;
  for (uint32_t r : mine) handled += proxyPort.proxy().handled(r);
  return handled > 0 ? 0 : 3;  // the tiles really went through the proxy
}

void checkFusedLayout(const std::vector<uint32_t>& nodeOf) {
  int nodes = 0;
  for (uint32_t n : nodeOf) nodes = std::max(nodes, static_cast<int>(n) + 1);
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      nodes, [&](int node) { return runFusedLayout(node, nodeOf, port); }, 120);
  for (int node = 0; node < nodes; ++node) {
    CAPTURE(node);
    CHECK(codes[static_cast<std::size_t>(node)] == 0);
  }
}

}  // namespace

TEST_CASE("multinode fused: bench shapes on 2 nodes x 1 rank, every op and tile order") { checkFusedLayout({0, 1}); }
TEST_CASE("multinode fused: bench shapes on 2 nodes x 2 ranks, every op and tile order") {
  checkFusedLayout({0, 0, 1, 1});
}
TEST_CASE("multinode fused: bench shapes on 4 nodes x 1 rank, every op and tile order") {
  checkFusedLayout({0, 1, 2, 3});
}

TEST_CASE("multinode fused: a process killed mid gemm-rs is named by the survivor within the budget") {
  const std::vector<uint32_t> nodeOf = {0, 1};
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      2,
      [&](int node) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(node, 2, port));
        const std::vector<uint32_t> mine = mkt::ranksOf(nodeOf, node);
        mk::proxy::ExecPortOptions po;
        po.transport = mkt::socketOptions(nullptr, 1000);
        po.transport.chunkBytes = 4096;  // the smallest: every partial of 16 KiB in 4 chunks
        po.budget = std::chrono::milliseconds(1000);
        mk::proxy::ExecProxyPort proxyPort(boot, 2, mine, po);
        std::thread killer;
        if (node == 1)  // once its proxy sent the first chunk of a partial: most of the op is still owed
          killer = std::thread([&] {
            while (proxyPort.proxy().handled(1) == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
            ::kill(::getpid(), SIGKILL);
          });
        mk::ExecOptions opt;
        opt.localRanks = mine;
        opt.proxy = &proxyPort;
        opt.stallTimeout = std::chrono::milliseconds(3000);
        // 64 tiles of 8 rows per rank, each partial 4 chunks: far more than one chunk to send.
        const mk::FusedSpec spec{mk::FusedOp::GemmReduceScatter, mk::DType::BFloat16, 1024, 1024, 16};
        const mk::Schedule s =
            mk::generate(spec, nodeOf, mk::FusedOptions{kTileRows, mk::TileOrder::OwnFirst, 12, 6, 1});
        const auto t0 = std::chrono::steady_clock::now();
        try {
          mk::verifyFused(s, spec, 5, mk::InputKind::SmallIntegers, opt);
          return 2;  // a run that lost a process cannot succeed
        } catch (const mk::Error& e) {
          const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "node %d (%.2f s): %s\n", node, took, e.what());
          if (!mkt::contains(e.message(), "process 1 (127.0.0.1:")) return 3;
          if (took > 3) return 4;
        }
        if (killer.joinable()) killer.join();
        return 0;
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 128 + SIGKILL);
}
