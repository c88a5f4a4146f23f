// Test helpers of the multi-process GPU tests (one process per rank): device buffers, inputs every process can
// compute for every rank, one collective run on this rank checked element-wise against the CPU reference, and the
// set-up of rank processes sharing one GPU as "nodes" (CUDA MPS).
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify.hpp"
#include "multiprocess_launch.hpp"

namespace mkt {

/// Device memory from cudaMalloc (exportable through CUDA IPC); freed only after the communicator is gone.
struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t b) : bytes(b) { MK_CUDA_CHECK(cudaMalloc(&p, b)); }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* c() const { return static_cast<char*>(p); }
};

/// Input value i of rank r: small integers (every sum exact in every dtype), a cheap hash so 256 MiB
/// inputs cost little; every process can compute every rank's input.
inline float inputValue(uint64_t seed, uint32_t r, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull) ^ (uint64_t{r} << 56);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int>(x % 17) - 8);
}

/// Make LOCAL_RANK's GPU current (buffers are allocated before the communicator, so that they are freed
/// after it: cudaFree waits for a resident kernel).
inline int useLocalDevice() {
  // Under mpirun there are no rendezvous variables: the launcher's node rank picks the GPU.
  const int dev = mk::launchLocalRank();
  MK_CUDA_CHECK(cudaSetDevice(dev));
  return dev;
}

struct Env {
  mk::Communicator comm;
  cudaStream_t stream = nullptr;
  explicit Env(const mk::CommConfig& c = config()) : comm(mk::Communicator::createFromEnvironment(c)) {
    MK_CUDA_CHECK(cudaSetDevice(comm.device()));
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Env() { cudaStreamDestroy(stream); }
  static mk::CommConfig config() {
    mk::CommConfig c;
    c.pollBudgetMs = 5000;
    c.hostBudgetMs = 20000;
    return c;
  }
};

/// The configuration of a rank process of the one-GPU inter-node tests: `ranksPerNode`-rank "nodes" sharing the GPU,
/// joined by the proxy's socket transport, with the given budgets.
inline mk::CommConfig sharedGpuNodesConfig(uint32_t ranksPerNode, double pollBudgetMs, double hostBudgetMs) {
  mk::CommConfig c = Env::config();
  c.ranksPerNode = ranksPerNode;
  c.shareGpus = true;
  c.transport = mk::ProxyTransport::Socket;
  c.pollBudgetMs = pollBudgetMs;
  c.hostBudgetMs = hostBudgetMs;
  return c;
}

/// CUDA MPS is running for this user: its control pipe exists (CUDA_MPS_PIPE_DIRECTORY or the default). Without it,
/// several processes' resident kernels cannot run on one GPU at once.
inline bool mpsRunning() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string pipe = std::string(dir ? dir : "/tmp/nvidia-mps") + "/control";
  struct stat st {};
  return ::stat(pipe.c_str(), &st) == 0;
}

/// In a launcher of rank processes sharing one GPU: skip the case (exit 77, ctest's skip) unless MPS runs, saying why.
inline void skipWithoutMps() {
  if (mpsRunning()) return;
  MESSAGE(
      "CUDA MPS is not running (start nvidia-cuda-mps-control -d, or use impl/tools/launch_ranks.sh --mps): "
      "several processes' resident kernels cannot share one GPU without it");
  std::exit(77);
}

/// In the launcher of a one-GPU case: run this binary's test case `name` as `ranks` processes sharing GPU 0
/// (skipped, exit 77, without MPS when `needMps`; one process needs none), CHECK that every one exited 0, and return
/// true. In a rank process: false, and the caller runs the case's body.
inline bool launchOnSharedGpu(const char* name, int ranks, double timeoutS, bool needMps = true) {
  if (isRankProcess()) return false;
  if (needMps) skipWithoutMps();
  const auto codes = execRanks(ranks, name, timeoutS, {}, /*gpus=*/1);
  for (size_t r = 0; r < codes.size(); ++r) {
    CAPTURE(r);
    CHECK(codes[r] == 0);
  }
  return true;
}

