// mkernel — communicator: resources, the resident kernels' lifecycle, op submission; one process driving
// every GPU, or one process per GPU (engine/local_group.hpp says where the two differ).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "kernels/resident_kernel.hpp"
#include "device/driver_api.hpp"
#include "gemm/gemm_lane.hpp"
#include "engine/gen_defaults.hpp"
#include "engine/host_log.hpp"
#include "engine/local_group.hpp"
#include "mk/device/compute_lane_device.hpp"
#include "device/topology_probe.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/cuda_check.hpp"
#include "mk/bootstrap.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

namespace mk {
namespace runtime {
namespace {

using Clock = std::chrono::steady_clock;

bool seqGeq(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

/// "rank r" for the host log.
std::string rankName(int r) { return "rank " + std::to_string(r); }

uint32_t loadHost(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void storeHost(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

template <class T>
T* hostAlloc(size_t count) {
  void* p = nullptr;
  MK_CUDA_CHECK(cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(p, 0, count * sizeof(T));
  return static_cast<T*>(p);
}

/// Host-mapped memory is addressed by the same pointer on every device (UVA); checked once here.
template <class T>
T* devicePointer(T* host) {
  void* d = nullptr;
  MK_CUDA_CHECK(cudaHostGetDevicePointer(&d, host, 0));
  if (d != host)
    throw Error(ErrorCode::Unsupported, "host-mapped memory has a different device address (no unified addressing?)");
  return static_cast<T*>(d);
}

const char* statusName(device::Status s) {
  switch (s) {
    case device::Status::WaitTimeout: return "wait timed out";
    case device::Status::BarrierTimeout: return "barrier timed out";
    case device::Status::EntryTimeout: return "peer never entered the op";
    case device::Status::DescriptorTimeout: return "op descriptor never became valid";
    case device::Status::GateTimeout: return "earlier op never completed on every rank";
    case device::Status::LaneSyncTimeout: return "CTAs of a lane never met";
    case device::Status::BadProgram: return "bad program";
    case device::Status::HostAbort: return "aborted by the host";
    default: return "unknown failure";
  }
}

std::string fmtMs(double ms) {
  std::ostringstream os;
  os.precision(ms < 10 ? 3 : 1);
  os << std::fixed << ms << " ms";
  return os.str();
}

/// Polls `done` until it returns true, at most `budgetMs`; returns false on timeout.
bool hostPoll(double budgetMs, const std::function<bool()>& done) {
  const auto start = Clock::now();
  for (uint32_t spins = 0;; ++spins) {
    if (done()) return true;
    if (std::chrono::duration<double, std::milli>(Clock::now() - start).count() > budgetMs) return false;
    if (spins > 1000) std::this_thread::yield();
  }
}

}  // namespace

// ---- creation ------------------------------------------------------------------------------------------

void LocalGroup::checkConfig(const CommConfig& c) {
  // Compute lanes: the GEMM engine's CTA shape; 512 is the default and is taken to mean "not chosen".
  if (c.computeLanes && c.threadsPerCta != device::kComputeThreads && c.threadsPerCta != 512)
    throw Error(ErrorCode::InvalidArgument, "CommConfig::threadsPerCta must be " + std::to_string(device::kComputeThreads) +
                                                " (or the default 512) with computeLanes: the tile engine's CTA is one "
                                                "producer and two consumer warpgroups (got " +
                                                std::to_string(c.threadsPerCta) + ")");
  if (c.threadsPerCta < 64 || c.threadsPerCta > static_cast<uint32_t>(kMaxThreadsPerCta) ||
      c.threadsPerCta % 32 != 0)
    throw Error(ErrorCode::InvalidArgument, "CommConfig::threadsPerCta must be a multiple of 32 in 64..512 (got " +
                                                std::to_string(c.threadsPerCta) + ")");
  if (c.premappedBuffers.size() > CommConfig::kMaxPremapped)
    throw Error(ErrorCode::InvalidArgument, "CommConfig::premappedBuffers lists " + std::to_string(c.premappedBuffers.size()) +
                                                " buffers; at most " + std::to_string(CommConfig::kMaxPremapped) +
                                                " (list allocations, not every buffer inside one)");
  if (c.ringSlots < 2 || c.ringSlots > 4096)
    throw Error(ErrorCode::InvalidArgument,
                "CommConfig::ringSlots must be in 2..4096 (got " + std::to_string(c.ringSlots) + ")");
  if (!(c.pollBudgetMs > 0) || !(c.hostBudgetMs > 0))
    throw Error(ErrorCode::InvalidArgument, "CommConfig::pollBudgetMs and hostBudgetMs must be > 0");
  if (c.minBytesPerCta == 0) throw Error(ErrorCode::InvalidArgument, "CommConfig::minBytesPerCta must be > 0");
}

LocalGroup::LocalGroup(const std::vector<int>& devices, const CommConfig& config) : config_(config) {
  checkConfig(config_);
  if (config_.computeLanes) config_.threadsPerCta = device::kComputeThreads;
  ringSlots_ = config_.ringSlots;
  try {
    init(devices);
    launchKernels();
  } catch (...) {
    shutdown();
    releaseMemory();
    throw;
  }
}

LocalGroup::LocalGroup(Bootstrap& boot, int device, const CommConfig& config) : config_(config) {
  checkConfig(config_);
  if (config_.computeLanes) config_.threadsPerCta = device::kComputeThreads;
  ringSlots_ = config_.ringSlots;
  try {
    initProcess(boot, device);
    launchKernels();
    // Every rank's kernel runs before anyone submits: a peer's first op then never waits for a launch.
    boot.barrier();
    MK_LOG_AT(Info, rankName(me_), "every rank's resident kernel runs (bootstrap barrier passed)");
  } catch (...) {
    shutdown();
    releaseMemory();
    throw;
  }
  progress_ = std::thread([this] { progressThread(); });
}

namespace {
/// Topology for the "auto" choice: the lent pair's preset, else a node of this many GPUs like `prop`.
Topology detectTopology(const cudaDeviceProp& prop, size_t n) {
  const std::string name = prop.name;
  if (n == 2 && name.find("H200") != std::string::npos) return topologyPreset("h200x2");
  Topology t = topologyPreset(name.find("H100") != std::string::npos ? "dgx-h100" : "dgx-h200");
  t.name = "local";
  t.node.gpu = name;
  t.node.gpus = static_cast<uint32_t>(n);
  t.node.sms = static_cast<uint32_t>(prop.multiProcessorCount);
  t.node.nics = 0;
  t.node.nic = NicSpec{0, 0};
  return t;
}

std::string peerAccessRefusal(int devA, int rankA, int devB, int rankB) {
  return "GPU " + std::to_string(devA) + " (rank " + std::to_string(rankA) + ") cannot access the memory of GPU " +
         std::to_string(devB) + " (rank " + std::to_string(rankB) +
         "): cudaDeviceCanAccessPeer = 0; the engine needs NVLink or PCIe peer access between every pair of its GPUs";
}
}  // namespace

void LocalGroup::refineTopology(const std::vector<NvlinkProbe>& probes, int major) {
  if (topology_.name == "h200x2") {
    // The preset holds numbers measured on this very machine: keep them, say what NVML sees.
    Topology probe = topology_;
    topologySource_ = "preset h200x2 (NVML: " + applyNvlinkProbes(probe, probes, major) + ")";
  } else {
    topologySource_ =
        "local, like " + topology_.node.gpu + " (NVML: " + applyNvlinkProbes(topology_, probes, major) + ")";
  }
  // The profile of the "auto" choice: loaded once, here, so that a bad file fails the creation, not an op.
  if (config_.profile.empty()) {
    profile_ = defaultProfile(topology_);
    profileSource_ = profile_.source;
  } else {
    profile_ = loadProfile(config_.profile);
    profileSource_ = profile_.source + " (" + config_.profile + ")";
  }
}

uint32_t LocalGroup::workersFor(int dev) const {
  cudaDeviceProp p{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  const uint32_t sms = static_cast<uint32_t>(p.multiProcessorCount);
  uint32_t w = config_.workerCtas ? config_.workerCtas : std::min<uint32_t>(64, std::max<uint32_t>(1, sms / 2));
  // Compute lanes: one CTA per SM; by default every SM but 3 (+ the control block's), see CommConfig.
  if (config_.computeLanes && config_.workerCtas == 0) w = sms > 5 ? sms - 4 : 1;
  if (w > 0xFFFE) throw Error(ErrorCode::InvalidArgument, "CommConfig::workerCtas too large");
  MK_CUDA_CHECK(cudaSetDevice(dev));
  const int perSm = config_.computeLanes ? residentComputeBlocksPerSm(config_.trace)
                                         : residentBlocksPerSm(config_.trace, static_cast<int>(config_.threadsPerCta));
  const int64_t capacity = int64_t{perSm} * p.multiProcessorCount;
  if (perSm <= 0 || capacity < int64_t{w} + 1)
    throw Error(ErrorCode::Unsupported, "the resident kernel needs " + std::to_string(w + 1) + " co-resident CTAs of " +
                                            std::to_string(config_.threadsPerCta) + " threads" +
                                            (config_.computeLanes ? " and " + std::to_string(device::kComputeSmemBytes / 1024) +
                                                                        " KiB of shared memory (computeLanes)"
                                                                  : std::string()) +
                                            " on GPU " +
                                            std::to_string(dev) + ", which holds " + std::to_string(capacity) + " (" +
                                            std::to_string(perSm) + " per SM x " + std::to_string(p.multiProcessorCount) +
                                            " SMs): lower CommConfig::workerCtas or threadsPerCta");
  return w;
}

void LocalGroup::allocHostBlocks(size_t n) {
  if (!link_) status_ = hostAlloc<device::StatusBlock>(1);  // multi-process: in the shared segment
  ring_ = hostAlloc<device::OpDescriptor>(ringSlots_);
  mailboxes_ = hostAlloc<device::RankMailbox>(n);
  if (config_.trace) trace_ = hostAlloc<device::TraceRecord>(n * size_t{config_.traceCapacity});
  traceTaken_.assign(n, 0);
  opSchedule_.assign(ringSlots_, nullptr);
  // cudaFreeHost may wait for the device: the clock probe's mailbox lives as long as the group.
  clockPing_ = hostAlloc<uint32_t>(4);
  clockPong_ = hostAlloc<uint64_t>(2);
}

void LocalGroup::allocRank(int r, int dev) {
  RankResources& rr = ranks_[static_cast<size_t>(r)];
  rr.device = dev;
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&rr.kernelStream, cudaStreamNonBlocking));
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&rr.copyStream, cudaStreamNonBlocking));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.state), sizeof(device::RankState)));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.doorbell), ringSlots_ * sizeof(uint32_t)));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rr.stamps), ringSlots_ * sizeof(device::OpStamp)));
  MK_CUDA_CHECK(cudaMemsetAsync(rr.stamps, 0, ringSlots_ * sizeof(device::OpStamp), rr.copyStream));
  MK_CUDA_CHECK(cudaMemsetAsync(rr.state, 0, sizeof(device::RankState), rr.copyStream));
  MK_CUDA_CHECK(cudaMemsetAsync(rr.doorbell, 0, ringSlots_ * sizeof(uint32_t), rr.copyStream));
  MK_CUDA_CHECK(cudaMemcpyAsync(&rr.state->doorbell, &rr.doorbell, sizeof(uint32_t*), cudaMemcpyHostToDevice,
                                rr.copyStream));
  MK_CUDA_CHECK(cudaStreamSynchronize(rr.copyStream));
  // Reserved before the resident kernel starts (memcheck knows only the allocations older than a kernel).
  rr.arena = std::make_unique<DeviceArena>();
  rr.arena->reserve(dev, static_cast<uint32_t>(r), config_.deviceArenaBytes);
  MK_LOG_AT(Info, rankName(r), "GPU " + std::to_string(dev) + ": state, doorbells and stamps allocated; device arena " +
                                   (config_.deviceArenaBytes ? std::to_string(config_.deviceArenaBytes) + " bytes reserved"
                                                             : std::string("off (allocate on demand)")));
}

