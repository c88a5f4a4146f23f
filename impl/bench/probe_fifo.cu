// mk-probe-fifo — the GPU -> CPU command FIFO measured alone on this machine (docs/inter-node.md, "Measurements").
//
//   latency  one GPU thread pushes a command with the engine's own protocol (claim the head, publishCommand: arg,
//            system fence, header last with release) and spins on a host-mapped answer word; a host thread polls
//            the FIFO with the proxy's FifoConsumer, writes the answer (release) and completes the position. The
//            round trip is timed on the GPU (%globaltimer); half of it is reported as "push -> proxy sees" (its
//            other half, a host store seen by a polling GPU, is the same kind of PCIe hand-off).
//   drain    P CTAs push N commands as fast as the protocol allows (back-pressure through `done`, as the engine's
//            ProxyPut steps); one host thread drains them with FifoConsumer::poll / complete in batches, as the
//            proxy's consumer loop does before it sends anything. Commands per second over the host's time from
//            the first command seen to the last completed.
//
//   mk-probe-fifo [--rounds N] [--commands N] [--pushers P] [--capacity C] [--json f]
//
// Exit 0, or 2 with one line on stderr when the machine cannot run it (no GPU, a timeout).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device/proxy_device.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/proxy/fifo.hpp"

namespace {

using mk::device::globalTimerNs;
using mk::device::loadVolatile;
using mk::device::ProxyFifoDeviceHandle;
using mk::device::ProxyKind;

constexpr uint64_t kBudgetNs = 5'000'000'000ull;  // every device spin gives up after 5 s
constexpr double kBudgetS = 10;                   // every host spin after 10 s

/// Claim the next position, waiting (bounded) while the ring is full; UINT64_MAX on timeout.
__device__ uint64_t claim(const ProxyFifoDeviceHandle& f) {
  const uint64_t pos = atomicAdd(reinterpret_cast<unsigned long long*>(f.head), 1ull);
  uint64_t seen = loadVolatile(f.doneCache);
  if (pos - seen >= f.capacity) {
    const uint64_t t0 = globalTimerNs();
    while ((seen = loadVolatile(f.done)) + f.capacity <= pos)
      if (globalTimerNs() - t0 > kBudgetNs) return UINT64_MAX;
    atomicMax(reinterpret_cast<unsigned long long*>(f.doneCache), static_cast<unsigned long long>(seen));
  }
  return pos;
}

__global__ void pushLatencyKernel(ProxyFifoDeviceHandle f, const uint64_t* answer, uint32_t rounds, uint64_t* times,
                                  int* failed) {
  for (uint32_t i = 0; i < rounds; ++i) {
    const uint64_t t0 = globalTimerNs();
    const uint64_t pos = claim(f);
    if (pos == UINT64_MAX) return void(*failed = 1);
    mk::device::publishCommand(f, pos, mk::device::packProxyHeader(ProxyKind::Flush, 0, 0, i), i);
    while (loadVolatile(answer) <= pos)
      if (globalTimerNs() - t0 > kBudgetNs) return void(*failed = 2);
    times[i] = globalTimerNs() - t0;
  }
}

__global__ void pushManyKernel(ProxyFifoDeviceHandle f, uint64_t perCta, int* failed) {
  if (threadIdx.x != 0) return;
  for (uint64_t i = 0; i < perCta; ++i) {
    const uint64_t pos = claim(f);
    if (pos == UINT64_MAX) return void(*failed = 1);
    mk::device::publishCommand(f, pos, mk::device::packProxyHeader(ProxyKind::Flush, 0, blockIdx.x, 0), i);
  }
}

/// A FIFO in host-mapped pinned memory (ring, done, answer) with head and doneCache in device memory.
struct MappedFifo {
  mk::device::ProxyCommand* ring = nullptr;
  uint64_t* hostWords = nullptr;  ///< [0] done, [1] answer
  uint64_t* devWords = nullptr;   ///< [0] head, [1] doneCache
  uint32_t capacity;
  explicit MappedFifo(uint32_t cap) : capacity(cap) {
    MK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ring), cap * sizeof *ring, cudaHostAllocMapped));
    MK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&hostWords), 2 * sizeof(uint64_t), cudaHostAllocMapped));
    MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&devWords), 2 * sizeof(uint64_t)));
    reset();
  }
  ~MappedFifo() {
    cudaFreeHost(ring);
    cudaFreeHost(hostWords);
    cudaFree(devWords);
  }
  void reset() {
    std::fill(ring, ring + capacity, mk::device::ProxyCommand{});
    hostWords[0] = hostWords[1] = 0;
    MK_CUDA_CHECK(cudaMemset(devWords, 0, 2 * sizeof(uint64_t)));
  }
  ProxyFifoDeviceHandle handle() {
    ProxyFifoDeviceHandle h{};
    MK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&h.ring), ring, 0));
    uint64_t* words = nullptr;
    MK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&words), hostWords, 0));
    h.done = words;
    h.head = devWords;
    h.doneCache = devWords + 1;
    h.capacity = capacity;
    return h;
  }
  const uint64_t* deviceAnswer() {
    uint64_t* words = nullptr;
    MK_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&words), hostWords, 0));
    return words + 1;
  }
};

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void fail(const std::string& what) { throw mk::Error(mk::ErrorCode::Timeout, what); }

