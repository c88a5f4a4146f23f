// mk-probe-latency — the latency floors the resident engine is built on, measured on this machine.
//
// The engine's small-op time is a chain of hand-offs: host -> GPU (doorbell), stream front end -> kernel
// (stream memory write), kernel -> stream (completion a stream memory wait polls), CTA -> CTA on one GPU,
// GPU -> GPU over NVLink, and the fences that order data before flags. Each probe below isolates one
// hand-off with nothing else running, so an op's measured time can be read against the sum of its floors
// (docs/gpu-engine.md, "Latency"). One line per probe: median, p10, p90 in microseconds.
//
//   mk-probe-latency [--rounds N] [--gpus 2]
//
// Exit 0, or 2 with one line on stderr when the machine cannot run a probe (no GPU, no peer access).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/driver_api.hpp"
#include "mk/communicator.hpp"
#include "mk/device/poll_device.hpp"
#include "mk/graph.hpp"
#include "mk/util/format.hpp"
#include "mk/util/stats.hpp"

namespace {

using mk::device::globalTimerNs;
using mk::device::loadVolatile;

constexpr uint64_t kBudgetNs = 2'000'000'000ull;  // every device spin gives up after 2 s

#define PROBE_CHECK(x)                                                                       \
  do {                                                                                       \
    const cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "mk-probe-latency: %s failed: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

double hostNs() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

struct Stats {
  double median = 0, p10 = 0, p90 = 0;
};
Stats stats(const std::vector<double>& v) { return {mk::median(v), mk::quantile(v, 0.1), mk::quantile(v, 0.9)}; }
void print(const char* name, const Stats& s, const char* note) {
  std::printf("%-44s median %8.3f  p10 %8.3f  p90 %8.3f  us  %s\n", name, s.median, s.p10, s.p90, note);
  std::fflush(stdout);
}

__device__ __forceinline__ void storeVolatile(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- kernels ------------------------------------------------------------------------------------------

/// Echo: wait until *in >= i, then *out = i, for i = 1..rounds. mode 0: volatile store, 1: release store
/// (system scope), 2: volatile store followed by a system fence.
__global__ void echoKernel(const uint32_t* in, uint32_t* out, uint32_t rounds, int mode, uint64_t delayNs = 0) {
  if (threadIdx.x != 0) return;
  for (uint32_t i = 1; i <= rounds; ++i) {
    const uint64_t t0 = globalTimerNs();
    // >= (cyclic): a write-only stream may move on several values between two polls.
    while (!mk::device::seqGeq(loadVolatile(in), i))
      if (globalTimerNs() - t0 > kBudgetNs) return;
    // An op of delayNs: the stream's wait is pending that long before it is satisfied.
    const uint64_t seen = globalTimerNs();
    while (globalTimerNs() - seen < delayNs) {
    }
    if (mode == 1) {
      mk::device::storeRelease(out, i);
    } else {
      storeVolatile(out, i);
      if (mode == 2) mk::device::fenceSys();
    }
  }
}

/// What a tiny per-op kernel on the caller's stream would do instead of two stream memory operations: ring
/// (A = i), then hold the stream until the echo (B >= i).
__global__ void ringAndWaitKernel(uint32_t* a, const uint32_t* b, uint32_t i) {
  if (threadIdx.x != 0) return;
  mk::device::storeRelaxed(a, i);
  const uint64_t t0 = globalTimerNs();
  while (!mk::device::seqGeq(loadVolatile(b), i))
    if (globalTimerNs() - t0 > kBudgetNs) return;
}

/// GPU <-> GPU ping-pong over NVLink. Rank 0 sends i to the peer's word and waits for the echo; the round trip
/// is timed on rank 0's clock and written to times[i]. mode as echoKernel.
__global__ void pingPongKernel(uint32_t* mine, uint32_t* peers, uint32_t rounds, int mode, int initiator,
                               uint64_t* times) {
  if (threadIdx.x != 0) return;
  for (uint32_t i = 1; i <= rounds; ++i) {
    const uint64_t t0 = globalTimerNs();
    if (initiator) {
      if (mode == 1)
        mk::device::storeRelease(peers, i);
      else
        storeVolatile(peers, i);
      if (mode == 2) mk::device::fenceSys();
    }
    while (loadVolatile(mine) != i)
      if (globalTimerNs() - t0 > kBudgetNs) return;
    if (!initiator) {
      if (mode == 1)
        mk::device::storeRelease(peers, i);
      else
        storeVolatile(peers, i);
      if (mode == 2) mk::device::fenceSys();
    } else {
      times[i - 1] = globalTimerNs() - t0;
    }
  }
}

/// CTA <-> CTA ping-pong on one GPU (block 0 initiates; block 1 echoes). mode 0: volatile, 1: release.gpu.
__global__ void ctaPingPongKernel(uint32_t* words, uint32_t rounds, int mode, uint64_t* times) {
  if (threadIdx.x != 0) return;
  uint32_t* mine = words + 32 * blockIdx.x;  // separate 128-byte lines
  uint32_t* other = words + 32 * (1 - blockIdx.x);
  for (uint32_t i = 1; i <= rounds; ++i) {
    const uint64_t t0 = globalTimerNs();
    if (blockIdx.x == 0) {
      if (mode == 1)
        mk::device::storeReleaseGpu(other, i);
      else
        storeVolatile(other, i);
    }
    while (loadVolatile(mine) != i)
      if (globalTimerNs() - t0 > kBudgetNs) return;
    if (blockIdx.x == 1) {
      if (mode == 1)
        mk::device::storeReleaseGpu(other, i);
      else
        storeVolatile(other, i);
    } else {
      times[i - 1] = globalTimerNs() - t0;
    }
  }
}

/// Cost of one system-scope fence after `kind` of store: 0 none, 1 own device memory, 2 peer memory,
/// 3 host-mapped memory; also the GPU-scope fence after an own-memory store (kind 4).
__global__ void fenceCostKernel(uint32_t* own, uint32_t* peer, uint32_t* host, uint32_t rounds, int kind,
                                uint64_t* times) {
  if (threadIdx.x != 0) return;
  for (uint32_t i = 0; i < rounds; ++i) {
    uint32_t* target = kind == 2 ? peer : kind == 3 ? host : own;
    if (kind != 0) storeVolatile(target, i);
    const uint64_t t0 = globalTimerNs();
    if (kind == 4)
      mk::device::fenceGpu();
    else
      mk::device::fenceSys();
    times[i] = globalTimerNs() - t0;
  }
}

void toUs(const std::vector<uint64_t>& ns, std::vector<double>* out) {
  out->clear();
  for (const uint64_t v : ns) out->push_back(static_cast<double>(v) / 1e3);
}

/// 7. The engine itself: back-to-back 8-byte all-reduces on GPUs 0 and 1 (with one GPU: two ranks sharing GPU 0,
/// so no NVLink is crossed), per-op stage times from the kernel's %globaltimer stamps (OpTiming), in three
/// submission modes; with `trace`, also where each step of rank 0 starts and ends relative to the op's publication.
void engineBreakdown(uint32_t ops, bool trace, mk::StreamHandoff handoff, int gpus) {
  mk::CommConfig cfg;
  cfg.trace = trace;
  cfg.streamHandoff = handoff;
  cfg.shareGpus = gpus < 2;
  const std::vector<int> devs = gpus < 2 ? std::vector<int>{0, 0} : std::vector<int>{0, 1};
  auto comms = mk::Communicator::createLocal(devs, cfg);
  std::vector<cudaStream_t> st(2);
  std::vector<float*> buf(2);
  std::vector<mk::ClockSync> cs;
  for (int r = 0; r < 2; ++r) {
    PROBE_CHECK(cudaSetDevice(devs[static_cast<size_t>(r)]));
    PROBE_CHECK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    PROBE_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf[r]), 256));
    // Never cudaDeviceSynchronize / cudaMemset here: the resident kernel runs until the communicator goes.
    PROBE_CHECK(cudaMemsetAsync(buf[r], 0, 256, st[r]));
    PROBE_CHECK(cudaStreamSynchronize(st[r]));
    cs.push_back(comms[r].calibrateClock(200));
  }
  PROBE_CHECK(cudaSetDevice(0));
  std::printf("# engine%s%s, stream hand-off %s: %s, %u worker CTAs, algorithm %s for 8 B, clock sync +-%.2f us\n",
              trace ? " (trace on)" : "", gpus < 2 ? " (2 ranks sharing GPU 0)" : "",
              handoff == mk::StreamHandoff::Kernel ? "kernel" : "memops", comms[0].topology().name.c_str(),
              comms[0].workerCtas(),
              mk::toString(comms[0].chooseAlgorithm(mk::CollOp::AllReduce, 2, mk::DType::Float32)),
              std::max(cs[0].uncertaintyNs, cs[1].uncertaintyNs) / 1e3);
  std::vector<double> submitted;  // host time when op k was submitted on both ranks
  auto submit = [&] {
    for (int r = 0; r < 2; ++r) comms[r].allReduce(buf[r], buf[r] + 16, 2, mk::DType::Float32, mk::RedOp::Sum, st[r]);
    submitted.push_back(hostNs());
  };
  for (int i = 0; i < 20; ++i) submit();  // warm-up: generation, lowering and upload happen once
  for (auto& c : comms) c.synchronize();
  if (trace)
    for (auto& c : comms) c.takeTrace();
  static const char* modes[] = {"stream wait per op", "group (one wait at the end)", "isolated (host sync per op)",
                                "replayed graph (the group captured, one launch per rank)"};
  const uint32_t n = std::min<uint32_t>(ops, 60);  // stamps live ringSlots (64) ops
  // Mode 3 (kernel hand-off only: the memory-operation hand-off cannot be captured): the group of mode 1 captured
  // once, each rank's graph launched through mk::GraphExec (mk/graph.hpp).
  std::vector<mk::GraphExec> graphs;
  if (handoff == mk::StreamHandoff::Kernel) {
    std::vector<cudaGraph_t> g(2, nullptr);
    for (int r = 0; r < 2; ++r) PROBE_CHECK(cudaStreamBeginCapture(st[r], cudaStreamCaptureModeThreadLocal));
    mk::groupStart();
    for (uint32_t i = 0; i < n; ++i) submit();
    mk::groupEnd();
    for (int r = 0; r < 2; ++r) PROBE_CHECK(cudaStreamEndCapture(st[r], &g[r]));
    for (int r = 0; r < 2; ++r) {
      graphs.emplace_back(g[r]);
      PROBE_CHECK(cudaGraphDestroy(g[r]));
    }
    for (int r = 0; r < 2; ++r) graphs[r].launch(st[r]);  // warm-up: the graphs' first launch uploads them
    for (auto& c : comms) c.synchronize();
  }
  for (int mode = 0; mode < 4; ++mode) {
    if (mode == 3 && graphs.empty()) continue;
    const uint64_t first = comms[0].nextOpIndex();
    submitted.clear();
    PROBE_CHECK(cudaSetDevice(0));  // the communicator leaves the last rank's device current
    cudaEvent_t e0, e1;
    PROBE_CHECK(cudaEventCreate(&e0));
    PROBE_CHECK(cudaEventCreate(&e1));
    PROBE_CHECK(cudaEventRecord(e0, st[0]));
    if (mode == 1) mk::groupStart();
    double launchUs = 0;
    if (mode == 3) {
      const double t0 = hostNs();
      for (int r = 0; r < 2; ++r) graphs[r].launch(st[r]);
      launchUs = (hostNs() - t0) / 1e3;
      submitted.assign(n, t0);  // every op's host call is the launch
    }
    for (uint32_t i = 0; i < n && mode != 3; ++i) {
      submit();
      if (mode == 2)
        for (auto& c : comms) c.synchronize();
    }
    if (mode == 1) mk::groupEnd();
    PROBE_CHECK(cudaEventRecord(e1, st[0]));
    PROBE_CHECK(cudaEventSynchronize(e1));
    for (auto& c : comms) c.synchronize();
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<double> host, staged, rung, turn, gate, pickup, exec, finish, total;
    auto d = [](uint64_t a, uint64_t b) { return (static_cast<double>(b) - static_cast<double>(a)) / 1e3; };
    for (uint32_t i = 0; i < n; ++i)
      for (int r = 0; r < 2; ++r) {
        const mk::OpTiming t = comms[r].opTiming(first + i);
        auto sinceSubmit = [&](uint64_t ns) { return (static_cast<double>(ns) - cs[r].offsetNs - submitted[i]) / 1e3; };
        host.push_back(sinceSubmit(t.doorbellNs));
        staged.push_back(sinceSubmit(t.stagedNs));
        rung.push_back(sinceSubmit(t.rungNs));
        gate.push_back(d(t.doorbellNs, t.publishNs));
        pickup.push_back(d(t.publishNs, t.firstStepNs));
        exec.push_back(d(t.firstStepNs, t.localDoneNs));
        finish.push_back(d(t.localDoneNs, t.completeNs));
        if (i == 0) continue;
        const mk::OpTiming p = comms[r].opTiming(first + i - 1);
        turn.push_back(d(p.completeNs, t.doorbellNs));
        total.push_back(d(p.completeNs, t.completeNs));
      }
    std::printf("# engine mode: %s: %.3f us per op (events, %u ops)\n", modes[mode], static_cast<double>(ms) * 1e3 / n,
                n);
    if (mode == 3) std::printf("  host: %.3f us for both ranks' launches (%u ops each)\n", launchUs, n);
    print("  host submitted -> doorbell+descriptor seen", stats(host), "clock-synced");
    print("  host submitted -> descriptor staged", stats(staged), "clock-synced: read from host memory");
    print("  host submitted -> doorbell rung", stats(rung), "clock-synced: the stream's hand-off");
    print("  complete(k-1) -> doorbell+descriptor(k)", stats(turn), "stream turnaround + descriptor read");
    print("  doorbell -> published", stats(gate), "cross-op gate, board copy");
    print("  published -> first step", stats(pickup), "worker pick-up");
    print("  first step -> local done", stats(exec), "the op's steps");
    print("  local done -> complete", stats(finish), "done exchange (at once on local completion)");
    print("  complete(k-1) -> complete(k)", stats(total), "");
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (trace && mode == 2) {
      // Where rank 0's steps start and end, relative to the op's publication on rank 0.
      std::vector<mk::TraceEvent> ev = comms[0].takeTrace();
      std::vector<std::pair<uint32_t, uint32_t>> keys;
      for (const auto& e : ev)
        if (e.op >= first && std::find(keys.begin(), keys.end(), std::make_pair(e.lane, e.step)) == keys.end())
          keys.emplace_back(e.lane, e.step);
      std::sort(keys.begin(), keys.end());
      for (const auto& k : keys) {
        std::vector<double> b, e2;
        int kind = 0;
        for (const auto& e : ev)
          if (e.op >= first && e.lane == k.first && e.step == k.second) {
            const mk::OpTiming t = comms[0].opTiming(e.op);
            b.push_back(d(t.publishNs, e.startNs));
            e2.push_back(d(t.publishNs, e.endNs));
            kind = static_cast<int>(e.kind);
          }
        std::printf("  rank 0 lane %u step %u (%s): starts %+.3f  ends %+.3f us after publish (medians, %zu ops)\n",
                    k.first, k.second, mk::toString(static_cast<mk::StepKind>(kind)), stats(b).median, stats(e2).median,
                    b.size());
      }
      std::fflush(stdout);
    }
  }
  for (int r = 0; r < 2; ++r) {
    PROBE_CHECK(cudaSetDevice(devs[static_cast<size_t>(r)]));
    PROBE_CHECK(cudaStreamSynchronize(st[r]));
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t rounds = 2000;
  int gpus = 2;
  bool engineOnly = false;  // only probe 7 (the engine's stages), skipping the hand-off micro-probes
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: mk-probe-latency [--rounds N] [--gpus 1|2] [--engine-only]\n"
          "Measures the hand-off latencies the resident engine's small ops are made of (one line each).\n");
      return 0;
    }
    if (a == "--engine-only") {
      engineOnly = true;
    } else if ((a == "--rounds" || a == "--gpus") && i + 1 < argc) {
      const long v = std::strtol(argv[++i], nullptr, 10);
      if (v < 1 || v > 1000000) {
        std::fprintf(stderr, "mk-probe-latency: %s wants a positive number, got %s\n", a.c_str(), argv[i]);
        return 2;
      }
      if (a == "--rounds")
        rounds = static_cast<uint32_t>(v);
      else
        gpus = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "mk-probe-latency: unknown argument '%s' (try --help)\n", a.c_str());
      return 2;
    }
  }
  int have = 0;
  if (cudaGetDeviceCount(&have) != cudaSuccess || have < 1) {
    std::fprintf(stderr, "mk-probe-latency: no CUDA device\n");
    return 2;
  }
  gpus = std::min(gpus, have);
  const auto& api = mk::runtime::driverApi();
  PROBE_CHECK(cudaSetDevice(0));
  cudaStream_t s0, side;
  PROBE_CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  PROBE_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  uint32_t *hostPing = nullptr, *hostPong = nullptr;
  PROBE_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&hostPing), 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  PROBE_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&hostPong), 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  uint32_t* dev = nullptr;  // [0]: A (stream writes), [32]: B (kernel writes), [64..]: CTA words
  uint64_t* times = nullptr;
  PROBE_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev), 1 << 16));
  PROBE_CHECK(cudaMalloc(reinterpret_cast<void**>(&times), rounds * sizeof(uint64_t)));
  std::vector<uint64_t> hostTimes(rounds);
  std::vector<double> us;
  std::printf("# mk-probe-latency: %u rounds per probe, %d GPU(s)\n", rounds, gpus);

  if (engineOnly) {
    engineBreakdown(rounds, false, mk::StreamHandoff::Kernel, gpus);
    return 0;
  }
  // 1. host <-> GPU through host-mapped memory: host writes ping, the kernel polls it over PCIe and
  //    writes pong into host memory, the host polls pong. The round trip the doorbell-from-host path pays.
  for (int mode = 0; mode < 3; ++mode) {
    volatile uint32_t* ping = hostPing;
    volatile uint32_t* pong = hostPong;
    *ping = 0;
    *pong = 0;
    echoKernel<<<1, 32, 0, s0>>>(hostPing, hostPong, rounds, mode);
    PROBE_CHECK(cudaGetLastError());
    us.clear();
    for (uint32_t i = 1; i <= rounds; ++i) {
      const double t0 = hostNs();
      *ping = i;
      while (*pong != i)
        if (hostNs() - t0 > 2e9) {
          std::fprintf(stderr, "mk-probe-latency: host ping %u was never echoed\n", i);
          return 2;
        }
      us.push_back((hostNs() - t0) / 1e3);
    }
    PROBE_CHECK(cudaStreamSynchronize(s0));
    static const char* names[] = {"host->gpu->host RTT (pinned, volatile)",
                                  "host->gpu->host RTT (pinned, st.release.sys)",
                                  "host->gpu->host RTT (pinned, st + fence.sys)"};
    print(names[mode], stats(us), "kernel polls host memory over PCIe, answers into host memory");
  }

  // 2. host call costs: cudaStreamQuery on an idle stream, and a stream memory write's enqueue.
  {
    us.clear();
    for (uint32_t i = 0; i < rounds; ++i) {
      const double t0 = hostNs();
      const cudaError_t q = cudaStreamQuery(side);
      us.push_back((hostNs() - t0) / 1e3);
      if (q != cudaSuccess) std::fprintf(stderr, "mk-probe-latency: idle stream not idle?\n");
    }
    print("host: cudaStreamQuery (idle stream)", stats(us), "host time of the call");
  }

  // 3. The caller's stream against a spinning kernel (device memory): ring A = i, wait until B >= i, with
  //    the kernel answering `delay` after it saw the ring (an op of that length). Per iteration minus the
  //    delay is what the stream hand-off costs each back-to-back op. Variants: 0 stream memory write +
  //    stream memory wait, 1 writes only (no wait), 2 one tiny kernel per iteration that rings and spins.
  for (const int variant : {1, 0, 2})
    for (const uint64_t delay : {0ull, 2000ull, 5000ull, 10000ull, 20000ull}) {
      if (variant == 1 && delay > 0) continue;
      uint32_t* a = dev;
      uint32_t* b = dev + 32;
      const uint32_t n = std::min<uint32_t>(rounds, 1000);
      PROBE_CHECK(cudaMemsetAsync(dev, 0, 256, side));
      PROBE_CHECK(cudaStreamSynchronize(side));
      echoKernel<<<1, 32, 0, side>>>(a, b, n + 1, 0, delay);
      PROBE_CHECK(cudaGetLastError());
      cudaEvent_t e0, e1;
      PROBE_CHECK(cudaEventCreate(&e0));
      PROBE_CHECK(cudaEventCreate(&e1));
      const uint32_t warm = n / 10;
      const double h0 = hostNs();
      for (uint32_t i = 1; i <= n; ++i) {
        if (i == warm + 1) PROBE_CHECK(cudaEventRecord(e0, s0));
        if (variant == 2) {
          ringAndWaitKernel<<<1, 32, 0, s0>>>(a, b, i);
          continue;
        }
        mk::runtime::checkDriver(api.streamWriteValue32(s0, reinterpret_cast<CUdeviceptr>(a), i, 0), "write");
        if (variant == 0)
          mk::runtime::checkDriver(
              api.streamWaitValue32(s0, reinterpret_cast<CUdeviceptr>(b), i, CU_STREAM_WAIT_VALUE_GEQ), "wait");
      }
      const double h1 = hostNs();
      PROBE_CHECK(cudaEventRecord(e1, s0));
      // One more round lets the echo kernel leave.
      mk::runtime::checkDriver(api.streamWriteValue32(s0, reinterpret_cast<CUdeviceptr>(a), n + 1, 0), "write");
      PROBE_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      PROBE_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      PROBE_CHECK(cudaStreamSynchronize(side));
      PROBE_CHECK(cudaStreamSynchronize(s0));
      const double per = static_cast<double>(ms) * 1e3 / (n - warm);
      static const char* names[] = {"memop write + memop wait", "memop write only", "tiny kernel: ring + spin"};
      const std::string note = mk::strprintf(
          "answer after %5.1f us: per op %7.3f us, minus the answer %6.3f us; host %5.2f us/op",
          static_cast<double>(delay) / 1e3, per, per - static_cast<double>(delay) / 1e3, (h1 - h0) / 1e3 / n);
      std::printf("stream hand-off: %-26s %s\n", names[variant], note.c_str());
      std::fflush(stdout);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }

  // 4. CTA <-> CTA on one GPU.
  for (int mode = 0; mode < 2; ++mode) {
    PROBE_CHECK(cudaMemsetAsync(dev + 64, 0, 1024, s0));
    ctaPingPongKernel<<<2, 32, 0, s0>>>(dev + 64, rounds, mode, times);
    PROBE_CHECK(cudaGetLastError());
    PROBE_CHECK(cudaMemcpyAsync(hostTimes.data(), times, rounds * sizeof(uint64_t), cudaMemcpyDeviceToHost, s0));
    PROBE_CHECK(cudaStreamSynchronize(s0));
    toUs(hostTimes, &us);
    print(mode == 0 ? "CTA<->CTA RTT one GPU (volatile)" : "CTA<->CTA RTT one GPU (st.release.gpu)", stats(us), "");
  }

  // 5. fence costs.
  uint32_t* peerWord = nullptr;
  if (gpus >= 2) {
    int can = 0;
    PROBE_CHECK(cudaDeviceCanAccessPeer(&can, 0, 1));
    if (!can) {
      std::fprintf(stderr, "mk-probe-latency: GPU 0 cannot access GPU 1\n");
      return 2;
    }
    PROBE_CHECK(cudaDeviceEnablePeerAccess(1, 0));
    PROBE_CHECK(cudaSetDevice(1));
    PROBE_CHECK(cudaDeviceEnablePeerAccess(0, 0));
    PROBE_CHECK(cudaMalloc(reinterpret_cast<void**>(&peerWord), 4096));
    PROBE_CHECK(cudaMemset(peerWord, 0, 4096));
    PROBE_CHECK(cudaDeviceSynchronize());
    PROBE_CHECK(cudaSetDevice(0));
  }
  {
    static const char* names[] = {"fence.acq_rel.sys, nothing outstanding", "fence.acq_rel.sys after own-memory store",
                                  "fence.acq_rel.sys after NVLink peer store",
                                  "fence.acq_rel.sys after host-memory store",
                                  "fence.acq_rel.gpu after own-memory store"};
    for (int kind = 0; kind < 5; ++kind) {
      if (kind == 2 && !peerWord) continue;
      fenceCostKernel<<<1, 32, 0, s0>>>(dev + 512, peerWord, hostPong + 64, rounds, kind, times);
      PROBE_CHECK(cudaGetLastError());
      PROBE_CHECK(cudaMemcpyAsync(hostTimes.data(), times, rounds * sizeof(uint64_t), cudaMemcpyDeviceToHost, s0));
      PROBE_CHECK(cudaStreamSynchronize(s0));
      toUs(hostTimes, &us);
      print(names[kind], stats(us), "");
    }
  }

  // 6. GPU <-> GPU over NVLink.
  if (peerWord) {
    static const char* names[] = {"GPU<->GPU RTT NVLink (volatile)", "GPU<->GPU RTT NVLink (st.release.sys)",
                                  "GPU<->GPU RTT NVLink (st + fence.sys)"};
    for (int mode = 0; mode < 3; ++mode) {
      PROBE_CHECK(cudaMemset(dev + 1024, 0, 256));
      PROBE_CHECK(cudaSetDevice(1));
      PROBE_CHECK(cudaMemset(peerWord, 0, 256));
      PROBE_CHECK(cudaDeviceSynchronize());
      cudaStream_t s1;
      PROBE_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
      pingPongKernel<<<1, 32, 0, s1>>>(peerWord, dev + 1024, rounds, mode, 0, nullptr);
      PROBE_CHECK(cudaGetLastError());
      PROBE_CHECK(cudaSetDevice(0));
      pingPongKernel<<<1, 32, 0, s0>>>(dev + 1024, peerWord, rounds, mode, 1, times);
      PROBE_CHECK(cudaGetLastError());
      PROBE_CHECK(cudaMemcpyAsync(hostTimes.data(), times, rounds * sizeof(uint64_t), cudaMemcpyDeviceToHost, s0));
      PROBE_CHECK(cudaStreamSynchronize(s0));
      PROBE_CHECK(cudaSetDevice(1));
      PROBE_CHECK(cudaStreamSynchronize(s1));
      PROBE_CHECK(cudaStreamDestroy(s1));
      PROBE_CHECK(cudaSetDevice(0));
      toUs(hostTimes, &us);
      print(names[mode], stats(us), "");
    }
  }
  PROBE_CHECK(cudaSetDevice(0));
  cudaStreamSynchronize(s0);
  engineBreakdown(rounds, false, mk::StreamHandoff::MemOps, gpus);
  engineBreakdown(rounds, false, mk::StreamHandoff::Kernel, gpus);
  engineBreakdown(rounds, true, mk::StreamHandoff::Kernel, gpus);
  return 0;
}