void LocalGroup::init(const std::vector<int>& devices) {
  const size_t n = devices.size();
  if (n == 0) throw Error(ErrorCode::InvalidArgument, "createLocal: the device list is empty");
  if (n > device::kMaxRanks)
    throw Error(ErrorCode::Unsupported, "createLocal: " + std::to_string(n) + " ranks asked for; the GPU engine drives at most " +
                                            std::to_string(device::kMaxRanks) + " (one NVLink domain)");
  int count = 0;
  const cudaError_t cerr = cudaGetDeviceCount(&count);
  if (cerr != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::Unsupported, std::string("createLocal: no usable CUDA device (") + cudaGetErrorName(cerr) + ")");
  }
  std::set<int> seen;
  for (size_t i = 0; i < n; ++i) {
    if (devices[i] < 0 || devices[i] >= count)
      throw Error(ErrorCode::InvalidArgument, "createLocal: rank " + std::to_string(i) + " asks for device " +
                                                  std::to_string(devices[i]) + " but this process sees " +
                                                  std::to_string(count) + " device(s) (more ranks than GPUs?)");
    if (!seen.insert(devices[i]).second)
      throw Error(ErrorCode::InvalidArgument, "createLocal: device " + std::to_string(devices[i]) +
                                                  " is listed twice (one rank per GPU)");
  }
  driverApi();  // fail early, before anything is allocated, if stream memory operations are missing
  MK_LOG_AT(Info, "createLocal", std::to_string(n) + " rank(s) on GPU(s) " + [&] {
    std::string l;
    for (int d : devices) l += (l.empty() ? "" : ",") + std::to_string(d);
    return l;
  }());

  // Peer access both ways between every pair, or refuse naming the pair.
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0;
      MK_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, devices[a], devices[b]));
      if (!can)
        throw Error(ErrorCode::Unsupported,
                    peerAccessRefusal(devices[a], static_cast<int>(a), devices[b], static_cast<int>(b)));
      MK_CUDA_CHECK(cudaSetDevice(devices[a]));
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[b], 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) MK_CUDA_CHECK(e);
      cudaGetLastError();
    }

  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, devices[0]));
  topology_ = detectTopology(prop, n);
  {
    std::vector<std::string> bus(n);
    for (size_t i = 0; i < n; ++i) {
      char id[32] = {};
      MK_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, devices[i]));
      bus[i] = id;
    }
    std::vector<NvlinkProbe> probes;
    for (size_t i = 0; i < n; ++i) {
      std::vector<std::string> peers;
      for (size_t j = 0; j < n; ++j)
        if (j != i) peers.push_back(bus[j]);
      probes.push_back(probeNvlinks(bus[i], peers));
    }
    refineTopology(probes, prop.major);
  }
  // Grid: control block + workers, all co-resident on every GPU.
  for (size_t i = 0; i < n; ++i) {
    const uint32_t w = workersFor(devices[i]);
    workers_ = i == 0 ? w : std::min(workers_, w);
  }

  MK_LOG_AT(Info, "createLocal", "peer access enabled between every pair; " + std::to_string(workers_) +
                                      " worker CTAs per GPU");
  allocHostBlocks(n);
  ranks_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    local_.push_back(static_cast<int>(i));
    allocRank(static_cast<int>(i), devices[i]);
  }
  for (size_t i = 0; i < n; ++i) peerStates_.push_back(ranks_[i].state);
}

namespace {
/// What every process tells the others at creation.
struct ProcessInfo {
  char host[64];
  char busId[32];
  char gpu[64];
  uint8_t uuid[16];
  int32_t device;
  uint32_t workers;
  uint32_t ringSlots;
  uint32_t nPremapped;
  IpcRef state;
  IpcRef arena;                                    ///< the device arena's block (bufferId 0: none)
  IpcRef premapped[CommConfig::kMaxPremapped];     ///< CommConfig::premappedBuffers
};
}  // namespace

void LocalGroup::initProcess(Bootstrap& boot, int dev) {
  const int n = boot.size();
  me_ = boot.rank();
  const std::string who = "rank " + std::to_string(me_);
  if (n < 1 || me_ < 0 || me_ >= n) throw Error(ErrorCode::InvalidArgument, "bootstrap reports rank " + std::to_string(me_) + " of " + std::to_string(n));
  if (n > static_cast<int>(device::kMaxRanks))
    throw Error(ErrorCode::Unsupported, std::to_string(n) + " ranks asked for; the GPU engine drives at most " +
                                            std::to_string(device::kMaxRanks) + " (one NVLink domain)");
  int count = 0;
  const cudaError_t cerr = cudaGetDeviceCount(&count);
  if (cerr != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::Unsupported, who + ": no usable CUDA device (" + std::string(cudaGetErrorName(cerr)) + ")");
  }
  if (dev < 0 || dev >= count)
    throw Error(ErrorCode::InvalidArgument, who + " asks for device " + std::to_string(dev) + " but this process sees " +
                                                std::to_string(count) + " device(s) (LOCAL_RANK beyond the GPUs of this node?)");
  driverApi();
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  MK_CUDA_CHECK(cudaSetDevice(dev));
  const uint32_t myWorkers = workersFor(dev);

  MK_LOG_AT(Info, who, "bootstrap: " + std::to_string(n) + " rank(s); this process drives GPU " + std::to_string(dev));
  link_ = std::make_unique<ProcessLink>(boot, ringSlots_);
  status_ = &link_->header().status;
  ranks_.resize(static_cast<size_t>(n));
  local_ = {me_};
  allocRank(me_, dev);

  ProcessInfo mine{};
  gethostname(mine.host, sizeof mine.host - 1);
  MK_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.busId, sizeof mine.busId, dev));
  std::memcpy(mine.gpu, prop.name, sizeof mine.gpu - 1);
  std::memcpy(mine.uuid, &prop.uuid, sizeof mine.uuid);
  mine.device = dev;
  mine.workers = myWorkers;
  mine.ringSlots = ringSlots_;
  mine.state = link_->exportPointer(ranks_[static_cast<size_t>(me_)].state, "engine state");
  mine.arena = link_->exportPointer(ranks_[static_cast<size_t>(me_)].arena->base(), "the device arena");
  mine.nPremapped = static_cast<uint32_t>(config_.premappedBuffers.size());
  for (size_t i = 0; i < config_.premappedBuffers.size(); ++i)
    mine.premapped[i] = link_->exportPointer(config_.premappedBuffers[i],
                                             "CommConfig::premappedBuffers[" + std::to_string(i) + "]");
  const std::vector<uint8_t> all = boot.allGather(&mine, sizeof mine);
  std::vector<ProcessInfo> info(static_cast<size_t>(n));
  std::memcpy(info.data(), all.data(), all.size());

  workers_ = myWorkers;
  for (int q = 0; q < n; ++q) {
    const ProcessInfo& pi = info[static_cast<size_t>(q)];
    if (std::strncmp(pi.host, mine.host, sizeof mine.host) != 0)
      throw Error(ErrorCode::Unsupported, "rank " + std::to_string(q) + " runs on host '" + std::string(pi.host) + "', " + who +
                                              " on '" + std::string(mine.host) +
                                              "': the multi-process mode needs every rank on one node for now");
    if (q != me_ && std::memcmp(pi.uuid, mine.uuid, sizeof mine.uuid) == 0)
      throw Error(ErrorCode::InvalidArgument, "ranks " + std::to_string(std::min(q, me_)) + " and " +
                                                  std::to_string(std::max(q, me_)) + " both use GPU " + mine.busId +
                                                  " (one rank per GPU: check LOCAL_RANK and CUDA_VISIBLE_DEVICES)");
    if (pi.ringSlots != ringSlots_)
      throw Error(ErrorCode::InvalidArgument, "rank " + std::to_string(q) + " uses CommConfig::ringSlots " +
                                                  std::to_string(pi.ringSlots) + ", " + who + " " +
                                                  std::to_string(ringSlots_) + " (every rank must use the same config)");
    workers_ = std::min(workers_, pi.workers);  // one worker count for every rank's lowering
    if (q == me_) continue;
    int peerDev = -1;
    if (cudaDeviceGetByPCIBusId(&peerDev, pi.busId) == cudaSuccess) {  // visible here: check peer access
      int can = 0;
      MK_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev, peerDev));
      if (!can) throw Error(ErrorCode::Unsupported, peerAccessRefusal(dev, me_, peerDev, q));
    }
    cudaGetLastError();
  }
  topology_ = detectTopology(prop, static_cast<size_t>(n));
  {
    // Each process sees its own GPU's links; the others are taken to be alike (one node of one kind).
    std::vector<std::string> peers;
    for (int q = 0; q < n; ++q)
      if (q != me_) peers.emplace_back(info[static_cast<size_t>(q)].busId);
    refineTopology({probeNvlinks(mine.busId, peers)}, prop.major);
  }
  allocHostBlocks(static_cast<size_t>(n));
  MK_CUDA_CHECK(cudaSetDevice(dev));
  for (int q = 0; q < n; ++q)
    peerStates_.push_back(q == me_ ? ranks_[static_cast<size_t>(me_)].state
                                   : static_cast<device::RankState*>(link_->importPointer(q, info[static_cast<size_t>(q)].state)));
  // Mapped now, before the kernel starts (memcheck knows only mappings older than a running kernel); an op's
  // pointer inside them later finds the mapping cached.
  size_t premapped = 0;
  for (int q = 0; q < n; ++q) {
    if (q == me_) continue;
    const ProcessInfo& pi = info[static_cast<size_t>(q)];
    link_->importPointer(q, pi.arena);
    for (uint32_t i = 0; i < pi.nPremapped && i < CommConfig::kMaxPremapped; ++i, ++premapped)
      link_->importPointer(q, pi.premapped[i]);
  }
  MK_LOG_AT(Info, who, "every peer's engine state and device arena mapped, " + std::to_string(premapped) +
                           " premapped peer buffer(s); " + std::to_string(workers_) + " worker CTAs per GPU");
}

