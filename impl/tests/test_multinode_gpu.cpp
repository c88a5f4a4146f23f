// GPU tests of the inter-node path on one machine: each test case re-launches this binary as several rank processes
// (multiprocess_launch.hpp) that form "nodes" (CommConfig::ranksPerNode) sharing GPU 0 under CUDA MPS, joined by the
// proxy over the socket transport on loopback. Every generator of the collectives that span nodes runs with ProxyPut
// steps through the resident kernel's FIFO, the proxy, TCP and the receiver's inbox, and is checked element-wise.
// Without MPS the processes' resident kernels cannot run at once: the cases skip (exit 77) and say so.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "mk/communicator.hpp"
#include "multiprocess_cases.hpp"
#include "multiprocess_launch.hpp"

namespace {

constexpr double kChildTimeoutS = 110;

/// In the launcher: run `name` as `ranks` processes on GPU 0 with `ranksPerNode`, CHECK they all passed, return
/// true. In a rank: false.
bool launch(const char* name, int ranks) { return mkt::launchOnSharedGpu(name, ranks, kChildTimeoutS); }

mk::CommConfig config(uint32_t ranksPerNode) { return mkt::sharedGpuNodesConfig(ranksPerNode, 5000, 30000); }

/// Every generator of the collectives, counts {1, 1021, 256 Ki + 3}, float32 and bfloat16, out of place, on this
/// process's rank of a communicator of ranksPerNode-rank nodes.
void everyGenerator(uint32_t ranksPerNode) {
  mkt::useLocalDevice();
  const uint64_t big = (1u << 18) + 3;
  const size_t bytes = (big * 8 + 64) * 4;
  mkt::Buffer a(bytes), b(bytes);
  mkt::Env env(config(ranksPerNode));
  REQUIRE(env.comm.topology().nodes == static_cast<uint32_t>(env.comm.size()) / ranksPerNode);
  CHECK(env.comm.interNodeTransport() == "socket");
  uint64_t seed = 1, failures = 0, cases = 0;
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll})
    for (mk::Algorithm algo : mk::algorithmsFor(op))
      for (mk::DType dt : {mk::DType::Float32, mk::DType::BFloat16})
        for (uint64_t count : {uint64_t{1}, uint64_t{1021}, big}) {
          mk::CollectiveSpec spec;
          spec.op = op;
          spec.dtype = dt;
          spec.count = count;
          spec.root = op == mk::CollOp::Broadcast ? static_cast<uint32_t>(env.comm.size()) - 1 : 0;
          CAPTURE(mk::toString(op));
          CAPTURE(mk::toString(algo));
          CAPTURE(mk::toString(dt));
          CAPTURE(count);
          const uint64_t bad = mkt::runCase(env, a, b, spec, false, ++seed, mk::CollOptions(algo));
          failures += bad != 0;
          ++cases;
          CHECK(bad == 0);
        }
  MESSAGE("rank " << env.comm.rank() << ": " << cases << " cases, " << failures << " failed");
  env.comm.synchronize();
}

}  // namespace

TEST_CASE("multinode: 2 nodes of 1 rank run every generator through the proxy") {
  if (!launch("multinode: 2 nodes of 1 rank run every generator through the proxy", 2)) everyGenerator(1);
}

TEST_CASE("multinode: 2 nodes of 2 ranks run every generator through the proxy") {
  if (!launch("multinode: 2 nodes of 2 ranks run every generator through the proxy", 4)) everyGenerator(2);
}

TEST_CASE("multinode: 4 nodes of 1 rank run every generator through the proxy") {
  if (!launch("multinode: 4 nodes of 1 rank run every generator through the proxy", 4)) everyGenerator(1);
}