/// Run one collective on this rank (buffers given), compare every output element with the CPU reference.
inline uint64_t runCase(Env& env, Buffer& a, Buffer& b, const mk::CollectiveSpec& spec, bool inPlace, uint64_t seed,
                        const mk::CollOptions& opt = {}) {
  const uint32_t n = static_cast<uint32_t>(env.comm.size());
  const uint32_t r = static_cast<uint32_t>(env.comm.rank());
  const mk::DType dt = spec.dtype;
  const uint64_t es = mk::dtypeSize(dt);
  const uint64_t inCount = mk::inputCount(spec, n), outCount = mk::outputCount(spec, n);
  std::vector<std::vector<float>> inputs(n, std::vector<float>(inCount));
  for (uint32_t q = 0; q < n; ++q)
    for (uint64_t i = 0; i < inCount; ++i) inputs[q][i] = inputValue(seed, q, i);
  const auto expected = mk::referenceCollective(spec, n, inputs);
  std::vector<uint8_t> bytes(inCount * es);
  for (uint64_t i = 0; i < inCount; ++i) mk::storeElement(dt, bytes.data(), i, inputs[r][i]);

  uint64_t inOffset = 0, outOffset = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  {
    // NaN in every dtype: unwritten cannot pass. A copy, not a memset: a memset may run as a kernel, and under
    // compute-sanitizer (one kernel at a time) no kernel runs beside the resident one.
    const std::vector<uint8_t> nan(b.bytes, 0xFF);
    MK_CUDA_CHECK(cudaMemcpyAsync(b.p, nan.data(), nan.size(), cudaMemcpyHostToDevice, env.stream));
    MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  }
  if (inPlace) {
    if (spec.op == mk::CollOp::AllGather) inOffset = uint64_t{r} * spec.count * es;
    if (spec.op == mk::CollOp::ReduceScatter) outOffset = uint64_t{r} * spec.count * es;
    REQUIRE(std::max(outCount * es + outOffset, inCount * es + inOffset) <= b.bytes);
    MK_CUDA_CHECK(cudaMemcpyAsync(b.c() + inOffset, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, env.stream));
    send = b.c() + inOffset;
    recv = b.c() + outOffset;
  } else {
    REQUIRE(inCount * es <= a.bytes);
    REQUIRE(outCount * es <= b.bytes);
    MK_CUDA_CHECK(cudaMemcpyAsync(a.p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, env.stream));
    send = a.p;
    recv = b.p;
  }
  switch (spec.op) {
    case mk::CollOp::AllReduce: env.comm.allReduce(send, recv, spec.count, dt, spec.redop, env.stream, opt); break;
    case mk::CollOp::AllGather: env.comm.allGather(send, recv, spec.count, dt, env.stream, opt); break;
    case mk::CollOp::ReduceScatter:
      env.comm.reduceScatter(send, recv, spec.count, dt, spec.redop, env.stream, opt);
      break;
    case mk::CollOp::Broadcast: env.comm.broadcast(send, recv, spec.count, dt, spec.root, env.stream, opt); break;
    case mk::CollOp::AllToAll: env.comm.allToAll(send, recv, spec.count, dt, env.stream, opt); break;
  }
  std::vector<uint8_t> got(outCount * es);
  MK_CUDA_CHECK(cudaMemcpyAsync(got.data(), recv, got.size(), cudaMemcpyDeviceToHost, env.stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(env.stream));
  uint64_t bad = 0;
  for (uint64_t i = 0; i < outCount; ++i) {
    const float g = mk::loadElement(dt, got.data(), i);
    const float e = expected[r][i];
    if (!(g == e && std::signbit(g) == std::signbit(e))) {
      if (bad < 3) {
        CAPTURE(r);
        CAPTURE(i);
        CAPTURE(g);
        CAPTURE(e);
        CHECK(g == e);
      }
      ++bad;
    }
  }
  return bad;
}

}  // namespace mkt