void LocalGroup::launchKernels() {
  const uint32_t n = static_cast<uint32_t>(ranks_.size());
  for (const int lr : local_) {
    const uint32_t r = static_cast<uint32_t>(lr);
    RankResources& rr = ranks_[r];
    device::EngineDeviceHandle h{};
    h.state = rr.state;
    for (uint32_t q = 0; q < n; ++q) h.peers[q] = peerStates_[q];
    h.status = link_ ? link_->statusDevice() : devicePointer(status_);
    h.mailbox = devicePointer(&mailboxes_[r]);
    h.ring = devicePointer(ring_);
    h.stamps = rr.stamps;
    h.trace = trace_ ? devicePointer(&trace_[size_t{r} * config_.traceCapacity]) : nullptr;
    h.failureClaim = &peerStates_[0]->failureClaim;
    h.traceCapacity = config_.traceCapacity;
    h.ringSlots = ringSlots_;
    h.rank = r;
    h.nRanks = n;
    h.nWorkers = workers_;
    h.pollBudgetNs = static_cast<uint64_t>(config_.pollBudgetMs * 1e6);
    MK_CUDA_CHECK(cudaSetDevice(rr.device));
    MK_LOG_AT(Info, rankName(lr), "loading the engine's kernels on GPU " + std::to_string(rr.device));
    MK_CUDA_CHECK(preloadKernels());
    MK_LOG_AT(Info, rankName(lr), "launching the resident kernel on GPU " + std::to_string(rr.device) + " (1 + " +
                                      std::to_string(workers_) + " CTAs" +
                                      (config_.computeLanes ? std::string(", compute lanes") : std::string()) + ")");
    if (config_.computeLanes) {
      // The binder's host-mapped timeout report is allocated now: page-locked allocation while the resident
      // kernel runs is avoided (the engine allocates host memory only before its launch).
      gemmLaneBinder(this, r, rr.device, h.pollBudgetNs, rr.arena.get());
      MK_CUDA_CHECK(launchResidentCompute(h, config_.trace, rr.kernelStream));
    } else {
      MK_CUDA_CHECK(launchResident(h, config_.trace, static_cast<int>(config_.threadsPerCta), rr.kernelStream));
    }
    rr.launched = true;
    MK_LOG_AT(Info, rankName(lr), "launch call returned");
  }
  // Every CTA of every kernel must be running at once, or ops could deadlock: wait for the roll call.
  for (const int r : local_) {
    const uint32_t want = workers_ + 1;
    const bool ok = hostPoll(config_.hostBudgetMs, [&] { return loadHost(&mailboxes_[r].started) == want; });
    MK_LOG_AT(Info, rankName(r), ok ? "all " + std::to_string(want) + " CTAs of the resident kernel are running"
                                    : "roll call: " + std::to_string(loadHost(&mailboxes_[r].started)) + " of " +
                                          std::to_string(want) + " CTAs running after " + fmtMs(config_.hostBudgetMs));
    if (!ok) {
      const cudaError_t e = cudaStreamQuery(ranks_[r].kernelStream);
      throw Error(e != cudaSuccess && e != cudaErrorNotReady ? ErrorCode::CudaError : ErrorCode::Unsupported,
                  "the resident kernel on GPU " + std::to_string(ranks_[r].device) + " did not get all " +
                      std::to_string(want) + " CTAs running within " + fmtMs(config_.hostBudgetMs) +
                      (e != cudaSuccess && e != cudaErrorNotReady ? std::string(" (") + cudaGetErrorName(e) + ")"
                                                                   : std::string(" (other work holds the SMs?)")));
    }
  }
}

// ---- teardown ------------------------------------------------------------------------------------------

void LocalGroup::shutdown() noexcept {
  bool any = false;
  for (const auto& rr : ranks_) any = any || rr.launched;
  if (!any) return;
  // Let submitted ops finish (bounded), then ask the kernels to leave; abort them if they do not.
  const bool failed = !poison_.empty() || (status_ && loadHost(&status_->abort) != 0);
  MK_LOG_AT(Info, "shutdown", failed ? "after a failure: stopping the resident kernels" : "draining submitted ops");
  // Multi-process: ops posted here wait for peers' posts (bounded) before they can drain.
  if (!failed && link_)
    hostPoll(config_.hostBudgetMs, [&] {
      pumpLocked();
      return pending_.empty() || loadHost(&status_->abort) != 0;
    });
  bool drained = failed ? false : pending_.empty();
  if (drained)
    for (uint32_t r = 0; r < ranks_.size(); ++r)
      if (ranks_[r].launched &&
          !hostPoll(config_.hostBudgetMs, [&] { return seqGeq(completed(static_cast<int>(r)), ranks_[r].submitted) ||
                                                        loadHost(&status_->abort) != 0; }))
        drained = false;
  for (uint32_t r = 0; r < ranks_.size(); ++r) storeHost(&mailboxes_[r].shutdown, 1);
  if (!drained && status_ && loadHost(&status_->abort) == 0) {
    // Ops that can never finish (a rank never submitted its part, or a failure): stop the kernels.
    status_->code = static_cast<uint32_t>(device::Status::HostAbort);
    storeHost(&status_->abort, 1);
  }
  for (auto& rr : ranks_) {
    if (!rr.launched) continue;
    cudaSetDevice(rr.device);
    const bool exited = hostPoll(config_.hostBudgetMs, [&] { return cudaStreamQuery(rr.kernelStream) != cudaErrorNotReady; });
    if (!exited) {
      storeHost(&status_->abort, 1);
      if (!hostPoll(config_.hostBudgetMs, [&] { return cudaStreamQuery(rr.kernelStream) != cudaErrorNotReady; })) {
        std::fprintf(stderr, "mkernel: the resident kernel on GPU %d did not stop; its memory is leaked\n", rr.device);
        continue;
      }
    }
    cudaGetLastError();
    rr.launched = false;
    MK_LOG_AT(Info, "shutdown", "the resident kernel on GPU " + std::to_string(rr.device) + " left");
  }
  if (link_ && !ranks_[static_cast<size_t>(me_)].launched) {
    // Peers' kernels may still write into this rank's memory (done / abort words) until they stopped:
    // free nothing before every peer's kernel left (bounded: a dead peer writes nothing any more).
    storeHost(&link_->header().stopped[me_], 1);
    hostPoll(config_.hostBudgetMs, [&] {
      for (int q = 0; q < size(); ++q)
        if (loadHost(&link_->header().stopped[q]) == 0) return false;
      return true;
    });
  }
}

void LocalGroup::releaseMemory() noexcept {
  bool stillRunning = false;
  for (const auto& rr : ranks_) stillRunning = stillRunning || rr.launched;
  if (link_ && !stillRunning) link_->closeImports();
  bool anyRunning = false;
  for (const auto& rr : ranks_) anyRunning = anyRunning || rr.launched;
  // Compute lanes: the per-op GemmParams blocks, freed only once no kernel can read them (before the
  // arenas they may be carved from).
  releaseGemmLaneBinders(this, !anyRunning);
  for (auto& kv : cache_) {
    for (size_t r = 0; r < kv.second->devicePrograms.size(); ++r)
      if (r < ranks_.size() && !ranks_[r].launched && kv.second->devicePrograms[r] && ranks_[r].arena) {
        cudaSetDevice(ranks_[r].device >= 0 ? ranks_[r].device : 0);
        ranks_[r].arena->release(kv.second->devicePrograms[r]);
      }
  }
  cache_.clear();
  for (auto& rr : ranks_) {
    if (rr.device < 0) continue;
    if (rr.launched) continue;  // a kernel that never stopped may still touch it: leak rather than corrupt
    cudaSetDevice(rr.device);
    if (rr.arena) {
      for (void* p : rr.retired) rr.arena->release(p);
      for (void* p : rr.scratch) rr.arena->release(p);
      for (void* p : rr.staging) rr.arena->release(p);
      rr.arena->destroy();
    }
    cudaFree(rr.doorbell);
    cudaFree(rr.stamps);
    cudaFree(rr.state);
    if (rr.kernelStream) cudaStreamDestroy(rr.kernelStream);
    if (rr.copyStream) cudaStreamDestroy(rr.copyStream);
    rr = RankResources{};
  }
  if (!anyRunning) {
    if (!link_) cudaFreeHost(status_);
    cudaFreeHost(ring_);
    cudaFreeHost(mailboxes_);
    if (trace_) cudaFreeHost(trace_);
    if (clockPing_) cudaFreeHost(clockPing_);
    if (clockPong_) cudaFreeHost(clockPong_);
    status_ = nullptr;
    link_.reset();
  }
  cudaGetLastError();
}

LocalGroup::~LocalGroup() {
  stopProgressThread();
  try {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown();
    releaseMemory();
  } catch (...) {
    std::fprintf(stderr, "mkernel: error while destroying a communicator (ignored)\n");
  }
}

// ---- failures ------------------------------------------------------------------------------------------

uint32_t LocalGroup::fetched(int r) const { return loadHost(&mailboxes_[r].fetched); }
uint32_t LocalGroup::completed(int r) const { return loadHost(&mailboxes_[r].completed); }

