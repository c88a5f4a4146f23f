// mkernel — the built-in cluster presets, datasheet numbers only (sources: docs/transports.md, "Presets").
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/topology/topology.hpp"
#include "topology_internal.hpp"

namespace mk {

namespace {

// Hopper SXM figures shared by the DGX presets, the cloud nodes and the h200x2 node.
constexpr uint32_t kHopperSxmSms =
    132;  // H100/H200 SXM5: 132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper)
constexpr double kHopperBf16DenseTflops =
    989;  // H100/H200 SXM datasheet: 1979 TFLOP/s bf16 "with sparsity" / 2 = dense
constexpr double kHopperFp8DenseTflops =
    1979;  // H100/H200 SXM datasheet: 3958 TFLOP/s fp8 "with sparsity" / 2 = dense, twice the bf16 peak
constexpr double kH100HbmGBs = 3350;  // H100 SXM datasheet: 3.35 TB/s HBM3
constexpr double kH200HbmGBs = 4800;  // H200 SXM datasheet: 4.8 TB/s HBM3e
constexpr double kNvlink4PerDirGBs =
    450;  // NVLink 4: 18 links x 25 GB/s per direction = 900 GB/s bidirectional (datasheet)
constexpr double kNvlinkLatencyUs = 0.65;  // measured on the h200x2 pair: P2P flag round trip 1.25 us / 2
constexpr double kPcieGen5x16GBs = 64;     // PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b ~ 63-64 GB/s per direction
constexpr double kPcieLatencyUs =
    1.0;  // typical PCIe Gen5 round-trip-halved latency for a posted write + completion (order of 1 us)
constexpr uint32_t kDgxNics = 8;  // DGX H100/H200: 8 x ConnectX-7 for the compute fabric, one per GPU (DGX user guide)
constexpr double kCx7PerDirGBs = 50;  // ConnectX-7 NDR 400 Gb/s = 50 GB/s per direction (datasheet)
constexpr double kRdmaNicLatencyUs =
    2.5;  // RDMA WRITE one-way small-message latency through a ConnectX NIC, ~2-3 us incl. PCIe (not a datasheet
          // figure: the order of magnitude, used for every NIC of the presets; calibration replaces it)

// Ampere (DGX A100) figures.
constexpr uint32_t kA100Sms = 108;            // A100 SXM4: 108 SMs (NVIDIA A100 Tensor Core GPU Architecture)
constexpr double kA100Bf16DenseTflops = 312;  // A100 datasheet: bf16 tensor 312 TFLOP/s (624 with sparsity)
constexpr double kA100Fp8DenseTflops = 0;     // Ampere has no FP8 tensor cores (A100 datasheet: none listed)
constexpr double kA100HbmGBs = 2039;          // A100 80GB SXM datasheet: 2,039 GB/s HBM2e
constexpr double kNvlink3PerDirGBs = 300;     // NVLink 3: 600 GB/s bidirectional per GPU (A100 datasheet)
constexpr double kPcieGen4x16GBs = 31.5;      // PCIe Gen4 x16: 16 GT/s x 16 lanes x 128b/130b / 8
constexpr uint32_t kDgxA100Nics = 8;          // DGX A100: 8 x single-port ConnectX-6 HDR for compute (datasheet)
constexpr double kCx6HdrPerDirGBs = 25;       // ConnectX-6 HDR 200 Gb/s = 25 GB/s per direction

// Cloud nodes.
constexpr uint32_t kP5EfaNics = 32;      // AWS P5: up to 32 network cards, 3,200 Gbps in all (EC2 user guide, EFA)
constexpr double kEfa100GbpsGBs = 12.5;  // 3,200 Gbps / 32 cards = 100 Gb/s = 12.5 GB/s per direction each
constexpr uint32_t kA3MegaGpuNics = 8;   // GCP A3 Mega: 8 GPU NICs for GPUDirect-TCPXO (Compute Engine docs)
constexpr double kTcp200GbpsGBs = 25;    // 200 Gb/s per GPU NIC = 25 GB/s per direction

/// Eight GPUs on NVSwitch with `nics` uniform NICs: the shape every multi-node preset shares.
Topology eightGpuNode(const std::string& name, const std::string& gpu, uint32_t sms, double tflops, double fp8Tflops,
                      double hbm, double nvlinkGBs, double pcieGBs, uint32_t nics, NicSpec nic) {
  Topology t;
  t.name = name;
  t.node.gpu = gpu;
  t.node.gpus = 8;
  t.node.sms = sms;
  t.node.bf16Tflops = tflops;
  t.node.fp8Tflops = fp8Tflops;
  t.node.hbmGBs = hbm;
  t.node.nvlink = NvlinkSpec{nvlinkGBs, kNvlinkLatencyUs, true};  // NVSwitch chips: all-to-all at full bw
  t.node.pcie = PcieSpec{pcieGBs, kPcieLatencyUs};
  t.node.nics = nics;
  t.node.nic = std::move(nic);
  return t;  // fabric: the FabricSpec defaults (rail-leaf-spine, 32 nodes per leaf, non-blocking, 0.5 us per hop)
}

}  // namespace

std::vector<std::string> topologyPresets() {
  return {"h200x2", "dgx-h100", "dgx-h200", "a100-8x200", "cloud-efa-32x100", "cloud-tcp-8x200"};
}

namespace detail {

std::string presetList() {
  std::string out;
  for (const auto& p : topologyPresets()) out += (out.empty() ? "" : ", ") + p;
  return out;
}

Topology presetOneNode(const std::string& name) {
  if (name == "h200x2") {
    // h200x2, the machine our 2-GPU records come from: two H200 SXM joined by NV18 (nvidia-smi topo -m), no RDMA NIC.
    Topology t;
    t.name = name;
    t.node.gpu = "NVIDIA H200";
    t.node.gpus = 2;
    t.node.sms = kHopperSxmSms;
    t.node.bf16Tflops = kHopperBf16DenseTflops;
    t.node.fp8Tflops = kHopperFp8DenseTflops;
    t.node.hbmGBs = kH200HbmGBs;
    // NV18 direct: all 18 NVLink 4 links go to the one peer, so the per-direction total equals NVSwitch's.
    t.node.nvlink = NvlinkSpec{kNvlink4PerDirGBs, kNvlinkLatencyUs, false};
    t.node.pcie = PcieSpec{kPcieGen5x16GBs, kPcieLatencyUs};
    t.node.nics = 0;  // no RDMA NIC on that machine: single node only
    t.node.nic = NicSpec{};
    return t;
  }
  const NicSpec cx7{kCx7PerDirGBs, kRdmaNicLatencyUs, "ib", {}, {}};
  if (name == "dgx-h100")
    return eightGpuNode(name, "NVIDIA H100", kHopperSxmSms, kHopperBf16DenseTflops, kHopperFp8DenseTflops, kH100HbmGBs,
                        kNvlink4PerDirGBs, kPcieGen5x16GBs, kDgxNics, cx7);
  if (name == "dgx-h200")
    return eightGpuNode(name, "NVIDIA H200", kHopperSxmSms, kHopperBf16DenseTflops, kHopperFp8DenseTflops, kH200HbmGBs,
                        kNvlink4PerDirGBs, kPcieGen5x16GBs, kDgxNics, cx7);
  if (name == "a100-8x200")
    return eightGpuNode(name, "NVIDIA A100", kA100Sms, kA100Bf16DenseTflops, kA100Fp8DenseTflops, kA100HbmGBs,
                        kNvlink3PerDirGBs, kPcieGen4x16GBs, kDgxA100Nics,
                        NicSpec{kCx6HdrPerDirGBs, kRdmaNicLatencyUs, "ib", {}, {}});
  if (name == "cloud-efa-32x100")  // 32 NICs for 8 GPUs: the uniform form gives GPU g NICs 4g .. 4g+3
    return eightGpuNode(name, "NVIDIA H100", kHopperSxmSms, kHopperBf16DenseTflops, kHopperFp8DenseTflops, kH100HbmGBs,
                        kNvlink4PerDirGBs, kPcieGen5x16GBs, kP5EfaNics,
                        NicSpec{kEfa100GbpsGBs, kRdmaNicLatencyUs, "efa", {}, {}});
  if (name == "cloud-tcp-8x200")
    return eightGpuNode(name, "NVIDIA H100", kHopperSxmSms, kHopperBf16DenseTflops, kHopperFp8DenseTflops, kH100HbmGBs,
                        kNvlink4PerDirGBs, kPcieGen5x16GBs, kA3MegaGpuNics,
                        NicSpec{kTcp200GbpsGBs, kRdmaNicLatencyUs, "tcp", {}, {}});
  throw Error(ErrorCode::NotFound, "unknown topology preset '" + name + "' (known: " + presetList() + ")");
}

}  // namespace detail

}  // namespace mk