/// Median, p10, p90 of the push -> proxy-sees estimates (half round trips), in microseconds.
std::vector<double> latency(MappedFifo& fifo, uint32_t rounds) {
  fifo.reset();
  uint64_t* times = nullptr;
  int* failed = nullptr;
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&times), rounds * sizeof(uint64_t)));
  MK_CUDA_CHECK(cudaMallocManaged(reinterpret_cast<void**>(&failed), sizeof(int)));
  *failed = 0;
  mk::proxy::FifoConsumer consumer(fifo.ring, &fifo.hostWords[0], fifo.capacity);
  pushLatencyKernel<<<1, 1>>>(fifo.handle(), fifo.deviceAnswer(), rounds, times, failed);
  MK_CUDA_CHECK(cudaGetLastError());
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < rounds;) {
    mk::proxy::PoppedCommand c;
    if (consumer.poll(&c, 1) == 0) {
      if (seconds(t0) > kBudgetS)
        fail("latency: the host saw " + std::to_string(i) + " of " + std::to_string(rounds) + " commands within " +
             std::to_string(kBudgetS) + " s");
      continue;
    }
    __atomic_store_n(&fifo.hostWords[1], c.position + 1, __ATOMIC_RELEASE);
    consumer.complete(c.position + 1);
    ++i;
  }
  MK_CUDA_CHECK(cudaDeviceSynchronize());
  if (*failed) fail("latency: the GPU timed out waiting (code " + std::to_string(*failed) + ")");
  std::vector<uint64_t> ns(rounds);
  MK_CUDA_CHECK(cudaMemcpy(ns.data(), times, rounds * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  cudaFree(times);
  cudaFree(failed);
  std::vector<double> halfUs;
  for (uint32_t i = rounds / 10; i < rounds; ++i) halfUs.push_back(static_cast<double>(ns[i]) / 2e3);  // skip warmup
  return halfUs;
}

/// Commands per second one host consumer drains while `pushers` CTAs push `commands` in total.
double drain(MappedFifo& fifo, uint64_t commands, uint32_t pushers, uint32_t batch) {
  fifo.reset();
  int* failed = nullptr;
  MK_CUDA_CHECK(cudaMallocManaged(reinterpret_cast<void**>(&failed), sizeof(int)));
  *failed = 0;
  const uint64_t perCta = commands / pushers;
  const uint64_t total = perCta * pushers;
  mk::proxy::FifoConsumer consumer(fifo.ring, &fifo.hostWords[0], fifo.capacity);
  std::vector<mk::proxy::PoppedCommand> got(batch);
  pushManyKernel<<<pushers, 32>>>(fifo.handle(), perCta, failed);
  MK_CUDA_CHECK(cudaGetLastError());
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first{};
  uint64_t seen = 0;
  while (seen < total) {
    const std::size_t n = consumer.poll(got.data(), batch);
    if (n == 0) {
      if (seconds(t0) > kBudgetS)
        fail("drain: the host saw " + std::to_string(seen) + " of " + std::to_string(total) + " commands within " +
             std::to_string(kBudgetS) + " s");
      continue;
    }
    if (seen == 0) first = std::chrono::steady_clock::now();
    seen += n;
    consumer.complete(got[n - 1].position + 1);
  }
  const double s = seconds(first);
  MK_CUDA_CHECK(cudaDeviceSynchronize());
  if (*failed) fail("drain: a GPU pusher timed out on a full ring");
  cudaFree(failed);
  return static_cast<double>(total - 1) / s;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t rounds = 20000, pushers = 1, capacity = 1024, batch = 64, reps = 5;
  uint64_t commands = 2000000;
  std::string json;
  CLI::App app{"mk-probe-fifo: the GPU -> CPU command FIFO alone: push -> proxy-sees latency and drain rate"};
  app.add_option("--rounds", rounds, "latency round trips (the first tenth is warmup)")->capture_default_str();
  app.add_option("--commands", commands, "commands per drain run")->capture_default_str();
  app.add_option("--pushers", pushers, "CTAs pushing at once in the drain runs")->capture_default_str();
  app.add_option("--capacity", capacity, "FIFO slots (a power of two)")->capture_default_str();
  app.add_option("--batch", batch, "commands the consumer takes per poll")->capture_default_str();
  app.add_option("--reps", reps, "drain runs (the median is reported)")->capture_default_str();
  app.add_option("--json", json, "write the measurement file (mkernel.measurement.v1)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string command = "mk-probe-fifo";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  try {
    if (rounds < 10 || commands == 0 || pushers == 0 || batch == 0 || reps == 0)
      throw mk::Error(mk::ErrorCode::InvalidArgument,
                      "--rounds must be >= 10 and --commands, --pushers, --batch, --reps > 0");
    if (capacity < 2 || (capacity & (capacity - 1)) != 0)
      throw mk::Error(mk::ErrorCode::InvalidArgument, "--capacity must be a power of two >= 2");
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      throw mk::Error(mk::ErrorCode::Unsupported, "no CUDA device");
    MK_CUDA_CHECK(cudaSetDevice(0));
    MappedFifo fifo(capacity);
    const std::vector<double> half = latency(fifo, rounds);
    const double med = mkbench::median(half), p10 = mkbench::percentile(half, 0.1),
                 p90 = mkbench::percentile(half, 0.9);
    std::printf("push -> proxy sees (half round trip)  median %8.3f  p10 %8.3f  p90 %8.3f  us  (%zu rounds)\n", med,
                p10, p90, half.size());
    std::vector<double> rates;
    for (uint32_t r = 0; r < reps; ++r) rates.push_back(drain(fifo, commands, pushers, batch));
    const double rate = mkbench::median(rates);
    std::printf(
        "drain, device-fed, one consumer       median %8.2f M commands/s  (%u pusher CTA(s), %llu commands, "
        "batch %u, capacity %u, %u runs)\n",
        rate / 1e6, pushers, static_cast<unsigned long long>(commands), batch, capacity, reps);
    if (!json.empty()) {
      mk::MeasurementFile mf = mkbench::newMeasurementFile(1, "", command);
      mk::MeasurementRecord m;
      m.op = "fifo-push-seen";
      m.impl = "mkernel";
      m.algo = "half round trip";
      m.dtype = "none";
      m.ranks = 1;
      m.bytes = 16;
      m.timeUs = med;
      m.iters = half.size();
      m.stat = "median";
      m.extra["p10_us"] = std::to_string(p10);
      m.extra["p90_us"] = std::to_string(p90);
      mf.records.push_back(m);
      m = {};
      m.op = "fifo-drain";
      m.impl = "mkernel";
      m.algo = "device-fed";
      m.dtype = "none";
      m.ranks = 1;
      m.bytes = 16;
      m.timeUs = 1e6 / rate;  // per command
      m.iters = commands;
      m.stat = "median";
      m.extra["commands_per_s"] = std::to_string(rate);
      m.extra["pushers"] = std::to_string(pushers);
      m.extra["batch"] = std::to_string(batch);
      m.extra["capacity"] = std::to_string(capacity);
      mf.records.push_back(m);
      mk::saveMeasurementFile(mf, json);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-probe-fifo: %s\n", e.what());
    return 2;
  }
}