std::string LocalGroup::describeDeviceFailure() const {
  const device::StatusBlock s = *status_;
  const auto code = static_cast<device::Status>(s.code);
  std::ostringstream os;
  const CachedSchedule* sched = opSchedule_[s.op % ringSlots_];
  const std::string what = sched ? " (" + sched->what + ")" : std::string();
  switch (code) {
    case device::Status::WaitTimeout:
    case device::Status::BarrierTimeout:
    case device::Status::EntryTimeout:
    case device::Status::LaneSyncTimeout: {
      if (sched && s.rank < sched->schedule.lanes.size() && s.lane < sched->schedule.lanes[s.rank].size() &&
          s.step < sched->schedule.lanes[s.rank][s.lane].steps.size())
        os << describeStep(sched->schedule, s.rank, s.lane, s.step);
      else
        os << "rank " << s.rank << " lane " << s.lane << " step " << s.step;
      os << " of op " << s.op << what << ": " << statusName(code) << " after " << fmtMs(double(s.elapsedNs) / 1e6)
         << ": ";
      if (code == device::Status::WaitTimeout)
        os << "flag " << s.flag << " expected >= " << s.expected << ", seen " << s.seen;
      else if (code == device::Status::BarrierTimeout)
        os << "barrier " << s.flag << " expected " << s.expected << " ranks, seen " << s.seen;
      else if (code == device::Status::EntryTimeout)
        os << "rank " << s.flag << " has entered " << s.seen << " ops, expected >= " << s.expected
           << " (its stream never reached this op?)";
      else
        os << "sync point " << s.flag << " expected " << s.expected << " CTAs, seen " << s.seen;
      break;
    }
    case device::Status::DescriptorTimeout:
      os << "rank " << s.rank << " op " << s.op << ": " << statusName(code) << " after " << fmtMs(double(s.elapsedNs) / 1e6)
         << " (seq seen " << s.seen << ", expected " << s.expected << "): did every rank submit op " << s.op << "?";
      if (link_) {
        const std::string missing = unpostedRanks(s.op);
        if (!missing.empty()) os << " (rank(s) " << missing << " never submitted it)";
      }
      break;
    case device::Status::GateTimeout:
      os << "rank " << s.rank << " could not start op " << s.op << what << " within " << fmtMs(double(s.elapsedNs) / 1e6)
         << ": rank " << s.flag << " has completed " << s.seen << " ops, expected >= " << s.expected;
      break;
    case device::Status::HostAbort:
      os << "the communicator was stopped by the host after an earlier error";
      if (link_) os << " (in the process of rank " << s.rank << ")";
      break;
    default:
      os << "rank " << s.rank << ": " << statusName(code) << " (code " << s.code << ")";
  }
  return os.str();
}

void LocalGroup::poisonAndThrow(ErrorCode code, const std::string& message) {
  if (poison_.empty()) {
    poison_ = message;
    poisonCode_ = code;
  }
  if (status_ && loadHost(&status_->abort) == 0) {
    status_->code = static_cast<uint32_t>(device::Status::HostAbort);
    status_->rank = static_cast<uint32_t>(me_);  // multi-process: whose process stopped the group
    storeHost(&status_->abort, 1);
  }
  throw Error(code, message);
}

void LocalGroup::throwIfFailedLocked(bool deep) {
  if (!poison_.empty())
    throw Error(poisonCode_, "communicator unusable after an earlier error: " + poison_);
  if (loadHost(&status_->abort) != 0) {
    const auto code = static_cast<device::Status>(status_->code);
    poisonAndThrow(code == device::Status::HostAbort ? ErrorCode::Internal : ErrorCode::Timeout, describeDeviceFailure());
  }
  // A kernel that died (illegal address, ...) never raises `abort`: asked where the host waits anyway.
  for (const auto& rr : ranks_) {
    if (!deep) break;
    if (!rr.launched) continue;  // ranks of other processes
    const cudaError_t e = cudaStreamQuery(rr.kernelStream);
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      // Compute lanes: a Gemm step whose wait expired traps; say who waited for what.
      const std::string gemm = gemmLaneTimeoutReport(this, static_cast<uint32_t>(&rr - ranks_.data()));
      poisonAndThrow(ErrorCode::CudaError, "the resident kernel on GPU " + std::to_string(rr.device) + " stopped: " +
                                               (e == cudaSuccess ? std::string("exited") : std::string(cudaGetErrorName(e)) +
                                                                                               ": " + cudaGetErrorString(e)) +
                                               (gemm.empty() ? std::string() : " (" + gemm + ")"));
    }
  }
}

// ---- schedules -----------------------------------------------------------------------------------------

CachedSchedule& LocalGroup::cacheLocked(const std::string& key, const std::function<Schedule()>& make,
                                        uint64_t inBytes, uint64_t outBytes, const std::string& what) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  auto c = std::make_unique<CachedSchedule>();
  c->schedule = make();
  c->what = what;
  c->inputBytes = inBytes;
  c->outputBytes = outBytes;
  if (c->schedule.nRanks != ranks_.size())
    throw Error(ErrorCode::InvalidArgument, "schedule has " + std::to_string(c->schedule.nRanks) +
                                                " ranks but the communicator " + std::to_string(ranks_.size()));
  LowerOptions lo;
  lo.nWorkers = workers_;
  lo.minBytesPerCta = config_.minBytesPerCta;
  for (uint32_t r = 0; r < ranks_.size(); ++r) c->programs.push_back(lowerPacked(packRank(c->schedule, r), r, lo));
  for (uint32_t r = 0; r < ranks_.size() && !config_.computeLanes; ++r)
    if (gemmCount(c->programs[r]) > 0)
      throw Error(ErrorCode::Unsupported, what + ": rank " + std::to_string(r) + " has " +
                                              std::to_string(gemmCount(c->programs[r])) +
                                              " Gemm step(s); create the communicator with CommConfig::computeLanes = true "
                                              "to run them (the compute-capable resident kernel)");
  c->scratchBytes = c->programs[0].scratchBytes;
  c->devicePrograms.assign(ranks_.size(), nullptr);
  try {
    for (const int lr : local_) {
      const auto r = static_cast<uint32_t>(lr);
      const auto& img = c->programs[r].image;
      MK_CUDA_CHECK(cudaSetDevice(ranks_[r].device));
      void* d = ranks_[r].arena->allocate(img.size(), "the lowered program of " + what);
      c->devicePrograms[r] = d;
      // The copy stream never waits for a user stream (non-blocking), so an upload cannot deadlock
      // against a stream that waits for an op this thread has yet to complete.
      MK_CUDA_CHECK(cudaMemcpyAsync(d, img.data(), img.size(), cudaMemcpyHostToDevice, ranks_[r].copyStream));
      MK_CUDA_CHECK(cudaStreamSynchronize(ranks_[r].copyStream));
    }
  } catch (...) {
    for (uint32_t r = 0; r < c->devicePrograms.size(); ++r) {
      if (!c->devicePrograms[r]) continue;
      cudaSetDevice(ranks_[r].device);
      ranks_[r].arena->release(c->devicePrograms[r]);
    }
    throw;
  }
  ensureScratchLocked(c->scratchBytes);
  auto& ref = *c;
  cache_.emplace(key, std::move(c));
  return ref;
}

void LocalGroup::ensureScratchLocked(uint64_t bytes) {
  if (bytes <= scratchBytes_) return;
  // Ops in flight keep using the old arenas (their descriptors hold the addresses): retire, do not free.
  const uint64_t size = std::max<uint64_t>(bytes, scratchBytes_ * 2);
  for (auto& rr : ranks_) {
    if (rr.device < 0) continue;  // a rank of another process
    MK_CUDA_CHECK(cudaSetDevice(rr.device));
    for (auto& p : rr.scratch) {
      if (p) rr.retired.push_back(p);
      p = nullptr;
      p = rr.arena->allocate(size, "a scratch arena");
    }
    rr.scratchBytes = size;
  }
  scratchBytes_ = size;
}

void* LocalGroup::stagingLocked(int r, uint32_t seq, uint64_t bytes) {
  RankResources& rr = ranks_[r];
  if (bytes > rr.stagingBytes) {
    MK_CUDA_CHECK(cudaSetDevice(rr.device));
    for (auto& p : rr.staging) {
      if (p) rr.retired.push_back(p);
      p = nullptr;
      p = rr.arena->allocate(bytes, "a staging buffer");
    }
    rr.stagingBytes = bytes;
  }
  return rr.staging[seq % device::kSlots];
}

// ---- submission ----------------------------------------------------------------------------------------

namespace {
struct GroupWait {
  LocalGroup* group;  // groups must outlive an open group (documented in communicator.hpp)
  int rank;
  cudaStream_t stream;
  uint32_t seq;
};
struct ThreadGroup {
  int depth = 0;
  std::vector<GroupWait> waits;
};
thread_local ThreadGroup tGroup;

std::string rangeText(const void* p, uint64_t bytes) {
  std::ostringstream os;
  os << p << " (+" << bytes << " bytes)";
  return os.str();
}
}  // namespace

void LocalGroup::waitRingSpaceLocked(int r, uint32_t seq) {
  if (seq < ringSlots_) return;
  const uint32_t need = seq - ringSlots_ + 1;
  // Multi-process: this rank's post slot is free once every rank wrote the descriptor of its old op.
  auto lagging = [&] {
    std::string lag;
    if (link_)
      for (int q = 0; q < size(); ++q)
        if (!seqGeq(loadHost(&link_->header().finalized[q]), need)) lag += (lag.empty() ? "" : ", ") + std::to_string(q);
    return lag;
  };
  if (seqGeq(fetched(r), need) && lagging().empty()) return;
  // Ops not yet submitted by every rank can never be fetched: waiting would deadlock a single thread.
  if (!link_ && !pending_.empty() && !seqGeq(pending_.begin()->first, need)) {
    const PendingOp& p = pending_.begin()->second;
    std::string missing;
    for (size_t q = 0; q < p.called.size(); ++q)
      if (!p.called[q]) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    throw Error(ErrorCode::InvalidArgument,
                "rank " + std::to_string(r) + " is " + std::to_string(ringSlots_) + " ops ahead of rank(s) " + missing +
                    ", which have not submitted op " + std::to_string(pending_.begin()->first) +
                    ": submit each op on every rank before the next (loop over ranks inside the loop over ops), or "
                    "raise CommConfig::ringSlots");
  }
  // Back-pressure: block (bounded) until the kernel has taken the slot's previous op.
  if (!hostPoll(config_.hostBudgetMs, [&] {
        pumpLocked();
        return (seqGeq(fetched(r), need) && lagging().empty()) || loadHost(&status_->abort) != 0;
      })) {
    const std::string lag = lagging();
    throw Error(ErrorCode::Timeout, "doorbell ring of rank " + std::to_string(r) + " stayed full for " +
                                        fmtMs(config_.hostBudgetMs) + ": the kernel has taken " +
                                        std::to_string(fetched(r)) + " ops, op " + std::to_string(seq) +
                                        " needs slot " + std::to_string(seq % ringSlots_) +
                                        (lag.empty() ? std::string(" (is a stream blocked?)")
                                                     : "; rank(s) " + lag + " have not submitted op " +
                                                           std::to_string(need - 1) + " yet (" +
                                                           std::to_string(ringSlots_) + " ops behind)"));
  }
  throwIfFailedLocked(true);
}

