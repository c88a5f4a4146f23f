// mkernel — internal: what creation establishes and every part of the engine reads (engine/engine.hpp maps the
// parts). The façade (Engine) owns it; each part gets a reference at construction and owns only its own state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/host_sync.hpp"
#include "engine/process_link.hpp"
#include "engine/resources.hpp"
#include "mk/communicator.hpp"
#include "mk/cost/cost.hpp"
#include "mk/device/engine_device.hpp"

namespace mk::runtime {

/// The engine's ranks, their resources and the host-mapped blocks they share, fixed once creation returned (the
/// ranks' resources grow scratch, staging and captures under `mu`).
struct EngineContext {
  CommConfig config;
  Topology topology;
  std::string topologySource;
  Profile profile;  ///< what "auto" costs against (CommConfig::profile, else defaultProfile(topology))
  std::string profileSource;
  uint32_t workers = 0;
  uint32_t ringSlots = 0;
  std::vector<RankResources> ranks;            ///< every rank; only local ones have resources (device >= 0)
  std::vector<int> local;                      ///< ranks driven by this process
  std::vector<uint32_t> nodeOf;                ///< rank -> node (dense ids in order of each node's first rank)
  int me = 0;                                  ///< multi-process: this process's rank
  std::unique_ptr<ProcessLink> link;           ///< multi-process only
  std::vector<device::RankState*> peerStates;  ///< every rank's RankState as this process's GPU(s) address it

  // Host-mapped blocks (pinned, portable, mapped; one allocation each).
  device::StatusBlock* status = nullptr;
  device::OpDescriptor* ring = nullptr;      ///< [ringSlots]: the op descriptors
  device::RankMailbox* mailboxes = nullptr;  ///< [nRanks]

  /// The engine's one mutex: every part's host state but InterNode's (which never takes it) is read and written
  /// under it (groupEnd's waits read the hand-off choice and a capture record without it). Taken before InterNode's
  /// locks and the capture registry's, never after (docs/gpu-engine.md, "The engine's parts").
  std::mutex mu;

  int size() const noexcept { return static_cast<int>(ranks.size()); }
  /// Ranks q and r share a node (NVLink and CUDA IPC reach; otherwise the proxy).
  bool sameNode(int q, int r) const { return nodeOf[static_cast<size_t>(q)] == nodeOf[static_cast<size_t>(r)]; }
  uint32_t nodeCount() const {
    uint32_t most = 0;
    for (const uint32_t v : nodeOf) most = std::max(most, v + 1);
    return most;
  }
  uint32_t nodeSize(uint32_t node) const {
    return static_cast<uint32_t>(std::count(nodeOf.begin(), nodeOf.end(), node));
  }
  /// Bit q set for every rank q on rank r's node.
  uint32_t localMask(int r) const {
    uint32_t mask = 0;
    for (size_t q = 0; q < nodeOf.size(); ++q)
      if (nodeOf[q] == nodeOf[static_cast<size_t>(r)]) mask |= 1u << q;
    return mask;
  }
  bool multiNode() const { return nodeCount() > 1; }
  /// Ops rank r's kernel has taken from the ring, and completed (its mailbox).
  uint32_t fetched(int r) const { return loadHost(&mailboxes[r].fetched); }
  uint32_t completed(int r) const { return loadHost(&mailboxes[r].completed); }
};

}  // namespace mk::runtime
