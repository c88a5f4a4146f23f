// mkernel — engine setup: the configuration check, the constructors of both modes, per-rank and host-mapped
// allocations, and the launch of the resident kernels (engine/engine.hpp; peers.cpp finds the ranks' GPUs).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine/host_alloc.hpp"
#include "engine/host_log.hpp"
#include "engine/host_sync.hpp"
#include "engine/internode.hpp"
#include "gemm/gemm_lane.hpp"
#include "kernels/resident_kernel.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device/compute_lane_device.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

void Engine::checkConfig(const CommConfig& c) {
  // Compute lanes: the GEMM engine's CTA shape; 512 is the default and is taken to mean "not chosen".
  if (c.computeLanes && c.threadsPerCta != device::kComputeThreads && c.threadsPerCta != 512)
    throw Error(ErrorCode::InvalidArgument, "CommConfig::threadsPerCta must be " +
                                                std::to_string(device::kComputeThreads) +
                                                " (or the default 512) with computeLanes: the tile engine's CTA is one "
                                                "producer and two consumer warpgroups (got " +
                                                std::to_string(c.threadsPerCta) + ")");
  if (c.threadsPerCta < 64 || c.threadsPerCta > static_cast<uint32_t>(kMaxThreadsPerCta) || c.threadsPerCta % 32 != 0)
    throw Error(ErrorCode::InvalidArgument, "CommConfig::threadsPerCta must be a multiple of 32 in 64..512 (got " +
                                                std::to_string(c.threadsPerCta) + ")");
  if (c.premappedBuffers.size() > CommConfig::kMaxPremapped)
    throw Error(ErrorCode::InvalidArgument, "CommConfig::premappedBuffers lists " +
                                                std::to_string(c.premappedBuffers.size()) + " buffers; at most " +
                                                std::to_string(CommConfig::kMaxPremapped) +
                                                " (list allocations, not every buffer inside one)");
  if (c.ringSlots < 2 || c.ringSlots > 4096)
    throw Error(ErrorCode::InvalidArgument,
                "CommConfig::ringSlots must be in 2..4096 (got " + std::to_string(c.ringSlots) + ")");
  if (!(c.pollBudgetMs > 0) || !(c.hostBudgetMs > 0))
    throw Error(ErrorCode::InvalidArgument, "CommConfig::pollBudgetMs and hostBudgetMs must be > 0");
  if (c.minBytesPerCta == 0) throw Error(ErrorCode::InvalidArgument, "CommConfig::minBytesPerCta must be > 0");
  if (c.proxyChunkBytes == 0 || c.proxyChunkBytes % 256 != 0 || c.proxyStagingSlots == 0 ||
      c.proxyStagingSlots > c.proxyFifoSlots || c.proxyReceiveBytes < c.proxyChunkBytes)
    throw Error(ErrorCode::InvalidArgument,
                "CommConfig::proxyChunkBytes must be a multiple of 256, proxyStagingSlots in 1..proxyFifoSlots and "
                "proxyReceiveBytes at least one chunk (got " +
                    std::to_string(c.proxyChunkBytes) + ", " + std::to_string(c.proxyStagingSlots) + ", " +
                    std::to_string(c.proxyReceiveBytes) + ")");
  auto powerOfTwo = [](uint32_t v) { return v >= 16 && v <= (1u << 20) && (v & (v - 1)) == 0; };
  if (!powerOfTwo(c.proxyFifoSlots) || !powerOfTwo(c.inboxSlots))
    throw Error(ErrorCode::InvalidArgument,
                "CommConfig::proxyFifoSlots and inboxSlots must be powers of two in "
                "16..2^20 (got " +
                    std::to_string(c.proxyFifoSlots) + " and " + std::to_string(c.inboxSlots) + ")");
}