void LocalGroup::submitLocked(int r, const std::string& key, CachedSchedule& sched, const void* send, void* recv,
                              uint64_t inBytes, uint64_t outBytes, cudaStream_t stream) {
  RankResources& rr = ranks_[r];
  const uint32_t seq = rr.submitted;
  MK_LOG_AT(Debug, rankName(r), "op " + std::to_string(seq) + ": submitting " + sched.what);
  waitRingSpaceLocked(r, seq);

  PendingOp* op = nullptr;
  auto it = pending_.find(seq);
  if (it == pending_.end()) {
    PendingOp fresh;
    fresh.key = key;
    fresh.sched = &sched;
    fresh.called.assign(ranks_.size(), false);
    fresh.input.assign(ranks_.size(), nullptr);
    fresh.output.assign(ranks_.size(), nullptr);
    op = &pending_.emplace(seq, std::move(fresh)).first->second;
  } else {
    op = &it->second;
    if (op->key != key) {
      int first = 0;
      while (!op->called[first]) ++first;
      poisonAndThrow(ErrorCode::InvalidArgument,
                     "op " + std::to_string(seq) + " differs between ranks: rank " + std::to_string(first) +
                         " submitted " + op->sched->what + ", rank " + std::to_string(r) + " submitted " + sched.what +
                         " (every rank must submit the same collective with the same count, dtype, op and algorithm)");
    }
  }

  const auto& api = driverApi();
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  if (link_) {
    // Peers map these buffers through CUDA IPC: refuse one that cannot be exported before the doorbell rings.
    link_->exportPointer(send, "send buffer");
    link_->exportPointer(recv, "recv buffer");
  }
  const uintptr_t s0 = reinterpret_cast<uintptr_t>(send), r0 = reinterpret_cast<uintptr_t>(recv);
  const void* boundInput = send;
  if (send && inBytes > 0 && outBytes > 0 && s0 < r0 + outBytes && r0 < s0 + inBytes) {
    // In place (or any overlap): the schedule may write the output while a peer still reads the input,
    // so the input is staged first. Staging slot seq % 2 was last read by op seq - 2: wait for it.
    // The copy is stream work outside the kernel, so it must also wait for the previous op, which may
    // still be writing this very input (chained in-place ops in a group): in place costs one stream
    // wait per op.
    void* staging = stagingLocked(r, seq, inBytes);
    if (seq >= 1)
      checkDriver(api.streamWaitValue32(stream, reinterpret_cast<CUdeviceptr>(&rr.state->complete), seq,
                                        CU_STREAM_WAIT_VALUE_GEQ),
                  "cuStreamWaitValue32 (previous op complete before staging)");
    MK_CUDA_CHECK(cudaMemcpyAsync(staging, send, inBytes, cudaMemcpyDeviceToDevice, stream));
    boundInput = staging;
  }
  const bool grouped = tGroup.depth > 0;
  handoff(r, stream, seq, !grouped);
  rr.submitted = seq + 1;
  if (grouped) tGroup.waits.push_back(GroupWait{this, r, stream, seq});

  op->called[r] = true;
  op->input[r] = boundInput;
  op->output[r] = recv;
  if (send && inBytes) op->reads.emplace_back(s0, s0 + inBytes);
  if (recv && outBytes) op->writes.emplace_back(r0, r0 + outBytes);
  if (++op->calls == local_.size()) {
    if (link_) {
      postLocked(seq, *op);
      progressLocked();  // the peers may have posted already
      throwIfFailedLocked();
    } else {
      finalizeLocalLocked(seq, *op);
      pending_.erase(seq);
    }
  }
}

namespace {

/// True when compute-sanitizer is attached to this process. Its tools run one kernel at a time, so a kernel can
/// never run beside the resident one. compute-sanitizer 2025.3 preloads its libraries and sets
/// NV_SANITIZER_INJECTION_PORT_BASE (seen on the device, 2026-11-30); older versions injected through
/// CUDA_INJECTION64_PATH. Read once per rank when the hand-off is decided, never on the submission path.
bool kernelsSerialisedByTool() {
  if (std::getenv("NV_SANITIZER_INJECTION_PORT_BASE") != nullptr) return true;
  for (const char* var : {"CUDA_INJECTION64_PATH", "LD_PRELOAD"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::strstr(v, "sanitizer") != nullptr) return true;
  }
  return false;
}

}  // namespace

bool LocalGroup::useKernelHandoff(int r) {
  RankResources& rr = ranks_[r];
  if (rr.kernelHandoff < 0) {
    const bool serialised = kernelsSerialisedByTool();
    bool k = config_.streamHandoff == StreamHandoff::Kernel;
    if (k && serialised)
      throw Error(ErrorCode::InvalidArgument,
                  "CommConfig::streamHandoff = Kernel cannot work under compute-sanitizer: it runs one kernel at a "
                  "time, so the hand-off kernel would wait behind the resident kernel forever (use Auto or MemOps)");
    if (config_.streamHandoff == StreamHandoff::Auto) {
      // The hand-off kernel must find room beside the resident grid, or the caller's stream would wait for
      // an SM that never frees up: take it only when the grid leaves whole SMs idle, and never when a tool
      // serialises kernels (it could not run beside the resident kernel at all).
      int sms = 0;
      MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rr.device));
      k = !serialised && int64_t{workers_} + 1 < sms;
    }
    rr.kernelHandoff = k ? 1 : 0;
    MK_LOG_AT(Info, rankName(r), std::string("stream hand-off: ") +
                                     (k ? "a 32-thread kernel per op" : "stream memory operations") +
                                     (serialised ? " (compute-sanitizer attached)" : ""));
  }
  return rr.kernelHandoff == 1;
}

void LocalGroup::handoff(int r, cudaStream_t stream, uint32_t seq, bool wait) {
  const RankResources& rr = ranks_[r];
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  uint32_t* bell = &rr.doorbell[seq % ringSlots_];
  const auto& api = driverApi();
  MK_LOG_AT(Debug, rankName(r), "op " + std::to_string(seq) + ": doorbell" + (wait ? " and stream wait" : "") +
                                    " enqueued on stream " + std::to_string(reinterpret_cast<uintptr_t>(stream)));
  // In a group the doorbell is a stream memory write (no wait follows it, so nothing is descheduled and the
  // host pays ~1.3 us instead of a kernel launch); the group's one wait is the kernel's at groupEnd.
  if (!useKernelHandoff(r) || !wait) {
    checkDriver(api.streamWriteValue32(stream, reinterpret_cast<CUdeviceptr>(bell), seq + 1, CU_STREAM_WRITE_VALUE_DEFAULT),
                "cuStreamWriteValue32 (doorbell)");
    if (wait) enqueueWait(r, stream, seq);
    return;
  }
  MK_CUDA_CHECK(launchHandoff(bell, seq + 1, &rr.state->complete, seq + 1, true, &rr.state->abort,
                              static_cast<uint64_t>(config_.hostBudgetMs * 1e6), stream));
}

void LocalGroup::enqueueWait(int r, cudaStream_t stream, uint32_t seq) {
  const RankResources& rr = ranks_[r];
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  if (useKernelHandoff(r)) {
    MK_CUDA_CHECK(launchHandoff(nullptr, 0, &rr.state->complete, seq + 1, true, &rr.state->abort,
                                static_cast<uint64_t>(config_.hostBudgetMs * 1e6), stream));
    return;
  }
  checkDriver(driverApi().streamWaitValue32(stream, reinterpret_cast<CUdeviceptr>(&rr.state->complete), seq + 1,
                                            CU_STREAM_WAIT_VALUE_GEQ),
              "cuStreamWaitValue32 (op complete)");
}

void LocalGroup::finalizeLocked(uint32_t seq, const CachedSchedule& cs, const std::vector<uint64_t>& input,
                                const std::vector<uint64_t>& output, const std::vector<uint64_t>& scratch, bool fence) {
  // The descriptor slot's previous op must have been taken by every local rank's kernel.
  if (seq >= ringSlots_) {
    const uint32_t need = seq - ringSlots_ + 1;
    const bool ok = hostPoll(config_.hostBudgetMs, [&] {
      if (loadHost(&status_->abort) != 0) return true;
      for (const int q : local_)
        if (!seqGeq(fetched(q), need)) return false;
      return true;
    });
    if (!ok)
      poisonAndThrow(ErrorCode::Timeout, "descriptor ring slot " + std::to_string(seq % ringSlots_) + " for op " +
                                             std::to_string(seq) + " stayed busy for " + fmtMs(config_.hostBudgetMs));
    throwIfFailedLocked();
  }
  const uint32_t nB = static_cast<uint32_t>(cs.schedule.buffers.size());
  device::OpDescriptor& d = ring_[seq % ringSlots_];
  d.nBindings = static_cast<uint32_t>(ranks_.size()) * nB;
  d.flags = fence ? device::kOpFence : 0u;
  for (uint32_t q = 0; q < ranks_.size(); ++q) {
    d.program[q] = reinterpret_cast<uint64_t>(cs.devicePrograms[q]);  // kernels read only their own entry
    for (uint32_t b = 0; b < nB; ++b) {
      const BufferLayout& L = cs.programs[q].buffers[b];
      uint64_t addr = 0;
      switch (L.kind) {
        case BufferKind::Input: addr = input[q]; break;
        case BufferKind::Output:
        case BufferKind::InOut: addr = output[q]; break;
        case BufferKind::Scratch: addr = scratch[q] + L.scratchOffset; break;
      }
      d.table[q * nB + b] = addr;
    }
  }
  // ---- compute lanes: each local rank's Gemm steps get the GemmParams block (tensor maps) of this op's
  // addresses, after the schedule's bindings (table[nRanks * nB + rank]; gemm_lane.hpp).
  bool gemms = false;
  for (uint32_t q = 0; q < ranks_.size(); ++q) gemms = gemms || gemmCount(cs.programs[q]) > 0;
  if (gemms) {
    const uint32_t n = static_cast<uint32_t>(ranks_.size());
    for (uint32_t q = 0; q < n; ++q) d.table[device::gemmParamsBinding(n, nB, q)] = 0;
    for (const int lq : local_) {
      const auto q = static_cast<uint32_t>(lq);
      if (gemmCount(cs.programs[q]) == 0) continue;
      GemmLaneBinder& binder = gemmLaneBinder(this, q, ranks_[q].device, static_cast<uint64_t>(config_.pollBudgetMs * 1e6),
                                                ranks_[q].arena.get());
      d.table[device::gemmParamsBinding(n, nB, q)] =
          binder.bind(cs.programs[q], cs.devicePrograms[q], d.table, seq, completed(lq), ranks_[q].copyStream);
    }
    d.nBindings = n * nB + n;
  }
  opSchedule_[seq % ringSlots_] = &cs;
  storeHost(&d.seq, seq + 1);  // last, with release: the kernel reads seq first (acquire)
  finalized_ = seq + 1;
  if (link_) storeHost(&link_->header().finalized[me_], seq + 1);  // this rank's post slot may be reused
}

