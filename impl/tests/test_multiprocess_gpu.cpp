// GPU tests of the multi-process mode (one process per GPU, TCP rendezvous): each test case re-launches
// this binary as 2 ranks (multiprocess_launch.hpp) that run its body with Communicator::createFromEnvironment;
// the launching process checks both exit codes. Every collective x dtype x redop x counts {1, 1021,
// 1 MiB + 3} in and out of place, 256 MiB per collective, back-to-back ops, and failures: a peer that
// never submits, a mismatched op, pool memory refused.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/topology_probe.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify.hpp"
#include "multiprocess_cases.hpp"
#include "multiprocess_launch.hpp"

namespace {

using mkt::Buffer;
using mkt::Env;
using mkt::inputValue;
using mkt::runCase;
using mkt::useLocalDevice;

constexpr int kRanks = 2;
// Below gpu_suite.sh's 60 s per case, so the launcher (not an outer timeout) reports a hung rank.
constexpr double kChildTimeoutS = 55;

/// In the launcher: run `name` as kRanks processes, CHECK they all passed, return true. In a rank: false.
bool launchRanks(const char* name, double timeoutS = kChildTimeoutS) {
  if (mkt::isRankProcess()) return false;
  const auto codes = mkt::execRanks(kRanks, name, timeoutS);
  for (size_t r = 0; r < codes.size(); ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
  return true;
}

#define MP_TEST(name, fn)         \
  static void fn();               \
  TEST_CASE(name) {               \
    if (!launchRanks(name)) fn(); \
  }                               \
  static void fn()

/// Every dtype x redop (where it applies) x count x placement of one collective.
void sweep(mk::CollOp op) {
  useLocalDevice();
  const uint64_t big = (1u << 20) + 3;
  const size_t bytes = (big * kRanks + 64) * 4;
  Buffer a(bytes), b(bytes);
  Env env;
  CHECK(env.comm.multiProcess());
  CHECK(env.comm.size() == kRanks);
  const bool reduces = op == mk::CollOp::AllReduce || op == mk::CollOp::ReduceScatter;
  uint64_t seed = 1, failures = 0, cases = 0;
  for (mk::DType dt : {mk::DType::Float32, mk::DType::BFloat16, mk::DType::Float16})
    for (mk::RedOp ro : {mk::RedOp::Sum, mk::RedOp::Max, mk::RedOp::Min}) {
      if (!reduces && ro != mk::RedOp::Sum) continue;
      for (uint64_t count : {uint64_t{1}, uint64_t{1021}, big})
        for (bool inPlace : {false, true}) {
          mk::CollectiveSpec spec;
          spec.op = op;
          spec.dtype = dt;
          spec.redop = ro;
          spec.count = count;
          spec.root = op == mk::CollOp::Broadcast ? static_cast<uint32_t>(seed % kRanks) : 0;
          CAPTURE(mk::toString(dt));
          CAPTURE(mk::toString(ro));
          CAPTURE(count);
          CAPTURE(inPlace);
          const uint64_t bad = runCase(env, a, b, spec, inPlace, ++seed);
          failures += bad != 0;
          ++cases;
        }
    }
  env.comm.synchronize();
  std::printf("rank %d: %s: %llu cases, %llu failed\n", env.comm.rank(), mk::toString(op),
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(failures));
  CHECK(failures == 0);
}

}  // namespace

/// Every collective x {float32, bfloat16} x {1, 1021, 1 Mi + 3} x in / out of place in the configuration
/// compute-sanitizer can check: user buffers allocated before the communicator and mapped by the peers at
/// creation (premappedBuffers), a device arena for everything the engine allocates later (peers map it at
/// creation too), and the Auto stream hand-off, which takes memory operations under the sanitizer (no kernel
/// beside the resident one). Runs
/// with any WORLD_SIZE, so impl/tools/sanitize_suite.sh can start each rank under its own sanitizer, and one
/// rank alone.
void arenaSweep() {
  useLocalDevice();
  const uint64_t big = (1u << 20) + 3;
  Buffer a((big * mk::device::kMaxRanks + 64) * 4), b((big * mk::device::kMaxRanks + 64) * 4);
  mk::CommConfig c = Env::config();
  c.deviceArenaBytes = uint64_t{256} << 20;
  // The default hand-off (Auto): stream memory operations under compute-sanitizer, which it detects (a kernel
  // hand-off would never start there); the one-process arena case sets MemOps explicitly.
  c.premappedBuffers = {a.p, b.p};
  Env env(c);
  CHECK(env.comm.multiProcess());
  uint64_t seed = 77, failures = 0, cases = 0;
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll})
    for (mk::DType dt : {mk::DType::Float32, mk::DType::BFloat16})
      for (uint64_t count : {uint64_t{1}, uint64_t{1021}, big})
        for (bool inPlace : {false, true}) {
          mk::CollectiveSpec spec;
          spec.op = op;
          spec.dtype = dt;
          spec.redop = op == mk::CollOp::AllReduce && count == 1021 ? mk::RedOp::Max : mk::RedOp::Sum;
          spec.count = count;
          spec.root = op == mk::CollOp::Broadcast ? static_cast<uint32_t>(env.comm.size() - 1) : 0;
          CAPTURE(mk::toString(op));
          CAPTURE(mk::toString(dt));
          CAPTURE(count);
          CAPTURE(inPlace);
          failures += runCase(env, a, b, spec, inPlace, ++seed) != 0;
          ++cases;
        }
  env.comm.synchronize();
  std::printf("rank %d of %d: arena sweep: %llu cases, %llu failed\n", env.comm.rank(), env.comm.size(),
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(failures));
  CHECK(failures == 0);
}

