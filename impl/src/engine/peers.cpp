// mkernel — which GPUs an engine's ranks use and how they reach each other: in one process, peer access between
// every pair of its GPUs; one process per GPU, what each process tells the others through the bootstrap and the
// peers' memory it maps. Both end with the topology and profile the "auto" choice costs against.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "device/driver_api.hpp"
#include "device/topology_probe.hpp"
#include "engine/engine.hpp"
#include "engine/host_log.hpp"
#include "engine/internode.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

namespace {
/// Topology for the "auto" choice: the h200x2 pair's preset, else a node of this many GPUs like `prop`.
Topology detectTopology(const cudaDeviceProp& prop, size_t n) {
  const std::string name = prop.name;
  if (n == 2 && name.find("H200") != std::string::npos) return topologyPreset("h200x2");
  Topology t = topologyPreset(name.find("H100") != std::string::npos ? "dgx-h100" : "dgx-h200");
  t.name = "local";
  t.node.gpu = name;
  t.node.gpus = static_cast<uint32_t>(n);
  t.node.sms = static_cast<uint32_t>(prop.multiProcessorCount);
  t.node.nics = 0;
  t.node.nic = NicSpec{};
  return t;
}

std::string peerAccessRefusal(int devA, int rankA, int devB, int rankB) {
  return "GPU " + std::to_string(devA) + " (rank " + std::to_string(rankA) + ") cannot access the memory of GPU " +
         std::to_string(devB) + " (rank " + std::to_string(rankB) +
         "): cudaDeviceCanAccessPeer = 0; the engine needs NVLink or PCIe peer access between every pair of its GPUs";
}
}  // namespace

void Engine::refineTopology(const std::vector<NvlinkProbe>& probes, int major) {
  if (ctx_.topology.name == "h200x2") {
    // The preset holds numbers measured on this very machine: keep them, say what NVML sees.
    Topology probe = ctx_.topology;
    ctx_.topologySource = "preset h200x2 (NVML: " + applyNvlinkProbes(probe, probes, major) + ")";
  } else {
    ctx_.topologySource =
        "local, like " + ctx_.topology.node.gpu + " (NVML: " + applyNvlinkProbes(ctx_.topology, probes, major) + ")";
  }
  // The profile of the "auto" choice: loaded once, here, so that a bad file fails the creation, not an op.
  if (ctx_.config.profile.empty()) {
    ctx_.profile = defaultProfile(ctx_.topology);
    ctx_.profileSource = ctx_.profile.source;
  } else {
    ctx_.profile = loadProfile(ctx_.config.profile);
    ctx_.profileSource = ctx_.profile.source + " (" + ctx_.config.profile + ")";
  }
}