bool LocalGroup::touchesPreviousLocked(PendingOp& op) {
  // Rule 2 of resident_kernel.cu: an op that touches user memory the previous op touched (and one of the
  // two writes it) starts only after the previous op completed everywhere.
  auto hit = [](const std::vector<std::pair<uintptr_t, uintptr_t>>& x, const std::vector<std::pair<uintptr_t, uintptr_t>>& y) {
    for (const auto& a : x)
      for (const auto& b : y)
        if (a.first < b.second && b.first < a.second) return true;
    return false;
  };
  const bool fence = hit(op.writes, prevWrites_) || hit(op.writes, prevReads_) || hit(op.reads, prevWrites_);
  prevReads_ = std::move(op.reads);
  prevWrites_ = std::move(op.writes);
  return fence;
}

void LocalGroup::finalizeLocalLocked(uint32_t seq, PendingOp& op) {
  const bool fence = touchesPreviousLocked(op);
  const uint32_t slot = seq % device::kSlots;
  const size_t n = ranks_.size();
  std::vector<uint64_t> in(n), out(n), scratch(n);
  for (size_t q = 0; q < n; ++q) {
    in[q] = reinterpret_cast<uint64_t>(op.input[q]);
    out[q] = reinterpret_cast<uint64_t>(op.output[q]);
    scratch[q] = reinterpret_cast<uint64_t>(ranks_[q].scratch[slot]);
  }
  finalizeLocked(seq, *op.sched, in, out, scratch, fence);
}

// ---- multi-process: the post board ---------------------------------------------------------------------

void LocalGroup::postLocked(uint32_t seq, PendingOp& op) {
  const size_t me = static_cast<size_t>(me_);
  OpPost& p = link_->post(seq, me_);
  p.keyHash = fnv1a(op.key);
  std::snprintf(p.what, sizeof p.what, "%s", op.sched->what.c_str());
  p.input = link_->exportPointer(op.input[me], "input");
  p.output = link_->exportPointer(op.output[me], "output");
  p.scratch = link_->exportPointer(ranks_[me].scratch[seq % device::kSlots], "scratch arena");
  p.fence = touchesPreviousLocked(op) ? 1u : 0u;
  storeHost(&p.seq, seq + 1);  // last, with release: peers acquire it first
  op.posted = true;
  progressCv_.notify_all();
}

void LocalGroup::poisonLocked(ErrorCode code, const std::string& message) noexcept {
  if (poison_.empty()) {
    poison_ = message;
    poisonCode_ = code;
  }
  if (status_ && loadHost(&status_->abort) == 0) {
    status_->code = static_cast<uint32_t>(device::Status::HostAbort);
    status_->rank = static_cast<uint32_t>(me_);
    storeHost(&status_->abort, 1);
  }
}

void LocalGroup::progressLocked() {
  if (!link_ || !poison_.empty()) return;
  const size_t n = ranks_.size();
  const size_t me = static_cast<size_t>(me_);
  try {
    while (!pending_.empty()) {
      auto it = pending_.begin();
      const uint32_t seq = it->first;
      PendingOp& op = it->second;
      if (!op.posted) return;
      std::vector<const OpPost*> posts(n);
      for (size_t q = 0; q < n; ++q) {
        const OpPost& p = link_->post(seq, static_cast<int>(q));
        if (loadHost(&p.seq) != seq + 1) return;  // rank q has not submitted op seq yet: never wait for it
        posts[q] = &p;
      }
      bool fence = false;
      std::vector<uint64_t> in(n), out(n), scratch(n);
      MK_CUDA_CHECK(cudaSetDevice(ranks_[me].device));
      for (size_t q = 0; q < n; ++q) {
        const OpPost& p = *posts[q];
        if (p.keyHash != posts[me]->keyHash) {
          poisonLocked(ErrorCode::InvalidArgument,
                       "op " + std::to_string(seq) + " differs between ranks: rank " + std::to_string(me_) + " submitted " +
                           op.sched->what + ", rank " + std::to_string(q) + " submitted " +
                           std::string(p.what, strnlen(p.what, sizeof p.what)) +
                           " (every rank must submit the same collective with the same count, dtype, op and algorithm)");
          return;
        }
        fence = fence || p.fence != 0;
        const int qi = static_cast<int>(q);
        if (q == me) {
          in[q] = reinterpret_cast<uint64_t>(op.input[q]);
          out[q] = reinterpret_cast<uint64_t>(op.output[q]);
          scratch[q] = reinterpret_cast<uint64_t>(ranks_[q].scratch[seq % device::kSlots]);
        } else {
          in[q] = reinterpret_cast<uint64_t>(link_->importPointer(qi, p.input));
          out[q] = reinterpret_cast<uint64_t>(link_->importPointer(qi, p.output));
          scratch[q] = reinterpret_cast<uint64_t>(link_->importPointer(qi, p.scratch));
        }
      }
      finalizeLocked(seq, *op.sched, in, out, scratch, fence);
      pending_.erase(it);
    }
  } catch (const Error& e) {
    poisonLocked(e.code(), e.message());
  }
}

void LocalGroup::pumpLocked() {
  if (link_) progressLocked();
}

void LocalGroup::progressThread() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopProgress_.load()) {
    progressLocked();
    bool waiting = false;
    for (const auto& kv : pending_) waiting = waiting || kv.second.posted;
    if (waiting && poison_.empty()) {
      // A peer's post is due any moment (it is what this rank's kernel waits for): poll, lock released.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      progressCv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
}

void LocalGroup::stopProgressThread() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopProgress_ = true;
  }
  progressCv_.notify_all();
  if (progress_.joinable()) progress_.join();
}

std::string LocalGroup::unpostedRanks(uint32_t seq) const {
  std::string missing;
  if (!link_) return missing;
  for (int q = 0; q < size(); ++q)
    if (loadHost(&link_->post(seq, q).seq) != seq + 1) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
  return missing;
}

void LocalGroup::submitCollective(int r, const CollectiveSpec& specIn, const GenOptions& genIn, const void* send,
                                  void* recv, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  throwIfFailedLocked();
  CollectiveSpec spec = specIn;
  if (spec.algo.empty() || spec.algo == "auto") spec.algo = chooseAlgorithmLocked(spec.op, spec.count, spec.dtype);
  GenOptions gen = chooseGenOptions(spec.op, spec.count, spec.dtype, spec.algo);
  if (genIn.chunks) gen.chunks = genIn.chunks;
  if (genIn.channels) gen.channels = genIn.channels;
  const uint32_t n = static_cast<uint32_t>(ranks_.size());
  // The hierarchical inter-node variant, decided under the profile "auto" costs against (generate() alone
  // would use the datasheet one), and part of the cache key.
  gen.inter = resolveInter(spec, topology_.layout(n), gen, profile_);
  const uint64_t es = dtypeSize(spec.dtype);
  const uint64_t inBytes = inputCount(spec, n) * es, outBytes = outputCount(spec, n) * es;
  std::string key;
  key.reserve(96);
  key += toString(spec.op);
  for (uint64_t v : {spec.count, uint64_t(spec.dtype), uint64_t(spec.redop), uint64_t(spec.root), uint64_t(gen.chunks),
                     uint64_t(gen.channels)}) {
    key += '|';
    key += std::to_string(v);
  }
  key += '|';
  key += spec.algo;
  key += '|';
  key += gen.inter;
  auto make = [&] {
    Schedule s = generate(spec, topology_.layout(n), gen);
    ValidateOptions vo;
    vo.checkRaces = false;  // generators' own tests prove race freedom; this checks the shape we rely on
    validate(s, vo);
    return s;
  };
  std::string what;
  if (cache_.find(key) == cache_.end()) {
    std::ostringstream w;
    w << toString(spec.op) << ' ' << spec.algo << ' ' << toString(spec.dtype);
    if (spec.op == CollOp::AllReduce || spec.op == CollOp::ReduceScatter) w << ' ' << toString(spec.redop);
    if (spec.op == CollOp::Broadcast) w << " root " << spec.root;
    w << " count " << spec.count << " chunks " << gen.chunks << " channels " << gen.channels;
    what = w.str();
  }
  CachedSchedule& cs = cacheLocked(key, make, inBytes, outBytes, what);
  // Broadcast: non-root ranks never read their input; a null send is allowed there.
  submitLocked(r, key, cs, send, recv, send ? inBytes : 0, outBytes, stream);
}

void LocalGroup::submitSchedule(int r, const Schedule& s, const void* input, void* output, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  throwIfFailedLocked();
  const std::vector<uint8_t> image = pack(s);
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the packed image: same schedule, same key
  for (uint8_t b : image) h = (h ^ b) * 1099511628211ull;
  std::ostringstream key;
  key << "custom|" << std::hex << h << '|' << image.size();
  const std::string what = "custom schedule '" + s.info.op + (s.info.algo.empty() ? "" : " " + s.info.algo) + "'";
  // The user memory the op touches on this rank (every Input buffer is bound to `input`, every Output and
  // InOut one to `output`): the fence rule needs it, or back-to-back custom ops writing the same output
  // could overlap.
  uint64_t inBytes = 0, outBytes = 0;
  for (const BufferDecl& b : s.buffers) {
    const uint64_t bytes = static_cast<uint64_t>(r) < b.count.size() ? b.count[r] * dtypeSize(b.dtype) : 0;
    if (b.kind == BufferKind::Input) inBytes = std::max(inBytes, bytes);
    if (b.kind == BufferKind::Output || b.kind == BufferKind::InOut) outBytes = std::max(outBytes, bytes);
  }
  CachedSchedule& cs = cacheLocked(key.str(), [&] { return s; }, 0, 0, what);
  checkGemmOperands(cs.programs[static_cast<size_t>(r)], static_cast<uint32_t>(r), input, output);  // compute lanes
  submitLocked(r, key.str(), cs, input, output, inBytes, outBytes, stream);
}

