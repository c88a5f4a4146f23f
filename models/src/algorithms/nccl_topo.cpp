// mkernel — NCCL's ring graph and its channel count per op (mk/algorithms/nccl_topo.hpp), read from NCCL 2.30.7.
#include <algorithm>
#include <string>

#include "mk/algorithms/nccl_topo.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

// search.cc: the bandwidths per channel the search tries, fastest first (sm90SpeedArrayInter / Intra for
// compute capability >= 9.0, speedArrayInter / Intra below it).
constexpr double kSm90SpeedsInter[] = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                                       15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};
constexpr double kSpeedsInter[] = {48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                                   7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
constexpr double kSm90SpeedsIntra[] = {60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0};
constexpr double kSpeedsIntra[] = {40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0};
constexpr uint32_t kNcclMaxChannels = 64;        // device.h MAXCHANNELS
constexpr uint32_t kSearchMaxChannels = 32;      // init.cc: the ring search's maxChannels (MAXCHANNELS / 2)
constexpr uint32_t kLlThreads = 512;             // device.h NCCL_LL_MAX_NTHREADS
constexpr uint32_t kLl128Threads = 640;          // device.h NCCL_LL128_MAX_NTHREADS
constexpr uint32_t kSimpleThreads = 512;         // device.h NCCL_SIMPLE_MAX_NTHREADS
constexpr uint64_t kLlThreadThreshold = 8;       // comm.h NCCL_LL_THREAD_THRESHOLD (x nRanks for the ring)
constexpr uint64_t kLl128ThreadThreshold = 8;    // comm.h NCCL_LL128_THREAD_THRESHOLD
constexpr uint64_t kSimpleThreadThreshold = 64;  // comm.h NCCL_SIMPLE_THREAD_THRESHOLD

/// The tuning tables' row of the node's GPU (NCCL reads the compute capability; the topology names the GPU).
uint32_t compCapIndexOf(const std::string& gpu) {
  auto has = [&](const char* s) { return gpu.find(s) != std::string::npos; };
  if (has("B200") || has("B300") || has("GB2") || has("GB3")) return 3;
  if (has("A100") || has("A800") || has("A10") || has("A30")) return 1;
  if (has("V100")) return 0;
  return 2;  // Hopper (H100, H200, H800, H20, GH200) and GPUs the table does not name
}

/// The fastest speed of `speeds` that is at most `limit` (the last one when none is).
template <std::size_t N>
double fastestWithin(const double (&speeds)[N], double limit) {
  for (double s : speeds)
    if (s <= limit) return s;
  return speeds[N - 1];
}

}  // namespace

NcclGraph ncclTopoGraph(const NodeSpec& node, uint32_t nNodes) {
  if (nNodes == 0) throw Error(ErrorCode::InvalidArgument, "ncclTopoGraph: nNodes must be > 0 (got 0)");
  if (node.gpus == 0) throw Error(ErrorCode::InvalidArgument, "ncclTopoGraph: node.gpus must be > 0 (got 0)");
  NcclGraph g;
  g.nNodes = nNodes;
  g.compCapIndex = compCapIndexOf(node.gpu);
  const bool sm90 = g.compCapIndex >= 2;
  if (nNodes == 1) {
    // Inside one node on NVSwitch every GPU pair runs at the NVLink rate: one ring per GPU at the fastest speed
    // NVLink carries (an approximation of the intra-node search; the model's single-node channels stay the
    // engine's rule).
    g.bwIntraGBs = g.bwInterGBs =
        sm90 ? fastestWithin(kSm90SpeedsIntra, node.nvlink.bwGBs) : fastestWithin(kSpeedsIntra, node.nvlink.bwGBs);
    g.rings = std::min(node.gpus, kSearchMaxChannels);
    g.railRings = 1;
    g.channels = std::min(kNcclMaxChannels, 2 * g.rings);
    return g;
  }
  // Across nodes: a ring enters and leaves each node on one NIC (same rail, crossNic 0), one ring per NIC; the
  // search starts at the fastest speed a NIC carries and stops once every NIC holds a ring.
  const auto nics = nicsOf(node);
  double nicGBs = nics.empty() ? node.pcie.bwGBs : nics.front().bwGBs;
  for (const auto& n : nics) nicGBs = std::min(nicGBs, n.bwGBs);
  const uint32_t nicCount = std::max<uint32_t>(1, static_cast<uint32_t>(nics.size()));
  double bw = sm90 ? fastestWithin(kSm90SpeedsInter, nicGBs) : fastestWithin(kSpeedsInter, nicGBs);
  uint32_t rings = std::min(nicCount, kSearchMaxChannels);
  const uint32_t searched = rings;
  // ncclTopoDupChannels: each ring twice at half the bandwidth, unless the speed is low (< 25) or, on
  // compute capability > 8.0, below 50 with more than 4 rings.
  const bool dup = bw >= 25.0 && !(sm90 && bw < 50.0 && rings > 4);
  if (dup) {
    const uint32_t twice = std::min(2 * rings, kSearchMaxChannels);
    bw /= static_cast<double>((twice + rings - 1) / rings);
    rings = twice;
  }
  g.rings = rings;
  g.bwIntraGBs = g.bwInterGBs = bw;
  g.railRings = std::min(searched, node.gpus);
  // connect.cc (ncclTopoPostset): the channels doubled; on sm90 with a fast ring and under 16 channels, doubled
  // once more ("4 compute channels per search channel").
  g.channels = std::min(kNcclMaxChannels, 2 * rings);
  if (sm90 && bw > 45.0 && g.channels < 16) g.channels = std::min(kNcclMaxChannels, 2 * g.channels);
  return g;
}

uint32_t ncclOpChannels(const NcclGraph& g, Protocol proto, uint64_t bytes, uint32_t nRanks) noexcept {
  const uint64_t threads = proto == Protocol::LL      ? kLlThreads
                           : proto == Protocol::LL128 ? kLl128Threads
                                                      : kSimpleThreads;
  const uint64_t threshold = proto == Protocol::LL      ? kLlThreadThreshold * nRanks
                             : proto == Protocol::LL128 ? kLl128ThreadThreshold
                                                        : kSimpleThreadThreshold;
  uint32_t nc = std::max<uint32_t>(g.channels, 1);
  while (nc >= 2 && bytes < nc * threads * threshold) --nc;
  return nc;
}

}  // namespace mk
