// The CPU reference executor across processes: each forked process is one node and runs its ranks; ProxyPut steps
// go through the host command FIFO, the proxy and the socket transport over 127.0.0.1 to the other processes.
// Hierarchical all-reduce / all-gather / reduce-scatter and flat algorithms across nodes, every dtype, odd sizes,
// fresh random inputs, each compared element-wise with the reference (mk/exec/verify.hpp).
#include <doctest/doctest.h>

#include "mk/algorithms/algorithms.hpp"
#include "mk/exec/verify.hpp"
#include "mk/proxy/exec_port.hpp"
#include "proxy_test_util.hpp"

namespace {

struct Case {
  mk::CollOp op;
  mk::Algorithm algo;
  mk::InterPhase inter = mk::InterPhase::Ring;
  mk::RedOp redop = mk::RedOp::Sum;
};

/// What every layout runs: the hierarchical generators (both inter-node phases of all-reduce) and flat ones whose
/// ring or direct exchange crosses nodes.
const std::vector<Case> kCases = {
    {mk::CollOp::AllReduce, mk::Algorithm::Hierarchical, mk::InterPhase::Ring},
    {mk::CollOp::AllReduce, mk::Algorithm::Hierarchical, mk::InterPhase::Rhd, mk::RedOp::Max},
    {mk::CollOp::AllGather, mk::Algorithm::Hierarchical},
    {mk::CollOp::ReduceScatter, mk::Algorithm::Hierarchical},
    {mk::CollOp::AllReduce, mk::Algorithm::Ring},
    {mk::CollOp::AllGather, mk::Algorithm::Ring},
    {mk::CollOp::ReduceScatter, mk::Algorithm::Ring, mk::InterPhase::Ring, mk::RedOp::Min},
    {mk::CollOp::AllToAll, mk::Algorithm::Direct},
};
const mk::DType kDtypes[] = {mk::DType::Float32, mk::DType::BFloat16, mk::DType::Float16};
const uint64_t kCounts[] = {1, 37, 1031, 20011};

/// Run every case on `nodeOf` with one process per node; 0 when every rank of every process matched the reference.
int runLayout(int node, const std::vector<uint32_t>& nodeOf, uint16_t port, bool staged) {
  int nodes = 0;
  for (uint32_t n : nodeOf) nodes = std::max(nodes, static_cast<int>(n) + 1);
  const std::vector<uint32_t> mine = mkt::ranksOf(nodeOf, node);
  mk::TcpBootstrap boot(mkt::bootOptions(node, nodes, port, 20000));
  mk::proxy::ExecPortOptions po;
  po.transport = mkt::socketOptions(nullptr, 5000);
  po.transport.chunkBytes = 16 * 1024;  // puts of several chunks: the pipeline runs
  po.transport.payloadChecksum = staged;
  po.stagedCopies = staged;
  po.fifoCapacity = 8;  // small: lanes meet back-pressure
  mk::proxy::ExecProxyPort proxyPort(boot, static_cast<uint32_t>(nodeOf.size()), mine, po);
  mk::ExecOptions opt;
  opt.localRanks = mine;
  opt.proxy = &proxyPort;
  opt.stallTimeout = std::chrono::milliseconds(5000);
  uint64_t seed = 1;
  int runs = 0;
  for (const Case& c : kCases)
    for (mk::DType dtype : kDtypes)
      for (uint64_t count : kCounts) {
        mk::CollectiveSpec spec;
        spec.op = c.op;
        spec.algo = c.algo;
        spec.dtype = dtype;
        spec.redop = c.redop;
        spec.count = count;
        mk::GenOptions gen;
        gen.inter = c.inter;
        gen.chunks = count > 1000 ? 2 : 1;
        gen.channels = count > 10000 ? 2 : 1;
        const mk::Schedule s = mk::generate(spec, nodeOf, gen);
        const mk::InputKind kind = (seed % 3 == 0) ? mk::InputKind::SmallIntegers : mk::InputKind::Uniform;
        const mk::VerifyResult v = mk::verifyCollective(s, spec, seed++, kind, opt);
        ++runs;
        if (!v.ok) {
          std::fprintf(stderr, "node %d: %s %s %s count %llu: %s\n", node, mk::toString(c.op), mk::toString(c.algo),
                       mk::toString(dtype), static_cast<unsigned long long>(count), v.detail.c_str());
          return 2;
        }
      }
  uint64_t handled = 0;
  for (uint32_t r : mine) handled += proxyPort.proxy().handled(r);
  std::fprintf(stderr, "node %d: %d collectives verified, %llu proxy commands\n", node, runs,
               static_cast<unsigned long long>(handled));
  return handled > 0 ? 0 : 3;  // the ProxyPuts really went through the proxy
}

void checkLayout(const std::vector<uint32_t>& nodeOf, bool staged = false) {
  int nodes = 0;
  for (uint32_t n : nodeOf) nodes = std::max(nodes, static_cast<int>(n) + 1);
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      nodes, [&](int node) { return runLayout(node, nodeOf, port, staged); }, 120);
  for (int node = 0; node < nodes; ++node) {
    CAPTURE(node);
    CHECK(codes[static_cast<std::size_t>(node)] == 0);
  }
}

}  // namespace

TEST_CASE("multinode executor: 2 nodes x 1 rank") { checkLayout({0, 1}); }
TEST_CASE("multinode executor: 2 nodes x 4 ranks, staged copies and payload checksums") {
  checkLayout({0, 0, 0, 0, 1, 1, 1, 1}, true);
}
TEST_CASE("multinode executor: 3 nodes x 2 ranks") { checkLayout({0, 0, 1, 1, 2, 2}); }
TEST_CASE("multinode executor: 4 nodes x 1 rank") { checkLayout({0, 1, 2, 3}); }
TEST_CASE("multinode executor: 4 nodes x 3 ranks") { checkLayout({0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}); }
TEST_CASE("multinode executor: uneven nodes of 3, 1 and 2 ranks") { checkLayout({0, 0, 0, 1, 2, 2}); }
TEST_CASE("multinode executor: nodes interleaved in rank order") { checkLayout({0, 1, 0, 1}); }