// ---- algorithm choice ----------------------------------------------------------------------------------

GenOptions LocalGroup::chooseGenOptions(CollOp op, uint64_t count, DType dtype, const std::string& algo) const {
  CollectiveSpec spec;
  spec.op = op;
  spec.count = count;
  spec.dtype = dtype;
  const auto n = static_cast<uint32_t>(ranks_.size());
  return defaultGenOptions(op, algo, opBytes(spec, n), n);
}

std::string LocalGroup::chooseAlgorithm(CollOp op, uint64_t count, DType dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  return chooseAlgorithmLocked(op, count, dtype);
}

std::string LocalGroup::chooseAlgorithmLocked(CollOp op, uint64_t count, DType dtype) {
  const auto key = std::make_tuple(static_cast<int>(op), count, static_cast<int>(dtype));
  auto it = autoCache_.find(key);
  if (it != autoCache_.end()) return it->second;
  const std::vector<std::string> algos = algorithmsFor(op);
  if (algos.empty()) throw Error(ErrorCode::NotFound, std::string("no generator exists for ") + toString(op));
  const Profile& profile = profile_;
  std::string best;
  double bestUs = 0;
  for (const auto& a : algos) {
    CollectiveSpec spec;
    spec.op = op;
    spec.algo = a;
    spec.count = count;
    spec.dtype = dtype;
    try {
      const double t = closedForm(spec, chooseGenOptions(op, count, dtype, a), topology_,
                                  static_cast<uint32_t>(ranks_.size()), profile).totalUs;
      if (std::isfinite(t) && (best.empty() || t < bestUs)) {
        best = a;
        bestUs = t;
      }
    } catch (const Error&) {
      // No closed form for this generator (or it does not apply here): not a candidate.
    }
  }
  if (best.empty()) best = algos.front();
  autoCache_.emplace(key, best);
  return best;
}

// ---- host-side waits and observations -------------------------------------------------------------------

uint64_t LocalGroup::submitted(int r) {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_[r].submitted;
}

void LocalGroup::synchronize(int r) {
  std::lock_guard<std::mutex> lock(mu_);
  throwIfFailedLocked(true);
  for (const auto& kv : pending_) {
    if (link_) break;  // multi-process: peers may still submit (waited for below, bounded)
    std::string missing;
    for (size_t q = 0; q < kv.second.called.size(); ++q)
      if (!kv.second.called[q]) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    if (kv.second.called[r])
      throw Error(ErrorCode::InvalidArgument, "synchronize on rank " + std::to_string(r) + ": op " +
                                                  std::to_string(kv.first) + " (" + kv.second.sched->what +
                                                  ") has not been submitted by rank(s) " + missing +
                                                  " yet, so it can never complete");
  }
  const uint32_t want = ranks_[r].submitted;
  MK_LOG_AT(Debug, rankName(r), "synchronize: waiting for " + std::to_string(want) + " op(s), " +
                                    std::to_string(completed(r)) + " complete");
  const bool ok = hostPoll(config_.hostBudgetMs, [&] {
    pumpLocked();
    if (!poison_.empty() || loadHost(&status_->abort) != 0) return true;
    if (seqGeq(completed(r), want)) return true;
    return cudaStreamQuery(ranks_[r].kernelStream) != cudaErrorNotReady;
  });
  throwIfFailedLocked(true);
  if (!ok && link_ && !pending_.empty()) {
    const auto& kv = *pending_.begin();
    poisonAndThrow(ErrorCode::Timeout, "synchronize on rank " + std::to_string(r) + ": op " + std::to_string(kv.first) +
                                           " (" + kv.second.sched->what + ") was not submitted by rank(s) " +
                                           unpostedRanks(kv.first) + " within " + fmtMs(config_.hostBudgetMs));
  }
  if (!ok)
    poisonAndThrow(ErrorCode::Timeout, "synchronize on rank " + std::to_string(r) + ": " + std::to_string(completed(r)) +
                                           " of " + std::to_string(want) + " ops completed after " +
                                           fmtMs(config_.hostBudgetMs) + " (is a stream blocked?)");
}

OpTiming LocalGroup::opTiming(int r, uint64_t op) {
  std::lock_guard<std::mutex> lock(mu_);
  device::OpStamp st{};
  MK_CUDA_CHECK(cudaSetDevice(ranks_[r].device));
  MK_CUDA_CHECK(cudaMemcpyAsync(&st, &ranks_[r].stamps[op % ringSlots_], sizeof st, cudaMemcpyDeviceToHost,
                                ranks_[r].copyStream));
  MK_CUDA_CHECK(cudaStreamSynchronize(ranks_[r].copyStream));
  if (st.op != static_cast<uint32_t>(op) || st.completeNs == 0)
    throw Error(ErrorCode::NotFound, "timestamps of op " + std::to_string(op) + " on rank " + std::to_string(r) +
                                         " are not available (not complete yet, or overwritten by later ops)");
  OpTiming t;
  t.op = op;
  t.doorbellNs = st.doorbellNs;
  t.publishNs = st.publishNs;
  t.firstStepNs = st.firstStepNs;
  t.localDoneNs = st.localDoneNs;
  t.completeNs = st.completeNs;
  return t;
}

ClockSync LocalGroup::calibrateClock(int r, int rounds) {
  if (rounds < 1) throw Error(ErrorCode::InvalidArgument, "calibrateClock: rounds must be >= 1");
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t* ping = clockPing_;
  uint64_t* pong = clockPong_;
  storeHost(ping, 0);
  pong[1] = 0;
  MK_CUDA_CHECK(cudaSetDevice(ranks_[r].device));
  MK_CUDA_CHECK(launchClockProbe(ping, pong, static_cast<uint32_t>(rounds), 1000000000ull, ranks_[r].copyStream));
  auto hostNs = [] {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
  };
  ClockSync best;
  best.uncertaintyNs = -1;
  volatile uint64_t* vp = pong;
  for (int i = 1; i <= rounds; ++i) {
    const double t0 = hostNs();
    storeHost(ping, static_cast<uint32_t>(i));
    if (!hostPoll(1000, [&] { return static_cast<uint32_t>(vp[1]) == static_cast<uint32_t>(i); })) {
      storeHost(ping, 0xFFFFFFFFu);  // the probe leaves at once if it ever runs
      hostPoll(2000, [&] { return cudaStreamQuery(ranks_[r].copyStream) != cudaErrorNotReady; });
      throw Error(ErrorCode::Timeout, "calibrateClock: the probe kernel on GPU " + std::to_string(ranks_[r].device) +
                                          " did not answer ping " + std::to_string(i) + " within 1 s");
    }
    const double t1 = hostNs();
    const double g = static_cast<double>(vp[0]);
    const double half = (t1 - t0) / 2;
    if (best.uncertaintyNs < 0 || half < best.uncertaintyNs) {
      best.uncertaintyNs = half;
      best.offsetNs = g - (t0 + half);
    }
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(ranks_[r].copyStream));
  return best;
}

std::vector<TraceEvent> LocalGroup::takeTrace(int r) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TraceEvent> out;
  if (!trace_) return out;
  uint32_t count = 0;
  MK_CUDA_CHECK(cudaSetDevice(ranks_[r].device));
  MK_CUDA_CHECK(cudaMemcpyAsync(&count, &ranks_[r].state->traceCount, sizeof count, cudaMemcpyDeviceToHost,
                                ranks_[r].copyStream));
  MK_CUDA_CHECK(cudaStreamSynchronize(ranks_[r].copyStream));
  count = std::min(count, config_.traceCapacity);
  const device::TraceRecord* rec = &trace_[size_t(r) * config_.traceCapacity];
  for (uint32_t i = traceTaken_[r]; i < count; ++i) {
    TraceEvent e;
    e.rank = static_cast<uint32_t>(r);
    e.lane = rec[i].lane;
    e.step = rec[i].step;
    e.op = rec[i].op;
    e.kind = static_cast<StepKind>(rec[i].kind);
    e.startNs = rec[i].startNs;
    e.endNs = rec[i].endNs;
    out.push_back(e);
  }
  traceTaken_[r] = count;
  return out;
}

}  // namespace runtime

// ---- Communicator --------------------------------------------------------------------------------------

std::vector<Communicator> Communicator::createLocal(const std::vector<int>& devices, const CommConfig& config) {
  auto group = std::make_shared<runtime::LocalGroup>(devices, config);
  std::vector<Communicator> out;
  for (int r = 0; r < static_cast<int>(devices.size()); ++r) out.push_back(Communicator(group, r));
  return out;
}

Communicator Communicator::create(Bootstrap& bootstrap, int device, const CommConfig& config) {
  auto group = std::make_shared<runtime::LocalGroup>(bootstrap, device, config);
  const int rank = group->ownRank();
  return Communicator(std::move(group), rank);
}

Communicator Communicator::createFromEnvironment(const CommConfig& config) {
  // Started by mpirun without MASTER_ADDR (and built with MPI): MPI itself is the rendezvous, and the node
  // rank it reports picks the GPU. Otherwise the TCP rendezvous of the launch variables.
  std::unique_ptr<Bootstrap> boot;
  int rank = 0;
  int localRank = 0;
  LaunchEnvironment env;
  if (preferMpiBootstrap()) {
    boot = makeMpiBootstrap(config.hostBudgetMs, &localRank);
    rank = boot->rank();
  } else {
    env = readLaunchEnvironment();
    rank = env.rank;
    localRank = env.localRank;
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::Unsupported, "rank " + std::to_string(rank) + ": no usable CUDA device (" +
                                            cudaGetErrorName(e) + ")");
  }
  if (localRank >= count)
    throw Error(ErrorCode::InvalidArgument, "rank " + std::to_string(rank) + (boot ? ": node rank " : ": LOCAL_RANK ") +
                                                std::to_string(localRank) + " picks GPU " + std::to_string(localRank) +
                                                " but this process sees " + std::to_string(count) +
                                                " GPU(s) (more processes per node than GPUs?)");
  if (!boot) {
    TcpBootstrapOptions o;
    o.rank = env.rank;
    o.size = env.size;
    o.addr = env.masterAddr;
    o.port = env.masterPort;
    o.timeoutMs = config.hostBudgetMs;
    boot = std::make_unique<TcpBootstrap>(o);
  }
  return create(*boot, localRank, config);
}

bool Communicator::multiProcess() const noexcept { return group_ && group_->multiProcess(); }

Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