void Engine::init(const std::vector<int>& devices) {
  const size_t n = devices.size();
  if (n == 0) throw Error(ErrorCode::InvalidArgument, "createLocal: the device list is empty");
  if (n > device::kMaxRanks)
    throw Error(ErrorCode::Unsupported, "createLocal: " + std::to_string(n) +
                                            " ranks asked for; the GPU engine drives at most " +
                                            std::to_string(device::kMaxRanks) + " (one NVLink domain)");
  int count = 0;
  const cudaError_t cerr = cudaGetDeviceCount(&count);
  if (cerr != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::Unsupported,
                std::string("createLocal: no usable CUDA device (") + cudaGetErrorName(cerr) + ")");
  }
  if (ctx_.config.ranksPerNode != 0 && ctx_.config.ranksPerNode < n)
    throw Error(ErrorCode::Unsupported,
                "createLocal: CommConfig::ranksPerNode " + std::to_string(ctx_.config.ranksPerNode) + " splits its " +
                    std::to_string(n) +
                    " ranks into several nodes, but the ranks of one process form one node; run one process per "
                    "rank (Communicator::createFromEnvironment) to put ranks on several nodes");
  std::set<int> seen;
  for (size_t i = 0; i < n; ++i) {
    if (devices[i] < 0 || devices[i] >= count)
      throw Error(ErrorCode::InvalidArgument, "createLocal: rank " + std::to_string(i) + " asks for device " +
                                                  std::to_string(devices[i]) + " but this process sees " +
                                                  std::to_string(count) + " device(s) (more ranks than GPUs?)");
    if (!seen.insert(devices[i]).second && !ctx_.config.shareGpus)
      throw Error(ErrorCode::InvalidArgument, "createLocal: device " + std::to_string(devices[i]) +
                                                  " is listed twice (one rank per GPU, unless CommConfig::shareGpus)");
  }
  ctx_.nodeOf.assign(n, 0);
  driverApi();  // fail early, before anything is allocated, if stream memory operations are missing
  MK_LOG_AT(
      Info, "createLocal", std::to_string(n) + " rank(s) on GPU(s) " + [&] {
        std::string l;
        for (int d : devices) l += (l.empty() ? "" : ",") + std::to_string(d);
        return l;
      }());

  // Peer access both ways between every pair, or refuse naming the pair.
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) {
      if (a == b || devices[a] == devices[b]) continue;  // a GPU reaches its own memory (shareGpus)
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
  ctx_.topology = detectTopology(prop, n);
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
        if (j != i && bus[j] != bus[i]) peers.push_back(bus[j]);
      probes.push_back(probeNvlinks(bus[i], peers));
    }
    refineTopology(probes, prop.major);
  }
  // Grid: control block + workers, all co-resident on every GPU.
  for (size_t i = 0; i < n; ++i) {
    const auto sharers = static_cast<uint32_t>(std::count(devices.begin(), devices.end(), devices[i]));
    const uint32_t w = workersFor(devices[i], sharers);
    ctx_.workers = i == 0 ? w : std::min(ctx_.workers, w);
  }

  MK_LOG_AT(Info, "createLocal",
            "peer access enabled between every pair; " + std::to_string(ctx_.workers) + " worker CTAs per GPU");
  allocHostBlocks(n);
  ctx_.ranks.resize(n);
  for (size_t i = 0; i < n; ++i) {
    ctx_.local.push_back(static_cast<int>(i));
    allocRank(static_cast<int>(i), devices[i]);
  }
  for (size_t i = 0; i < n; ++i) ctx_.peerStates.push_back(ctx_.ranks[i].state);
}

namespace {
/// What every process tells the others first: where it runs, so that nodes and shared GPUs are known before
/// anything is allocated.
struct PlacementInfo {
  char host[64];
  uint8_t uuid[16];
  uint32_t ranksPerNode;
  uint32_t shareGpus;
};

/// Nodes of `hosts` (one entry per rank): ranks of one host form one node, or nodes of `ranksPerNode` ranks in
/// rank order when it is not 0. Node ids are dense, in order of each node's first rank.
std::vector<uint32_t> nodesOf(const std::vector<std::string>& hosts, uint32_t ranksPerNode) {
  std::vector<uint32_t> nodeOf(hosts.size());
  std::vector<std::pair<std::string, uint32_t>> seen;                      // host -> ranks of it placed so far
  std::vector<std::pair<std::pair<std::string, uint32_t>, uint32_t>> ids;  // (host, chunk) -> node id
  for (size_t r = 0; r < hosts.size(); ++r) {
    uint32_t index = 0;
    auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& e) { return e.first == hosts[r]; });
    if (it == seen.end()) {
      seen.emplace_back(hosts[r], 1);
    } else {
      index = it->second++;
    }
    const auto key = std::make_pair(hosts[r], ranksPerNode ? index / ranksPerNode : 0u);
    auto id = std::find_if(ids.begin(), ids.end(), [&](const auto& e) { return e.first == key; });
    if (id == ids.end()) {
      ids.emplace_back(key, static_cast<uint32_t>(ids.size()));
      nodeOf[r] = ids.back().second;
    } else {
      nodeOf[r] = id->second;
    }
  }
  return nodeOf;
}

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
  IpcRef arena;                                 ///< the device arena's block (bufferId 0: none)
  IpcRef premapped[CommConfig::kMaxPremapped];  ///< CommConfig::premappedBuffers
};
}  // namespace