Engine::Engine(const std::vector<int>& devices, const CommConfig& config) {
  ctx_.config = config;
  checkConfig(ctx_.config);
  if (ctx_.config.computeLanes) ctx_.config.threadsPerCta = device::kComputeThreads;
  ctx_.ringSlots = ctx_.config.ringSlots;
  try {
    init(devices);
    launchKernels();
  } catch (...) {
    shutdown();
    releaseMemory();
    throw;
  }
}

Engine::Engine(Bootstrap& boot, int device, const CommConfig& config) {
  ctx_.config = config;
  checkConfig(ctx_.config);
  if (ctx_.config.computeLanes) ctx_.config.threadsPerCta = device::kComputeThreads;
  ctx_.ringSlots = ctx_.config.ringSlots;
  try {
    initProcess(boot, device);
    launchKernels();
    if (interNode_) interNode_->start();
    // Every rank's kernel runs before anyone submits: a peer's first op then never waits for a launch.
    boot.barrier();
    MK_LOG_AT(Info, rankName(ctx_.me), "every rank's resident kernel runs (bootstrap barrier passed)");
  } catch (...) {
    shutdown();
    releaseMemory();
    throw;
  }
  progress_.start();
}

uint32_t Engine::workersFor(int dev, uint32_t sharers) const {
  cudaDeviceProp p{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  const uint32_t sms = static_cast<uint32_t>(p.multiProcessorCount);
  sharers = std::max<uint32_t>(1, sharers);
  uint32_t w = ctx_.config.workerCtas
                   ? ctx_.config.workerCtas
                   : std::max<uint32_t>(1, std::min<uint32_t>(64, std::max<uint32_t>(1, sms / 2)) / sharers);
  // Compute lanes: one CTA per SM; by default every SM but 3 (+ the control blocks'), see CommConfig.
  if (ctx_.config.computeLanes && ctx_.config.workerCtas == 0) w = sms > 4 + sharers ? (sms - 3) / sharers - 1 : 1;
  if (w > 0xFFFE) throw Error(ErrorCode::InvalidArgument, "CommConfig::workerCtas too large");
  MK_CUDA_CHECK(cudaSetDevice(dev));
  const int perSm = ctx_.config.computeLanes
                        ? residentComputeBlocksPerSm(ctx_.config.trace)
                        : residentBlocksPerSm(ctx_.config.trace, static_cast<int>(ctx_.config.threadsPerCta));
  if (perSm < 0) {
    const cudaError_t e = cudaGetLastError();
    throw Error(ErrorCode::CudaError, "GPU " + std::to_string(dev) +
                                          ": the resident kernel's occupancy query failed: " + cudaGetErrorName(e) +
                                          ": " + cudaGetErrorString(e));
  }
  const int64_t capacity = int64_t{perSm} * p.multiProcessorCount;
  if (perSm <= 0 || capacity < (int64_t{w} + 1) * sharers)
    throw Error(ErrorCode::Unsupported,
                (sharers > 1 ? std::to_string(sharers) + " ranks share this GPU; each " : std::string()) +
                    "the resident kernel needs " + std::to_string(w + 1) + " co-resident CTAs of " +
                    std::to_string(ctx_.config.threadsPerCta) + " threads" +
                    (ctx_.config.computeLanes ? " and " + std::to_string(device::kComputeSmemBytes / 1024) +
                                                    " KiB of shared memory (computeLanes)"
                                              : std::string()) +
                    " on GPU " + std::to_string(dev) + ", which holds " + std::to_string(capacity) + " (" +
                    std::to_string(perSm) + " per SM x " + std::to_string(p.multiProcessorCount) +
                    " SMs): lower CommConfig::workerCtas or threadsPerCta");
  return w;
}

void Engine::allocHostBlocks(size_t n) {
  if (!ctx_.link) ctx_.status = hostAlloc<device::StatusBlock>(1);  // multi-process: in the shared segment
  ctx_.ring = hostAlloc<device::OpDescriptor>(ctx_.ringSlots);
  ctx_.mailboxes = hostAlloc<device::RankMailbox>(n);
  // cudaFreeHost may wait for the device: the clock probe's mailbox and graph capture's cells (64 KiB) live as long
  // as the engine.
  timing_.allocate(n);
  submission_.allocate();
}

void Engine::allocRank(int r, int dev) {
  RankResources& rr = ctx_.ranks[static_cast<size_t>(r)];
  rr.device = dev;
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&rr.kernelStream, cudaStreamNonBlocking));
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&rr.copyStream, cudaStreamNonBlocking));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.state), sizeof(device::RankState)));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.doorbell), ctx_.ringSlots * sizeof(uint32_t)));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.stamps), ctx_.ringSlots * sizeof(device::OpStamp)));
  // Graph capture's per-replay bases (capture.cpp), allocated with the rest before the kernel starts: 4 KiB.
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.graphBase), EngineSubmission::kMaxCaptures * sizeof(uint32_t)));
  MK_CUDA_CHECK(cudaMemsetAsync(rr.stamps, 0, ctx_.ringSlots * sizeof(device::OpStamp), rr.copyStream));
  MK_CUDA_CHECK(cudaMemsetAsync(rr.state, 0, sizeof(device::RankState), rr.copyStream));
  MK_CUDA_CHECK(cudaMemsetAsync(rr.doorbell, 0, ctx_.ringSlots * sizeof(uint32_t), rr.copyStream));
  MK_CUDA_CHECK(
      cudaMemcpyAsync(&rr.state->doorbell, &rr.doorbell, sizeof(uint32_t*), cudaMemcpyHostToDevice, rr.copyStream));
  MK_CUDA_CHECK(cudaStreamSynchronize(rr.copyStream));
  // Reserved before the resident kernel starts (memcheck knows only the allocations older than a kernel).
  rr.arena = std::make_unique<DeviceArena>();
  rr.arena->reserve(dev, static_cast<uint32_t>(r), ctx_.config.deviceArenaBytes);
  if (multiNode()) {
    // Allocated before the kernel starts, like everything it addresses (memcheck, and no page-locked allocation
    // while a resident kernel runs).
    rr.fifoRing = hostAlloc<device::ProxyCommand>(ctx_.config.proxyFifoSlots);
    rr.fifoDone = hostAlloc<uint64_t>(1);
    rr.inbox = hostAlloc<device::InboxRecord>(ctx_.config.inboxSlots);
    rr.fifoStaging = hostAlloc<char>(ctx_.config.proxyStagingSlots * ctx_.config.proxyChunkBytes);
    rr.inboxStaging = hostAlloc<char>(ctx_.config.proxyReceiveBytes);
    MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.fifoDeviceWords), 2 * sizeof(uint64_t)));
    MK_CUDA_CHECK(cudaMemset(rr.fifoDeviceWords, 0, 2 * sizeof(uint64_t)));
  }
  MK_LOG_AT(Info, rankName(r),
            "GPU " + std::to_string(dev) + ": state, doorbells and stamps allocated; device arena " +
                (ctx_.config.deviceArenaBytes ? std::to_string(ctx_.config.deviceArenaBytes) + " bytes reserved"
                                              : std::string("off (allocate on demand)")));
}