MP_TEST("multiprocess arena: every collective with a device arena and premapped buffers", mpArena) { arenaSweep(); }

MP_TEST("multiprocess: allreduce every dtype redop count in and out of place", mpAllReduce) {
  sweep(mk::CollOp::AllReduce);
}
MP_TEST("multiprocess: allgather every dtype count in and out of place", mpAllGather) { sweep(mk::CollOp::AllGather); }
MP_TEST("multiprocess: reducescatter every dtype redop count in and out of place", mpReduceScatter) {
  sweep(mk::CollOp::ReduceScatter);
}
MP_TEST("multiprocess: broadcast every dtype count in and out of place", mpBroadcast) { sweep(mk::CollOp::Broadcast); }
MP_TEST("multiprocess: alltoall every dtype count in and out of place", mpAllToAll) { sweep(mk::CollOp::AllToAll); }

MP_TEST("multiprocess: 256 MiB of every collective", mpLarge) {
  useLocalDevice();
  const size_t bytes = 256u << 20;
  Buffer a(bytes), b(bytes);
  Env env;
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll}) {
    mk::CollectiveSpec spec;
    spec.op = op;
    spec.dtype = mk::DType::BFloat16;
    spec.redop = mk::RedOp::Sum;
    // The larger of the op's two buffers is 256 MiB.
    const uint64_t elems = bytes / 2;
    spec.count = (op == mk::CollOp::AllReduce || op == mk::CollOp::Broadcast) ? elems : elems / kRanks;
    // Both placements for all-reduce; one each for the others (alternating), to keep the CPU reference short.
    for (bool inPlace : {false, true}) {
      if (op != mk::CollOp::AllReduce && inPlace != (op == mk::CollOp::AllGather || op == mk::CollOp::Broadcast))
        continue;
      CAPTURE(mk::toString(op));
      CAPTURE(inPlace);
      CHECK(runCase(env, a, b, spec, inPlace, 77) == 0);
    }
  }
}

