// mkernel — the closed forms' vocabulary (closed_form.hpp).
#include "closed_form.hpp"

#include <algorithm>
#include <sstream>

#include "common.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/util/size.hpp"

namespace mk::detail {

ClosedFormShape shapeOf(const CostContext& c) {
  ClosedFormShape s;
  s.p = c.gen.nRanks;
  s.nodes = c.gen.nNodes();
  s.gMax = c.gen.maxLocal;
  s.gMin = s.gMax;
  for (const auto& n : c.gen.nodeRanks) s.gMin = std::min(s.gMin, static_cast<uint32_t>(n.size()));
  s.evenNodes = s.gMin == s.gMax;
  s.part0 = splitRange(Range{0, c.spec.count}, effectiveChannels(c.gen), 0);
  return s;
}

double chunkCount(uint64_t size, uint32_t chunks) { return double(std::min<uint64_t>(size, chunks)); }

// ---- counted paths -------------------------------------------------------------------------------------------

PathCounts operator+(PathCounts a, const PathCounts& b) {
  a.nvA += b.nvA;
  a.nvB += b.nvB;
  a.netA += b.netA;
  a.netB += b.netB;
  a.redA += b.redA;
  a.redB += b.redB;
  a.copyA += b.copyA;
  a.copyB += b.copyB;
  a.flag += b.flag;
  a.netL += b.netL;
  return a;
}
PathCounts operator*(double k, PathCounts a) {
  a.nvA *= k;
  a.nvB *= k;
  a.netA *= k;
  a.netB *= k;
  a.redA *= k;
  a.redB *= k;
  a.copyA *= k;
  a.copyB *= k;
  a.flag *= k;
  a.netL *= k;
  return a;
}
PathCounts nvMsg() {
  PathCounts c;
  c.nvA = c.nvB = 1;
  return c;
}
PathCounts netMsg() {
  PathCounts c;
  c.netA = c.netB = 1;
  return c;
}
PathCounts redMsg() {
  PathCounts c;
  c.redA = c.redB = 1;
  return c;
}
PathCounts copyMsg() {
  PathCounts c;
  c.copyA = c.copyB = 1;
  return c;
}
PathCounts netLands() {
  PathCounts c;
  c.netL = 1;
  return c;
}
PathCounts flagHop() {
  PathCounts c;
  c.flag = 1;
  return c;
}
/// An NVLink message of `units` units in `pieces` steps.
PathCounts nvGroup(double pieces, double units) {
  PathCounts c;
  c.nvA = pieces;
  c.nvB = units;
  return c;
}
/// Local reductions of `units` units in `pieces` steps.
PathCounts redGroup(double pieces, double units) {
  PathCounts c;
  c.redA = pieces;
  c.redB = units;
  return c;
}

PathCounts netGroup(double pieces, double units) {
  PathCounts c;
  c.netA = pieces;
  c.netB = units;
  return c;
}

double networkShare(const CostContext& c, bool ringEdges) {
  const GenContext& g = c.gen;
  if (g.nNodes() < 2) return 1.0;
  std::vector<bool> sends(g.nRanks, true);
  if (ringEdges && g.railRings) {
    // Channel c leaves node k by its local GPU (c - k - 1) mod G (ringOrder).
    const uint32_t G = g.maxLocal, channels = effectiveChannels(g);
    std::fill(sends.begin(), sends.end(), false);
    for (uint32_t k = 0; k < g.nNodes(); ++k)
      for (uint32_t ch = 0; ch < std::min(channels, G); ++ch) sends[k * G + (ch + 2 * G - k % G - 1) % G] = true;
  } else if (ringEdges) {
    for (uint32_t r = 0; r < g.nRanks; ++r) sends[r] = !g.sameNode(r, (r + 1) % g.nRanks);
  }
  const std::vector<double> shares = rankNetworkShares(c.topo, g.nodeOf, sends);
  double least = 1.0;
  for (uint32_t r = 0; r < g.nRanks; ++r)
    if (sends[r]) least = std::min(least, shares[r]);
  return least;
}

double networkMessageUs(const CostContext& c, double messageBytes, double share, bool ringEdges) {
  const Profile& pf = c.profile;
  const double wire = messageBytes / transportEfficiency(pf.transport, messageBytes);
  return wire * share / (linkRate(pf.network, wire) * networkShare(c, ringEdges) * 1e3);
}

UnitPrices unitPrices(const CostContext& c, uint64_t elems, bool needsNet, bool ringEdges) {
  const Profile& pf = c.profile;
  requirePositive("profile.nvlink.bwGBs", pf.nvlink.bwGBs, "this closed form");
  requirePositive("profile.local.bwGBs", pf.local.bwGBs, "this closed form");
  requirePositive("profile.reduceGBs", pf.reduceGBs, "this closed form");
  if (needsNet) requirePositive("profile.network.bwGBs", pf.network.bwGBs, "this closed form");
  UnitPrices u;
  u.share = effectiveChannels(c.gen);
  u.bytes = double(elems) * double(dtypeSize(c.spec.dtype));
  const double b = u.bytes * u.share / 1e3;  // bytes / (GB/s * 1e3 / share) = b / GB/s
  u.nvLat = pf.nvlink.alphaUs;
  // NCCL's rail rings (ringOrder) split a rank's channels between its NVLink and its network lanes.
  const double nvShare = ringEdges ? ringNvlinkLanes(c.gen, u.share) : u.share;
  u.nvBw = u.bytes * nvShare / 1e3 / linkRate(pf.nvlink, u.bytes);
  u.netBw =
      needsNet ? networkMessageUs(c, u.bytes, ringEdges ? ringNetworkLanes(c.gen, u.share) : u.share, ringEdges) : 0;
  // The unit message's lane time and landing under the ProxyPut rule (step_cost.hpp, proxyLaneUs): the issue
  // (plus any wait for an in-flight slot) per message, the latency only where another lane waits for it.
  const double busy = proxyIssueUs(pf) + u.netBw;
  u.netLat = proxyLaneUs(pf, busy) - u.netBw;
  u.netLand = proxyLandsAfterUs(pf, busy);
  u.redLat = pf.local.alphaUs;
  u.redBw = b / reduceRate(pf, u.bytes);
  u.copyLat = pf.local.alphaUs;
  u.copyBw = b / linkRate(pf.local, u.bytes);
  u.flag = pf.localFlagUs;  // every F of these formulas is a reducer lane signalling a lane of its own GPU
  u.dispatch = pf.dispatchUs;
  return u;
}

CostEstimate estimate(const UnitPrices& u, const PathCounts& path, const std::string& symbolic) {
  CostEstimate e;
  e.latencyUs = u.dispatch + path.nvA * u.nvLat + path.netA * u.netLat + path.redA * u.redLat + path.copyA * u.copyLat +
                path.flag * u.flag + path.netL * u.netLand;
  e.bandwidthUs = path.nvB * u.nvBw + path.netB * u.netBw + path.copyB * u.copyBw;
  e.reduceUs = path.redB * u.redBw;
  e.totalUs = u.dispatch + path.value(u);
  std::ostringstream f;
  f << symbolic << "; critical path = D";
  bool split = false;
  auto term = [&](double a, double bytes, const char* name) {
    if (a == bytes) {
      if (a != 0) f << " + " << formatNumber(a) << "*t_" << name;
      return;
    }
    split = true;
    if (a != 0) f << " + " << formatNumber(a) << "*a_" << name;
    if (bytes != 0) f << " + " << formatNumber(bytes) << "*b_" << name;
  };
  term(path.nvA, path.nvB, "nv");
  term(path.netA, path.netB, "net");
  term(path.redA, path.redB, "red");
  term(path.copyA, path.copyB, "copy");
  if (path.flag != 0) f << " + " << formatNumber(path.flag) << "*F";
  f << " = " << formatNumber(e.totalUs) << " us with piece " << formatNumber(u.bytes) << " B, C "
    << formatNumber(u.share) << ", D " << formatNumber(u.dispatch) << ", t_nv " << formatNumber(u.nv()) << ", t_net "
    << formatNumber(u.net()) << ", t_red " << formatNumber(u.red()) << ", t_copy " << formatNumber(u.copy()) << ", F "
    << formatNumber(u.flag) << " us";
  if (split) f << " (a_x: the alpha of t_x, b_x: its bytes term)";
  e.formula = f.str();
  return e;
}

CostEstimate costLocalCopy(const CostContext& c, const ClosedFormShape& s) {
  const UnitPrices u = unitPrices(c, s.part0.size, false);
  return estimate(u, copyMsg(), "p = 1: D + t_copy(n/C)");
}

// ---- priced paths --------------------------------------------------------------------------------------------

Term maxOf(std::initializer_list<Term> terms) {
  Term best = *terms.begin();
  for (const Term& t : terms)
    if (t.total() > best.total()) best = t;
  return best;
}

ChunkPrices::ChunkPrices(const CostContext& ctx) : c(ctx) {
  const Profile& pr = ctx.profile;
  const uint64_t count = ctx.spec.count;
  const uint64_t ch = std::min<uint64_t>(ctx.opt.channels, count);
  const uint64_t part = (count + ch - 1) / ch;
  const uint64_t k = std::min<uint64_t>(ctx.opt.chunks, part);
  const uint64_t chunk = (part + k - 1) / k;
  const auto esize = static_cast<double>(dtypeSize(ctx.spec.dtype));
  channels = static_cast<double>(ch);
  chunks = static_cast<double>(k);
  partBytes = static_cast<double>(part) * esize;
  chunkBytes = static_cast<double>(chunk) * esize;
  t0 = Term{pr.dispatchUs, 0, 0};
  nvl = Term{pr.nvlink.alphaUs, chunkBytes * channels / (linkRate(pr.nvlink, chunkBytes) * 1e3), 0};
  // The rings' hops under NCCL's rail orders (ringOrder): a rank's channels split between NVLink and network.
  nvlRing = Term{pr.nvlink.alphaUs,
                 chunkBytes * ringNvlinkLanes(ctx.gen, channels) / (linkRate(pr.nvlink, chunkBytes) * 1e3), 0};
  double netBw = 0, netRingBw = 0;
  if (ctx.gen.nNodes() > 1) {
    netBw = networkMessageUs(ctx, chunkBytes, channels, false);
    netRingBw = networkMessageUs(ctx, chunkBytes, ringNetworkLanes(ctx.gen, channels), true);
  } else {  // no network on the path: keep the plain price (a formula may still print it)
    netBw = netRingBw = chunkBytes * channels / (linkRate(pr.network, chunkBytes) * 1e3);
  }
  // The ProxyPut rule (step_cost.hpp, proxyLaneUs): a chunk's lane time, and its landing after that.
  const double issue = proxyIssueUs(pr);
  net = Term{proxyLaneUs(pr, issue + netBw) - netBw, netBw, 0};
  netRing = Term{proxyLaneUs(pr, issue + netRingBw) - netRingBw, netRingBw, 0};
  netLand = Term{proxyLandsAfterUs(pr, issue + netBw), 0, 0};
  copy = Term{pr.local.alphaUs, partBytes * channels / (linkRate(pr.local, partBytes) * 1e3), 0};
  reduce = Term{pr.local.alphaUs, 0, chunkBytes * channels / (reduceRate(pr, chunkBytes) * 1e3)};
}

std::string ChunkPrices::symbols() const {
  const GenContext& g = c.gen;
  std::ostringstream os;
  os << "p=" << g.nRanks << " M=" << g.nNodes() << " G=" << g.maxLocal << " n=" << formatNumber(partBytes * channels, 4)
     << "B C=" << formatNumber(channels, 4) << " K=" << formatNumber(chunks, 4) << " nc=" << formatNumber(chunkBytes, 4)
     << "B; T_nvl=" << formatNumber(nvl.total(), 4) << " T_net=" << formatNumber(net.total(), 4)
     << " T_copy=" << formatNumber(copy.total(), 4) << " R=" << formatNumber(reduce.total(), 4)
     << " t0=" << formatNumber(t0.total(), 4);
  return os.str();
}

CostEstimate ChunkPrices::finish(const Term& critical, const std::string& formula) const {
  CostEstimate e;
  const Term all = t0 + critical;
  e.latencyUs = all.lat;
  e.bandwidthUs = all.bw;
  e.reduceUs = all.red;
  e.totalUs = all.total();
  e.formula = formula + "  [" + symbols() + "] = " + formatNumber(e.totalUs, 4) + " us";
  return e;
}

RingReps ringRepresentatives(const GenContext& g) {
  const uint32_t p = g.nRanks, G = g.maxLocal;
  bool periodic = p % G == 0;
  for (uint32_t r = 0; r < p && periodic; ++r) periodic = g.nodeSize(g.nodeOf[r]) == G && g.localIndex[r] == r % G;
  if (periodic) return RingReps{G, false};
  if (p <= kExactRingRanks) return RingReps{p, false};
  return RingReps{1, true};
}

bool RingReps::crosses(const GenContext& g, uint32_t i) const {
  if (!bound) return !g.sameNode(i, (i + 1) % g.nRanks);
  for (uint32_t r = 0; r < g.nRanks; ++r)
    if (!g.sameNode(r, (r + 1) % g.nRanks)) return true;
  return false;
}

bool RingReps::stays(const GenContext& g, uint32_t i) const {
  if (!bound) return g.sameNode(i, (i + 1) % g.nRanks);
  for (uint32_t r = 0; r < g.nRanks; ++r)
    if (g.sameNode(r, (r + 1) % g.nRanks)) return true;
  return false;
}

Term ringFlowLine(const ChunkPrices& x, bool reduces) {
  const GenContext& g = x.c.gen;
  const RingReps reps = ringRepresentatives(g);
  const uint32_t p = g.nRanks, Q = reps.count;
  const auto K = static_cast<uint32_t>(x.chunks);
  std::vector<Term> hop(Q), land(Q), lane(Q);
  for (uint32_t i = 0; i < Q; ++i) {
    const bool far = reps.crosses(g, i), near = reps.stays(g, i);
    hop[i] = far && near ? maxOf({x.nvlRing, x.netRing}) : far ? x.netRing : x.nvlRing;
    land[i] = far ? x.netLand : Term{};
  }
  auto pred = [&](uint32_t i) { return (i + Q - 1) % Q; };
  std::vector<std::vector<Term>> arrived(Q, std::vector<Term>(K)), next = arrived;
  for (uint32_t s = 0; s + 1 < p; ++s) {
    for (uint32_t c = 0; c < K; ++c)
      for (uint32_t i = 0; i < Q; ++i) {
        lane[i] = s ? maxOf({lane[i], arrived[pred(i)][c]}) + (reduces ? x.reduce : Term{}) + hop[i] : lane[i] + hop[i];
        next[i][c] = lane[i] + land[i];
      }
    std::swap(arrived, next);
  }
  Term end;
  for (uint32_t i = 0; i < Q; ++i) {
    for (uint32_t c = 0; c < K; ++c)  // the last step's arrivals: waited for (all-gather) or reduced into output
      lane[i] = reduces ? maxOf({lane[i], arrived[pred(i)][c]}) + x.reduce : maxOf({lane[i], arrived[pred(i)][c]});
    end = maxOf({end, lane[i]});
  }
  return end;
}

}  // namespace mk::detail