void Engine::initProcess(Bootstrap& boot, int dev) {
  const int n = boot.size();
  ctx_.me = boot.rank();
  const std::string who = "rank " + std::to_string(ctx_.me);
  if (n < 1 || ctx_.me < 0 || ctx_.me >= n)
    throw Error(ErrorCode::InvalidArgument,
                "bootstrap reports rank " + std::to_string(ctx_.me) + " of " + std::to_string(n));
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
    throw Error(ErrorCode::InvalidArgument, who + " asks for device " + std::to_string(dev) +
                                                " but this process sees " + std::to_string(count) +
                                                " device(s) (LOCAL_RANK beyond the GPUs of this node?)");
  driverApi();
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  MK_CUDA_CHECK(cudaSetDevice(dev));

  // Where every rank runs: its node (host, split by CommConfig::ranksPerNode) and which ranks share a GPU.
  PlacementInfo place{};
  gethostname(place.host, sizeof place.host - 1);
  std::memcpy(place.uuid, &prop.uuid, sizeof place.uuid);
  place.ranksPerNode = ctx_.config.ranksPerNode;
  place.shareGpus = ctx_.config.shareGpus ? 1u : 0u;
  std::vector<PlacementInfo> places(static_cast<size_t>(n));
  {
    const std::vector<uint8_t> all = boot.allGather(&place, sizeof place);
    std::memcpy(places.data(), all.data(), all.size());
  }
  std::vector<std::string> hosts;
  uint32_t sharers = 0;
  for (int q = 0; q < n; ++q) {
    const PlacementInfo& pq = places[static_cast<size_t>(q)];
    if (pq.ranksPerNode != place.ranksPerNode || pq.shareGpus != place.shareGpus)
      throw Error(ErrorCode::InvalidArgument,
                  "rank " + std::to_string(q) + " uses CommConfig::ranksPerNode " + std::to_string(pq.ranksPerNode) +
                      " and shareGpus " + std::to_string(pq.shareGpus) + ", " + who + " " +
                      std::to_string(place.ranksPerNode) + " and " + std::to_string(place.shareGpus) +
                      " (every rank must use the same config)");
    hosts.emplace_back(pq.host, strnlen(pq.host, sizeof pq.host));
    const bool sameGpu = hosts.back() == std::string(place.host) && std::memcmp(pq.uuid, place.uuid, 16) == 0;
    if (sameGpu) ++sharers;
    if (sameGpu && q != ctx_.me && !ctx_.config.shareGpus)
      throw Error(ErrorCode::InvalidArgument,
                  "ranks " + std::to_string(std::min(q, ctx_.me)) + " and " + std::to_string(std::max(q, ctx_.me)) +
                      " both use GPU " + std::to_string(dev) + " of host '" + hosts.back() +
                      "' (one rank per GPU: check LOCAL_RANK and CUDA_VISIBLE_DEVICES, or set CommConfig::shareGpus "
                      "to run several ranks on one GPU)");
  }
  ctx_.nodeOf = nodesOf(hosts, ctx_.config.ranksPerNode);
  int leader = 0;
  while (ctx_.nodeOf[static_cast<size_t>(leader)] != ctx_.nodeOf[static_cast<size_t>(ctx_.me)]) ++leader;
  // Several nodes: the control block's warps from the third on apply what other nodes send (the inbox).
  if (ctx_.nodeCount() > 1 && ctx_.config.threadsPerCta < 96)
    throw Error(ErrorCode::InvalidArgument,
                "CommConfig::threadsPerCta must be at least 96 when the ranks span nodes "
                "(got " +
                    std::to_string(ctx_.config.threadsPerCta) +
                    "): the control block's third warp on applies the inbox");
  const uint32_t myWorkers = workersFor(dev, sharers);

  MK_LOG_AT(Info, who,
            "bootstrap: " + std::to_string(n) + " rank(s) on " + std::to_string(ctx_.nodeCount()) +
                " node(s); this process drives GPU " + std::to_string(dev) + " on node " +
                std::to_string(ctx_.nodeOf[static_cast<size_t>(ctx_.me)]) +
                (sharers > 1 ? " (shared by " + std::to_string(sharers) + " ranks)" : std::string()));
  ctx_.link = std::make_unique<ProcessLink>(boot, ctx_.ringSlots, leader);
  ctx_.status = &ctx_.link->header().status;
  ctx_.ranks.resize(static_cast<size_t>(n));
  ctx_.local = {ctx_.me};
  allocRank(ctx_.me, dev);

  ProcessInfo mine{};
  gethostname(mine.host, sizeof mine.host - 1);
  MK_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.busId, sizeof mine.busId, dev));
  std::memcpy(mine.gpu, prop.name, sizeof mine.gpu - 1);
  std::memcpy(mine.uuid, &prop.uuid, sizeof mine.uuid);
  mine.device = dev;
  mine.workers = myWorkers;
  mine.ringSlots = ctx_.ringSlots;
  mine.state = ctx_.link->exportPointer(ctx_.ranks[static_cast<size_t>(ctx_.me)].state, "engine state");
  mine.arena = ctx_.link->exportPointer(ctx_.ranks[static_cast<size_t>(ctx_.me)].arena->base(), "the device arena");
  mine.nPremapped = static_cast<uint32_t>(ctx_.config.premappedBuffers.size());
  for (size_t i = 0; i < ctx_.config.premappedBuffers.size(); ++i)
    mine.premapped[i] = ctx_.link->exportPointer(ctx_.config.premappedBuffers[i],
                                                 "CommConfig::premappedBuffers[" + std::to_string(i) + "]");
  const std::vector<uint8_t> all = boot.allGather(&mine, sizeof mine);
  std::vector<ProcessInfo> info(static_cast<size_t>(n));
  std::memcpy(info.data(), all.data(), all.size());

  ctx_.workers = myWorkers;
  for (int q = 0; q < n; ++q) {
    const ProcessInfo& pi = info[static_cast<size_t>(q)];
    if (pi.ringSlots != ctx_.ringSlots)
      throw Error(ErrorCode::InvalidArgument,
                  "rank " + std::to_string(q) + " uses CommConfig::ringSlots " + std::to_string(pi.ringSlots) + ", " +
                      who + " " + std::to_string(ctx_.ringSlots) + " (every rank must use the same config)");
    ctx_.workers = std::min(ctx_.workers, pi.workers);                     // one worker count for every rank's lowering
    if (q == ctx_.me || !sameNode(q, ctx_.me)) continue;                   // other nodes are reached through the proxy
    if (std::memcmp(pi.uuid, mine.uuid, sizeof mine.uuid) == 0) continue;  // a rank sharing this GPU (shareGpus)
    int peerDev = -1;
    if (cudaDeviceGetByPCIBusId(&peerDev, pi.busId) == cudaSuccess) {  // visible here: check peer access
      int can = 0;
      MK_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, dev, peerDev));
      if (!can) throw Error(ErrorCode::Unsupported, peerAccessRefusal(dev, ctx_.me, peerDev, q));
    }
    cudaGetLastError();
  }
  const uint32_t perNode = ctx_.nodeSize(ctx_.nodeOf[static_cast<size_t>(ctx_.me)]);
  ctx_.topology = detectTopology(prop, perNode);
  ctx_.topology.nodes = ctx_.nodeCount();
  {
    // Each process sees its own GPU's links; the other nodes are taken to be alike (nodes of one kind).
    std::vector<std::string> peers;
    for (int q = 0; q < n; ++q)
      if (q != ctx_.me && sameNode(q, ctx_.me)) peers.emplace_back(info[static_cast<size_t>(q)].busId);
    refineTopology({probeNvlinks(mine.busId, peers)}, prop.major);
  }
  allocHostBlocks(static_cast<size_t>(n));
  MK_CUDA_CHECK(cudaSetDevice(dev));
  for (int q = 0; q < n; ++q)
    ctx_.peerStates.push_back(q == ctx_.me           ? ctx_.ranks[static_cast<size_t>(ctx_.me)].state
                              : sameNode(q, ctx_.me) ? static_cast<device::RankState*>(ctx_.link->importPointer(
                                                           q, info[static_cast<size_t>(q)].state))
                                                     : nullptr);  // another node: never addressed by this GPU
  // Mapped now, before the kernel starts (memcheck knows only mappings older than a running kernel); an op's
  // pointer inside them later finds the mapping cached.
  size_t premapped = 0;
  for (int q = 0; q < n; ++q) {
    if (q == ctx_.me || !sameNode(q, ctx_.me)) continue;
    const ProcessInfo& pi = info[static_cast<size_t>(q)];
    ctx_.link->importPointer(q, pi.arena);
    for (uint32_t i = 0; i < pi.nPremapped && i < CommConfig::kMaxPremapped; ++i, ++premapped)
      ctx_.link->importPointer(q, pi.premapped[i]);
  }
  // Several nodes: the transport and the proxy (collective over the bootstrap like the steps above).
  if (multiNode())
    interNode_ = std::make_unique<InterNode>(
        ctx_, [this] { return describeDeviceFailure(); }, boot);
  MK_LOG_AT(Info, who,
            "every peer's engine state and device arena mapped, " + std::to_string(premapped) +
                " premapped peer buffer(s); " + std::to_string(ctx_.workers) + " worker CTAs per GPU");
}

}  // namespace mk::runtime
