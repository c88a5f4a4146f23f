// mkernel — NCCL's tuning model (mk/algorithms/nccl_topo.hpp), read from src/graph/tuning.cc of NCCL 2.30.7:
// ncclTopoTuneModel (bandwidths and latencies per collective, algorithm and protocol) and ncclTopoGetAlgoTime.
// Only the ring and the tree; the constants are ncclTunerConstantsDefaults'. The host is taken as x86 Intel
// (llMaxBws row, getNetOverhead 1 us).
#include <cmath>
#include <string>

#include "mk/algorithms/nccl_topo.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

// Index order of NCCL's tables: protocols LL, LL128, Simple; algorithms Tree, Ring.
constexpr int kTree = 0, kRing = 1;
constexpr double kBaseLat[2][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};
constexpr double kHwLatNvlink[2][3] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
constexpr double kHwLatNet[2][3] = {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}};
// [compCapIndex (multi-node: the CPU row, 0 = Intel)][nNodes 1, 2, more]
constexpr double kLlMaxBws[4][3] = {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}};
constexpr double kPerChMaxRingLl128Bws[4][3] = {
    {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}, {40.0, 40.0, 40.0}};
constexpr double kPerChMaxTreeLl128Bws[4][3] = {
    {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};
constexpr double kPerChMaxTreeBws[4][3] = {
    {26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}};
// Powers of two of bytes / 64 (ncclTopoGetAlgoTime: the tree's bandwidth at medium sizes).
constexpr double kTreeCorrection[3][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};
constexpr double kNetOverheadUs = 1.0;  // getNetOverhead, x86 Intel

int protoIndex(Protocol p) { return p == Protocol::LL ? 0 : p == Protocol::LL128 ? 1 : 2; }

int log2i(uint64_t n) {
  int l = -1;
  while (n) {
    n >>= 1;
    ++l;
  }
  return l;
}

}  // namespace

double ncclAlgoTimeUs(const NcclGraph& g, CollOp op, Algorithm algo, Protocol proto, uint64_t bytes, uint32_t nRanks,
                      double netLatencyUs) {
  const bool ring = algo == Algorithm::NcclRing;
  if (!ring && !(algo == Algorithm::NcclTree && op == CollOp::AllReduce)) return -1;
  if (op != CollOp::AllReduce && op != CollOp::AllGather && op != CollOp::ReduceScatter && op != CollOp::Broadcast)
    return -1;
  if (nRanks <= 1) return 0;
  const int a = ring ? kRing : kTree, p = protoIndex(proto);
  const uint32_t nNodes = g.nNodes, cc = g.compCapIndex;
  const int index2 = nNodes <= 2 ? static_cast<int>(nNodes) - 1 : 2;
  const double llMaxBw = kLlMaxBws[nNodes == 1 ? cc : 0][index2];
  const double nsteps = op == CollOp::AllReduce ? 2.0 * (nRanks - 1) : op == CollOp::Broadcast ? nRanks : nRanks - 1;
  const double ch = g.rings;
  double busBw = ch * (nNodes <= 2 ? g.bwIntraGBs : g.bwInterGBs);
  if (ring && proto == Protocol::LL) busBw = std::min(llMaxBw, busBw * .5);
  if (ring && proto == Protocol::LL128) busBw = std::min(busBw * .92, ch * kPerChMaxRingLl128Bws[cc][index2]);
  if (!ring) busBw = std::min(busBw * .92, ch * kPerChMaxTreeBws[cc][index2]);
  if (!ring && proto == Protocol::LL) busBw = std::min(busBw / 3.8, llMaxBw);
  if (!ring && proto == Protocol::LL128)
    busBw = std::min(busBw * (nNodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0), ch * kPerChMaxTreeLl128Bws[cc][index2]);
  double bw = busBw * (ring ? nRanks / nsteps : .5);

  const double ppn = static_cast<double>(nRanks) / nNodes;
  double lat = kBaseLat[a][p];
  double intraLat = kHwLatNvlink[a][p];
  double interLat = (ppn == 1 ? kHwLatNet[kTree][p] : kHwLatNet[a][p]) + netLatencyUs;
  if (proto == Protocol::Simple) interLat += netLatencyUs;  // the flush
  if (ring) {
    if (op == CollOp::Broadcast) {
      lat += nsteps * (proto == Protocol::Simple ? kHwLatNvlink[kTree][p] : kHwLatNvlink[a][p]);
    } else {
      const double overhead = nNodes > 1 ? kNetOverheadUs * (proto == Protocol::Simple ? 3 : 1) : 0;
      intraLat = std::max(intraLat, overhead);
      const double inter = nNodes == 1 ? 0 : op == CollOp::AllReduce ? 2.0 * (nNodes - 1) : nNodes - 1.0;
      lat += (nsteps - inter) * intraLat + inter * interLat;
    }
  } else {
    lat += 2 * ((nRanks / nNodes - 1) * intraLat + log2i(nNodes) * interLat);
  }
  const int logSize = log2i(bytes >> 6);
  if (!ring && logSize >= 0 && logSize < 23) bw *= kTreeCorrection[p][logSize];
  if (ring && proto == Protocol::Simple && nNodes > 1 && op == CollOp::AllReduce &&
      bytes / (static_cast<uint64_t>(g.channels) * nRanks) >= 64)
    lat *= cc < 2 ? 1.9 : 1.4;  // "plateau effect of ring"
  return lat + static_cast<double>(bytes) / (1000 * bw);
}

NcclTuning ncclTune(const NcclGraph& g, CollOp op, uint64_t bytes, uint32_t nRanks, double netLatencyUs) {
  if (op != CollOp::AllReduce && op != CollOp::AllGather && op != CollOp::ReduceScatter && op != CollOp::Broadcast)
    throw Error(ErrorCode::NotFound, std::string("NCCL's tuning model has no ring or tree for ") + toString(op) +
                                         " (NCCL runs it on its p2p channels)");
  NcclTuning best;
  bool found = false;
  for (Algorithm a : {Algorithm::NcclRing, Algorithm::NcclTree})
    for (Protocol p : {Protocol::LL, Protocol::LL128, Protocol::Simple}) {
      const double t = ncclAlgoTimeUs(g, op, a, p, bytes, nRanks, netLatencyUs);
      if (t < 0 || (found && t >= best.timeUs)) continue;
      found = true;
      best.algo = a;
      best.proto = p;
      best.timeUs = t;
    }
  best.channels = ncclOpChannels(g, best.proto, bytes, nRanks);
  return best;
}

}  // namespace mk