MP_TEST("multiprocess: back-to-back ops in a group reuse buffers", mpBackToBack) {
  // 200 in-place all-reduces of one buffer without a host round trip: the fence rule and the post board
  // (ring slots reused three times over) must keep them in order on both processes.
  useLocalDevice();
  const uint64_t count = 4099;
  Buffer buf(count * 4), small(64);
  Env env;
  std::vector<float> ones(count, 1.0f);
  MK_CUDA_CHECK(cudaMemcpyAsync(buf.p, ones.data(), count * 4, cudaMemcpyHostToDevice, env.stream));
  const int ops = 200;
  mk::groupStart();
  for (int k = 0; k < ops; ++k)
    env.comm.allReduce(buf.p, buf.p, count, mk::DType::Float32, k % 2 ? mk::RedOp::Max : mk::RedOp::Sum, env.stream);
  mk::groupEnd();
  std::vector<float> got(count);
  MK_CUDA_CHECK(cudaMemcpyAsync(got.data(), buf.p, count * 4, cudaMemcpyDeviceToHost, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  // Sum doubles (2 ranks), max keeps: 100 doublings of 1.
  const float want = std::ldexp(1.0f, ops / 2);
  uint64_t bad = 0;
  for (float g : got) bad += g != want;
  CHECK(bad == 0);
  CHECK(env.comm.nextOpIndex() == static_cast<uint64_t>(ops));
  env.comm.synchronize();

  // Op rate of small ops (reported, like mk-bench: events around back-to-back ops in one group, after a
  // warm-up): 8-byte out-of-place all-reduces reusing their buffers, so every op is fenced on the previous.
  const float two[2] = {1.5f, -2.0f};
  MK_CUDA_CHECK(cudaMemcpyAsync(small.p, two, 8, cudaMemcpyHostToDevice, env.stream));
  for (int k = 0; k < 20; ++k)
    env.comm.allReduce(small.p, small.c() + 32, 2, mk::DType::Float32, mk::RedOp::Sum, env.stream);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  MK_CUDA_CHECK(cudaEventCreate(&e0));
  MK_CUDA_CHECK(cudaEventCreate(&e1));
  const int reps = 1000;
  MK_CUDA_CHECK(cudaEventRecord(e0, env.stream));
  mk::groupStart();
  for (int k = 0; k < reps; ++k)
    env.comm.allReduce(small.p, small.c() + 32, 2, mk::DType::Float32, mk::RedOp::Sum, env.stream);
  mk::groupEnd();
  MK_CUDA_CHECK(cudaEventRecord(e1, env.stream));
  float back[2] = {0, 0};
  MK_CUDA_CHECK(cudaMemcpyAsync(back, small.c() + 32, 8, cudaMemcpyDeviceToHost, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  float ms = 0;
  MK_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  std::printf("rank %d: %d back-to-back 8-byte all-reduces (multi-process): %.2f us per op; topology: %s\n",
              env.comm.rank(), reps, 1000.0 * ms / reps, env.comm.topologySource().c_str());
  CHECK(back[0] == 3.0f);
  CHECK(back[1] == -4.0f);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

MP_TEST("multiprocess: a peer that never submits yields an error within budget", mpNeverSubmits) {
  mk::CommConfig c;
  c.pollBudgetMs = 300;
  c.hostBudgetMs = 3000;
  useLocalDevice();
  Buffer buf(4096);
  mk::Communicator comm = mk::Communicator::createFromEnvironment(c);
  MK_CUDA_CHECK(cudaSetDevice(comm.device()));
  cudaStream_t s = nullptr;
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (comm.rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    comm.allReduce(buf.p, buf.p, 64, mk::DType::Float32, mk::RedOp::Sum, s);  // returns: never blocks on rank 1
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
    std::string msg;
    try {
      comm.synchronize();
    } catch (const mk::Error& e) {
      msg = e.message();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank 0 after %.2f s: %s\n", secs, msg.c_str());
    CHECK(secs < 3.5);
    CHECK(msg.find("rank(s) 1") != std::string::npos);
    // The stream was released (its wait never hangs) and the communicator stays unusable.
    MK_CUDA_CHECK(cudaStreamSynchronize(s));
    CHECK_THROWS_AS(comm.allReduce(buf.p, buf.p, 64, mk::DType::Float32, mk::RedOp::Sum, s), mk::Error);
  } else {
    // Rank 1 never submits; once rank 0's kernel gave up, every call here reports rank 0's story.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::string msg;
    try {
      comm.synchronize();
      comm.allReduce(buf.p, buf.p, 64, mk::DType::Float32, mk::RedOp::Sum, s);
    } catch (const mk::Error& e) {
      msg = e.message();
    }
    std::printf("rank 1: %s\n", msg.c_str());
    CHECK(msg.find("op 0") != std::string::npos);
  }
  cudaStreamDestroy(s);
}

MP_TEST("multiprocess: a peer process that dies yields an error within budget", mpPeerDies) {
  mk::CommConfig c;
  c.pollBudgetMs = 300;
  c.hostBudgetMs = 3000;
  useLocalDevice();
  Buffer buf(4096);
  mk::Communicator comm = mk::Communicator::createFromEnvironment(c);
  if (comm.rank() == 1) {
    std::fflush(stdout);
    std::_Exit(0);  // dies with a live communicator: no destructor, no goodbye
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  cudaStream_t s = nullptr;
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    comm.allReduce(buf.p, buf.p, 64, mk::DType::Float32, mk::RedOp::Sum, s);
    comm.synchronize();
  } catch (const mk::Error& e) {
    msg = e.message();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank 0 after %.2f s: %s\n", secs, msg.c_str());
  CHECK(secs < 3.5);
  CHECK(msg.find("rank(s) 1") != std::string::npos);
  MK_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
}

MP_TEST("multiprocess: ranks submitting different ops get an error naming both", mpMismatch) {
  mk::CommConfig c;
  c.pollBudgetMs = 2000;
  c.hostBudgetMs = 5000;
  useLocalDevice();
  Buffer buf(1 << 16);
  mk::Communicator comm = mk::Communicator::createFromEnvironment(c);
  MK_CUDA_CHECK(cudaSetDevice(comm.device()));
  cudaStream_t s = nullptr;
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::string msg;
  try {
    comm.allReduce(buf.p, buf.p, comm.rank() == 0 ? 64 : 128, mk::DType::Float32, mk::RedOp::Sum, s);
    comm.synchronize();
  } catch (const mk::Error& e) {
    msg = e.message();
  }
  std::printf("rank %d: %s\n", comm.rank(), msg.c_str());
  CHECK(
      (msg.find("differs between ranks") != std::string::npos || msg.find("stopped by the host") != std::string::npos));
  MK_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
}

MP_TEST("multiprocess: pool memory and bad pointers are refused with a clear error", mpBadInput) {
  useLocalDevice();
  Buffer ok(4096);
  Env env;
  void* pool = nullptr;
  MK_CUDA_CHECK(cudaMallocAsync(&pool, 4096, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  try {
    env.comm.allReduce(pool, ok.p, 16, mk::DType::Float32, mk::RedOp::Sum, env.stream);
    FAIL("pool memory accepted");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    CHECK(std::string(e.message()).find("cudaMalloc") != std::string::npos);
  }
  CHECK_THROWS_AS(env.comm.allReduce(nullptr, ok.p, 16, mk::DType::Float32, mk::RedOp::Sum, env.stream), mk::Error);
  CHECK_THROWS_AS(env.comm.allReduce(ok.c() + 1, ok.p, 16, mk::DType::Float32, mk::RedOp::Sum, env.stream), mk::Error);
  // Refusals happen before anything is enqueued: the communicator still works.
  std::vector<float> v(16, 1.0f);
  MK_CUDA_CHECK(cudaMemcpyAsync(ok.p, v.data(), 64, cudaMemcpyHostToDevice, env.stream));
  env.comm.allReduce(ok.p, ok.p, 16, mk::DType::Float32, mk::RedOp::Sum, env.stream);
  MK_CUDA_CHECK(cudaMemcpyAsync(v.data(), ok.p, 64, cudaMemcpyDeviceToHost, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  CHECK(v[0] == 2.0f);
  CHECK(v[15] == 2.0f);
  MK_CUDA_CHECK(cudaFreeAsync(pool, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
}

TEST_CASE("multiprocess: createFromEnvironment names a LOCAL_RANK beyond the GPUs") {
  if (mkt::isRankProcess()) return;
  int count = 0;
  MK_CUDA_CHECK(cudaGetDeviceCount(&count));
  const std::string local = std::to_string(count);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", local.c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "1", 1);
  setenv("RANK", "0", 1);
  std::string msg;
  try {
    mk::Communicator::createFromEnvironment();
  } catch (const mk::Error& e) {
    msg = e.message();
  }
  for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(k);
  CHECK(msg.find("LOCAL_RANK " + local) != std::string::npos);
}

TEST_CASE("multiprocess: one rank through a bootstrap runs collectives") {
  if (mkt::isRankProcess()) return;
  mk::TcpBootstrapOptions o;
  o.rank = 0;
  o.size = 1;
  o.port = 1;
  mk::TcpBootstrap boot(o);
  cudaStream_t s = nullptr;
  MK_CUDA_CHECK(cudaSetDevice(0));
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Buffer a(4096), b(4096);  // outlive the communicator (cudaFree waits for a resident kernel)
  {
    mk::Communicator comm = mk::Communicator::create(boot, 0);
    CHECK(comm.multiProcess());
    CHECK(comm.size() == 1);
    std::vector<float> v(100, 3.0f), got(100, 0.0f);
    MK_CUDA_CHECK(cudaMemcpyAsync(a.p, v.data(), 400, cudaMemcpyHostToDevice, s));
    comm.allReduce(a.p, b.p, 100, mk::DType::Float32, mk::RedOp::Sum, s);
    MK_CUDA_CHECK(cudaMemcpyAsync(got.data(), b.p, 400, cudaMemcpyDeviceToHost, s));
    MK_CUDA_CHECK(cudaStreamSynchronize(s));
    CHECK(got[0] == 3.0f);
    CHECK(got[99] == 3.0f);
    comm.synchronize();
  }
  cudaStreamDestroy(s);
}

TEST_CASE("topology: NVML counts the NVLinks between the two GPUs") {
  if (mkt::isRankProcess()) return;
  char a[32] = {}, b[32] = {};
  MK_CUDA_CHECK(cudaDeviceGetPCIBusId(a, sizeof a, 0));
  MK_CUDA_CHECK(cudaDeviceGetPCIBusId(b, sizeof b, 1));
  const mk::runtime::NvlinkProbe p = mk::runtime::probeNvlinks(a, {b});
  std::printf("GPU %s: NVML %s, %u active NVLinks, %u to GPU %s\n", a, p.available ? "answered" : p.why.c_str(),
              p.activeLinks, p.linksToPeer.empty() ? 0u : p.linksToPeer[0], b);
  REQUIRE(p.available);
  REQUIRE(p.linksToPeer.size() == 1);
  CHECK(p.linksToPeer[0] <= p.activeLinks);
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (p.activeLinks > 0) {
    // The local topology's NVLink bandwidth comes from the count (the h200x2 pair keeps its measured preset).
    mk::Topology t = mk::topologyPreset("dgx-h200");
    const std::string summary = mk::runtime::applyNvlinkProbes(t, {p, p}, prop.major);
    CHECK(summary.find(std::to_string(p.activeLinks) + " NVLinks per GPU") == 0);
    CHECK(t.node.nvlink.bwGBs == doctest::Approx(p.activeLinks * mk::runtime::nvlinkGBsPerLink(prop.major)));
    CHECK(t.node.nvlink.switched == (p.activeLinks > p.linksToPeer[0]));
  }
  auto comms = mk::Communicator::createLocal({0, 1});
  std::printf("createLocal topology: %s\n", comms[0].topologySource().c_str());
  CHECK(comms[0].topologySource().find("NVML: ") != std::string::npos);
}