int Communicator::size() const noexcept { return group_ ? group_->size() : 0; }
int Communicator::device() const noexcept { return group_ ? group_->rank(rank_).device : -1; }
const Topology& Communicator::topology() const noexcept { return group_->topology(); }
const std::string& Communicator::topologySource() const noexcept { return group_->topologySource(); }
const std::string& Communicator::profileSource() const noexcept { return group_->profileSource(); }
uint32_t Communicator::workerCtas() const noexcept { return group_ ? group_->workers() : 0; }

namespace {
/// Memory from a stream-ordered pool (cudaMallocAsync) is reachable from a peer GPU only where the pool
/// grants it (cudaMemPoolSetAccess); cudaDeviceEnablePeerAccess does not cover pools.
void checkPoolAccess(const void* p, const char* which, const std::vector<int>& peers, const char* call) {
  void* pool = nullptr;
  const CUresult r = runtime::driverApi().pointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                                               reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS || pool == nullptr) return;  // not pool memory: peer access covers it
  for (int peer : peers) {
    cudaMemLocation loc{};
    loc.type = cudaMemLocationTypeDevice;
    loc.id = peer;
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    if (cudaMemPoolGetAccess(&flags, static_cast<cudaMemPool_t>(pool), &loc) != cudaSuccess) cudaGetLastError();
    if (flags != cudaMemAccessFlagsProtReadWrite)
      throw Error(ErrorCode::InvalidArgument,
                  std::string(call) + ": " + which + " comes from a stream-ordered memory pool that GPU " +
                      std::to_string(peer) +
                      " cannot access; grant it with cudaMemPoolSetAccess (peer access does not cover pools)");
  }
}

void checkPointer(const void* p, const char* which, uint64_t elemSize, int device, const char* call) {
  if (!p) throw Error(ErrorCode::InvalidArgument, std::string(call) + ": " + which + " is null");
  if (reinterpret_cast<uintptr_t>(p) % elemSize != 0)
    throw Error(ErrorCode::InvalidArgument, std::string(call) + ": " + which + " " + runtime::rangeText(p, 0) +
                                                " is not aligned to the element size (" + std::to_string(elemSize) +
                                                " bytes)");
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) cudaGetLastError();
  if (e != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
      attr.device != device)
    throw Error(ErrorCode::InvalidArgument,
                std::string(call) + ": " + which + " must be device memory of GPU " + std::to_string(device) +
                    " (got " + (e != cudaSuccess ? "an unknown pointer"
                                : attr.type == cudaMemoryTypeHost ? "pinned host memory"
                                : attr.type == cudaMemoryTypeUnregistered ? "pageable host memory"
                                                                          : "memory of GPU " + std::to_string(attr.device)) +
                    ")");
}
}  // namespace

void Communicator::collective(const CollectiveSpec& specIn, const void* send, void* recv, cudaStream_t stream,
                              const CollOptions& opt) {
  if (!group_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  const char* call = toString(specIn.op);
  CollectiveSpec spec = specIn;
  if (spec.count == 0) throw Error(ErrorCode::InvalidArgument, std::string(call) + ": count must be > 0");
  if (spec.dtype != DType::Float32 && spec.dtype != DType::BFloat16 && spec.dtype != DType::Float16)
    throw Error(ErrorCode::Unsupported, std::string(call) + ": dtype code " + std::to_string(int(spec.dtype)) +
                                            " is not supported (float32, bfloat16, float16)");
  if (spec.redop != RedOp::Sum && spec.redop != RedOp::Max && spec.redop != RedOp::Min)
    throw Error(ErrorCode::Unsupported, std::string(call) + ": reduction operator code " +
                                            std::to_string(int(spec.redop)) + " is not supported (sum, max, min)");
  if (spec.op == CollOp::Broadcast && spec.root >= static_cast<uint32_t>(size()))
    throw Error(ErrorCode::InvalidArgument, std::string(call) + ": root " + std::to_string(spec.root) +
                                                " is outside 0.." + std::to_string(size() - 1));
  const uint64_t es = dtypeSize(spec.dtype);
  if (spec.count > (uint64_t{1} << 46) / es / static_cast<uint64_t>(size()))
    throw Error(ErrorCode::InvalidArgument, std::string(call) + ": count " + std::to_string(spec.count) + " is too large");
  const bool sendOptional = spec.op == CollOp::Broadcast && static_cast<uint32_t>(rank_) != spec.root;
  // cudaPointerGetAttributes costs about a microsecond: pointers validated recently on this rank are
  // trusted (still checked for null and alignment, which depend on the dtype).
  auto check = [&](const void* p, const char* which) {
    if (p && reinterpret_cast<uintptr_t>(p) % es == 0)
      for (const void* known : checked_)
        if (known == p) return;
    checkPointer(p, which, es, device(), call);
    // Multi-process: peers reach the buffer through CUDA IPC; the export refuses what it cannot share.
    if (group_->multiProcess()) {
      checked_[checkedNext_++ % 4] = p;
      return;
    }
    std::vector<int> peers;
    for (int q = 0; q < size(); ++q)
      if (q != rank_) peers.push_back(group_->rank(q).device);
    checkPoolAccess(p, which, peers, call);
    checked_[checkedNext_++ % 4] = p;
  };
  if (!(sendOptional && send == nullptr)) check(send, "send");
  check(recv, "recv");
  spec.algo = opt.algo.empty() ? "auto" : opt.algo;
  GenOptions gen;
  gen.chunks = opt.chunks;
  gen.channels = opt.channels;
  group_->submitCollective(rank_, spec, gen, send, recv, stream);
}

namespace {
/// The spec of one collective call (the per-op entry points differ only in these fields).
CollectiveSpec callSpec(CollOp op, uint64_t count, DType dtype, RedOp redop = RedOp::Sum, uint32_t root = 0) {
  CollectiveSpec s;
  s.op = op;
  s.count = count;
  s.dtype = dtype;
  s.redop = redop;
  s.root = root;
  return s;
}
}  // namespace

void Communicator::allReduce(const void* send, void* recv, uint64_t count, DType dtype, RedOp op, cudaStream_t stream,
                             const CollOptions& opt) {
  collective(callSpec(CollOp::AllReduce, count, dtype, op), send, recv, stream, opt);
}
void Communicator::allGather(const void* send, void* recv, uint64_t count, DType dtype, cudaStream_t stream,
                             const CollOptions& opt) {
  collective(callSpec(CollOp::AllGather, count, dtype), send, recv, stream, opt);
}
void Communicator::reduceScatter(const void* send, void* recv, uint64_t count, DType dtype, RedOp op,
                                 cudaStream_t stream, const CollOptions& opt) {
  collective(callSpec(CollOp::ReduceScatter, count, dtype, op), send, recv, stream, opt);
}
void Communicator::broadcast(const void* send, void* recv, uint64_t count, DType dtype, uint32_t root,
                             cudaStream_t stream, const CollOptions& opt) {
  collective(callSpec(CollOp::Broadcast, count, dtype, RedOp::Sum, root), send, recv, stream, opt);
}
void Communicator::allToAll(const void* send, void* recv, uint64_t count, DType dtype, cudaStream_t stream,
                            const CollOptions& opt) {
  collective(callSpec(CollOp::AllToAll, count, dtype), send, recv, stream, opt);
}

void Communicator::execute(const Schedule& s, const void* input, void* output, cudaStream_t stream) {
  if (!group_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  if (s.nRanks != static_cast<uint32_t>(size()))
    throw Error(ErrorCode::InvalidArgument, "execute: schedule has " + std::to_string(s.nRanks) +
                                                " ranks, the communicator " + std::to_string(size()));
  group_->submitSchedule(rank_, s, input, output, stream);
}

std::string Communicator::chooseAlgorithm(CollOp op, uint64_t count, DType dtype) const {
  return group_->chooseAlgorithm(op, count, dtype);
}
GenOptions Communicator::chooseGenOptions(CollOp op, uint64_t count, DType dtype, const std::string& algo) const {
  return group_->chooseGenOptions(op, count, dtype, algo == "auto" || algo.empty() ? chooseAlgorithm(op, count, dtype) : algo);
}
void Communicator::synchronize() { group_->synchronize(rank_); }
uint64_t Communicator::nextOpIndex() const { return group_->submitted(rank_); }
OpTiming Communicator::opTiming(uint64_t op) const { return group_->opTiming(rank_, op); }
ClockSync Communicator::calibrateClock(int rounds) const { return group_->calibrateClock(rank_, rounds); }
std::vector<TraceEvent> Communicator::takeTrace() { return group_->takeTrace(rank_); }

void groupStart() { ++runtime::tGroup.depth; }

void groupEnd() {
  auto& g = runtime::tGroup;
  if (g.depth == 0) throw Error(ErrorCode::InvalidArgument, "groupEnd without groupStart");
  if (--g.depth > 0) return;
  std::vector<runtime::GroupWait> waits;
  waits.swap(g.waits);
  // The last op per (group, rank, stream): ops of one rank complete in order, so one wait covers all.
  for (size_t i = 0; i < waits.size(); ++i) {
    bool later = false;
    for (size_t j = i + 1; j < waits.size(); ++j)
      if (waits[j].group == waits[i].group && waits[j].rank == waits[i].rank && waits[j].stream == waits[i].stream)
        later = true;
    if (!later) waits[i].group->enqueueWait(waits[i].rank, waits[i].stream, waits[i].seq);
  }
}

std::string traceToChromeJson(const std::vector<TraceEvent>& events, const std::string& label) {
  uint64_t t0 = UINT64_MAX;
  for (const auto& e : events) t0 = std::min(t0, e.startNs);
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"" << label << "\"},\"traceEvents\":[";
  bool first = true;
  std::set<uint32_t> ranks;
  for (const auto& e : events) ranks.insert(e.rank);
  for (uint32_t r : ranks) {
    os << (first ? "" : ",") << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << r
       << ",\"args\":{\"name\":\"rank " << r << "\"}}";
    first = false;
  }
  for (const auto& e : events) {
    os << (first ? "" : ",") << "{\"name\":\"" << toString(e.kind) << "\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":" << e.rank
       << ",\"tid\":" << e.lane << ",\"ts\":" << double(e.startNs - t0) / 1e3
       << ",\"dur\":" << double(e.endNs >= e.startNs ? e.endNs - e.startNs : 0) / 1e3 << ",\"args\":{\"op\":" << e.op
       << ",\"step\":" << e.step << "}}";
    first = false;
  }
  os << "]}";
  return os.str();
}

}  // namespace mk
