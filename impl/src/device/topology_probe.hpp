// mkernel — internal: what the machine says about the links between the communicator's GPUs (NVLink
// counts through NVML, loaded at run time like the driver: nothing is linked), and how that refines the
// Topology the "auto" choice costs against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/topology/topology.hpp"

namespace mk::runtime {

/// NVLinks of one GPU as NVML reports them.
struct NvlinkProbe {
  bool available = false;    ///< NVML answered for this GPU
  std::string why;           ///< why not, when !available
  uint32_t activeLinks = 0;  ///< links up
  /// Links up whose far end is each of the `peers` given to probeNvlinks (same order); links that end
  /// elsewhere (an NVSwitch) are activeLinks - sum(linksToPeer).
  std::vector<uint32_t> linksToPeer;
};

/// Probe GPU `busId` (a PCI bus id as cudaDeviceGetPCIBusId writes it) and count its links to `peers`.
/// Never throws: a machine without NVML gives available = false and the reason.
NvlinkProbe probeNvlinks(const std::string& busId, const std::vector<std::string>& peers);

/// NVLink bandwidth per link and direction for a GPU of compute capability `major` (GB/s; 0 = unknown).
double nvlinkGBsPerLink(int major);

/// Fill `t.node.nvlink` from probes of every GPU of the group (probes[i] of GPU i, linksToPeer over the
/// other GPUs): bandwidth = the fewest active links of any GPU x per-link rate; switched when some links
/// end outside the group. Leaves `t` unchanged when a probe is unavailable or the rate unknown. Returns a
/// one-line summary ("18 NVLinks per GPU, through a switch") or the reason nothing was changed.
std::string applyNvlinkProbes(Topology& t, const std::vector<NvlinkProbe>& probes, int major);

}  // namespace mk::runtime