void Engine::launchKernels() {
  const uint32_t n = static_cast<uint32_t>(ctx_.ranks.size());
  handoff_.prepare(n);
  for (const int lr : ctx_.local) {
    const uint32_t r = static_cast<uint32_t>(lr);
    RankResources& rr = ctx_.ranks[r];
    device::EngineDeviceHandle h{};
    h.state = rr.state;
    for (uint32_t q = 0; q < n; ++q) h.peers[q] = ctx_.peerStates[q];
    h.status = ctx_.link ? ctx_.link->statusDevice() : devicePointer(ctx_.status);
    h.mailbox = devicePointer(&ctx_.mailboxes[r]);
    h.ring = devicePointer(ctx_.ring);
    h.stamps = rr.stamps;
    h.trace = timing_.traceOf(r) ? devicePointer(timing_.traceOf(r)) : nullptr;
    int leader = 0;  // the node's first rank holds the claim word of its failure record
    while (!sameNode(leader, lr)) ++leader;
    h.failureClaim = &ctx_.peerStates[static_cast<size_t>(leader)]->failureClaim;
    h.localMask = ctx_.localMask(lr);
    if (rr.fifoRing) {
      h.fifo.ring = devicePointer(rr.fifoRing);
      h.fifo.head = rr.fifoDeviceWords;
      h.fifo.doneCache = rr.fifoDeviceWords + 1;
      h.fifo.done = devicePointer(rr.fifoDone);
      h.fifo.capacity = ctx_.config.proxyFifoSlots;
      h.fifo.staging = devicePointer(rr.fifoStaging);
      h.fifo.stagingSlots = ctx_.config.proxyStagingSlots;
      h.fifo.chunkBytes = ctx_.config.proxyChunkBytes;
      h.inboxStaging = devicePointer(rr.inboxStaging);
      h.inbox = devicePointer(rr.inbox);
      h.inboxCapacity = ctx_.config.inboxSlots;
    }
    h.traceCapacity = ctx_.config.traceCapacity;
    h.ringSlots = ctx_.ringSlots;
    h.rank = r;
    h.nRanks = n;
    h.nWorkers = ctx_.workers;
    h.pollBudgetNs = static_cast<uint64_t>(ctx_.config.pollBudgetMs * 1e6);
    MK_CUDA_CHECK(cudaSetDevice(rr.device));
    MK_LOG_AT(Info, rankName(lr), "loading the engine's kernels on GPU " + std::to_string(rr.device));
    MK_CUDA_CHECK(preloadKernels());
    MK_LOG_AT(Info, rankName(lr),
              "launching the resident kernel on GPU " + std::to_string(rr.device) + " (1 + " +
                  std::to_string(ctx_.workers) + " CTAs" +
                  (ctx_.config.computeLanes ? std::string(", compute lanes") : std::string()) + ")");
    if (ctx_.config.computeLanes) {
      // The binder's host-mapped timeout report is allocated now: page-locked allocation while the resident
      // kernel runs is avoided (the engine allocates host memory only before its launch).
      gemmLaneBinder(this, r, rr.device, h.pollBudgetNs, rr.arena.get());
      MK_CUDA_CHECK(launchResidentCompute(h, ctx_.config.trace, rr.kernelStream));
    } else {
      MK_CUDA_CHECK(launchResident(h, ctx_.config.trace, static_cast<int>(ctx_.config.threadsPerCta), rr.kernelStream));
    }
    rr.launched = true;
    MK_LOG_AT(Info, rankName(lr), "launch call returned");
  }
  // Every CTA of every kernel must be running at once, or ops could deadlock: wait for the roll call.
  for (const int r : ctx_.local) {
    const uint32_t want = ctx_.workers + 1;
    const bool ok = hostPoll(ctx_.config.hostBudgetMs, [&] { return loadHost(&ctx_.mailboxes[r].started) == want; });
    MK_LOG_AT(Info, rankName(r),
              ok ? "all " + std::to_string(want) + " CTAs of the resident kernel are running"
                 : "roll call: " + std::to_string(loadHost(&ctx_.mailboxes[r].started)) + " of " +
                       std::to_string(want) + " CTAs running after " + fmtMs(ctx_.config.hostBudgetMs));
    if (!ok) {
      const cudaError_t e = cudaStreamQuery(ctx_.ranks[r].kernelStream);
      throw Error(e != cudaSuccess && e != cudaErrorNotReady ? ErrorCode::CudaError : ErrorCode::Unsupported,
                  "the resident kernel on GPU " + std::to_string(ctx_.ranks[r].device) + " did not get all " +
                      std::to_string(want) + " CTAs running within " + fmtMs(ctx_.config.hostBudgetMs) +
                      (e != cudaSuccess && e != cudaErrorNotReady ? std::string(" (") + cudaGetErrorName(e) + ")"
                                                                  : std::string(" (other work holds the SMs?)")));
    }
  }
}

}  // namespace mk::runtime
