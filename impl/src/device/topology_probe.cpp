// mkernel — NVLink discovery through NVML loaded at run time (topology_probe.hpp).
#include "device/topology_probe.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

namespace mk::runtime {
namespace {

// The few NVML declarations used (ABI of nvml.h; the header is not needed to build).
using NvmlReturn = int;  // nvmlReturn_t: 0 = NVML_SUCCESS
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
struct NvmlPciInfo {                    // nvmlPciInfo_t
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

struct Nvml {
  bool ok = false;
  std::string why;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*byBusId)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*linkState)(NvmlDevice, unsigned, int*) = nullptr;
  NvmlReturn (*remotePci)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
};

template <class Fn>
bool sym(void* lib, const char* name, Fn& out, std::string& why) {
  void* p = dlsym(lib, name);
  if (!p) {
    why = std::string("NVML lacks ") + name;
    return false;
  }
  out = reinterpret_cast<Fn>(p);
  return true;
}

/// Loaded once per process and kept (nvmlShutdown is never needed: the driver cleans up at exit).
const Nvml& nvml() {
  static const Nvml api = [] {
    Nvml a;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      a.why = "libnvidia-ml.so.1 cannot be loaded";
      return a;
    }
    if (!sym(lib, "nvmlInit_v2", a.init, a.why) || !sym(lib, "nvmlDeviceGetHandleByPciBusId_v2", a.byBusId, a.why) ||
        !sym(lib, "nvmlDeviceGetNvLinkState", a.linkState, a.why) ||
        !sym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", a.remotePci, a.why))
      return a;
    const NvmlReturn r = a.init();
    if (r != kNvmlSuccess) {
      a.why = "nvmlInit failed (code " + std::to_string(r) + ")";
      return a;
    }
    a.ok = true;
    return a;
  }();
  return api;
}

/// (domain, bus, device) of a bus id "dddd:bb:dd.f" (hex); false when it does not parse.
bool parseBusId(const std::string& s, unsigned* domain, unsigned* bus, unsigned* dev) {
  unsigned fn = 0;
  return std::sscanf(s.c_str(), "%x:%x:%x.%x", domain, bus, dev, &fn) == 4;
}

}  // namespace

NvlinkProbe probeNvlinks(const std::string& busId, const std::vector<std::string>& peers) {
  NvlinkProbe p;
  p.linksToPeer.assign(peers.size(), 0);
  const Nvml& api = nvml();
  if (!api.ok) {
    p.why = api.why;
    return p;
  }
  NvmlDevice dev = nullptr;
  const NvmlReturn r = api.byBusId(busId.c_str(), &dev);
  if (r != kNvmlSuccess) {
    p.why = "NVML does not know GPU " + busId + " (code " + std::to_string(r) + ")";
    return p;
  }
  std::vector<unsigned> pd(peers.size()), pb(peers.size()), pv(peers.size());
  for (size_t i = 0; i < peers.size(); ++i)
    if (!parseBusId(peers[i], &pd[i], &pb[i], &pv[i])) pd[i] = pb[i] = pv[i] = ~0u;
  for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
    int active = 0;
    if (api.linkState(dev, link, &active) != kNvmlSuccess || active == 0) continue;
    ++p.activeLinks;
    NvmlPciInfo far{};
    if (api.remotePci(dev, link, &far) != kNvmlSuccess) continue;
    for (size_t i = 0; i < peers.size(); ++i)
      if (far.domain == pd[i] && far.bus == pb[i] && far.device == pv[i]) ++p.linksToPeer[i];
  }
  p.available = true;
  return p;
}

double nvlinkGBsPerLink(int major) {
  // Per link and direction: NVLink 3 (A100) and 4 (H100 / H200) 25 GB/s, NVLink 5 (B200) 50 GB/s.
  if (major == 8 || major == 9) return 25;
  if (major == 10) return 50;
  return 0;
}

std::string applyNvlinkProbes(Topology& t, const std::vector<NvlinkProbe>& probes, int major) {
  if (probes.empty()) return "no GPUs probed";
  uint32_t fewest = ~0u;
  bool switched = false;
  for (size_t i = 0; i < probes.size(); ++i) {
    const NvlinkProbe& p = probes[i];
    if (!p.available) return "NVLink count unknown (" + p.why + ")";
    uint32_t toPeers = 0;
    for (uint32_t l : p.linksToPeer) toPeers += l;
    switched = switched || p.activeLinks > toPeers;
    fewest = std::min(fewest, p.activeLinks);
  }
  const double perLink = nvlinkGBsPerLink(major);
  if (fewest == 0) return "no active NVLink (peer traffic goes over PCIe)";
  if (perLink <= 0)
    return std::to_string(fewest) + " NVLinks per GPU of an unknown generation (sm " + std::to_string(major) + "x)";
  t.node.nvlink.bwGBs = fewest * perLink;
  t.node.nvlink.switched = switched;
  return std::to_string(fewest) + " NVLinks per GPU" + (switched ? ", through a switch" : ", direct");
}

}  // namespace mk::runtime
