// mkernel — the fused family's shared toolkit (fused_common.hpp).
#include "fused_common.hpp"

#include <algorithm>

#include "mk/error.hpp"
#include "mk/util/size.hpp"

namespace mk::detail {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::InvalidArgument, what); }

/// Lane::ctas of the communication lanes of one rank: network lanes one each, the others the rest of
/// `commCtas` in proportion to their weights, at least one each, largest remainder first (earlier lanes on
/// ties).
std::vector<uint32_t> splitComm(const std::vector<std::pair<FusedLane, uint32_t>>& comm, uint32_t commCtas) {
  std::vector<uint32_t> ctas(comm.size(), 1);
  uint32_t spare = commCtas - static_cast<uint32_t>(comm.size());
  double total = 0;
  std::vector<std::size_t> data;
  for (std::size_t i = 0; i < comm.size(); ++i) {
    const bool network = comm[i].first == FusedLane::SendNetwork;
    if (network) continue;
    data.push_back(i);
    total += comm[i].second;
  }
  if (data.empty() || total <= 0) return ctas;
  std::vector<std::pair<double, std::size_t>> remainders;
  uint32_t used = 0;
  for (std::size_t i : data) {
    const double exact = spare * comm[i].second / total;
    const auto whole = static_cast<uint32_t>(exact);
    ctas[i] += whole;
    used += whole;
    remainders.emplace_back(exact - whole, i);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  for (std::size_t j = 0; used < spare; ++j, ++used) ++ctas[remainders[j % remainders.size()].second];
  return ctas;
}

std::string laneList(const std::vector<std::pair<FusedLane, uint32_t>>& comm) {
  std::string s;
  for (const auto& [purpose, weight] : comm) s += (s.empty() ? "" : ", ") + std::string(describe(purpose));
  return s;
}

}  // namespace

const char* describe(FusedLane purpose) noexcept {
  switch (purpose) {
    case FusedLane::Compute: return "compute";
    case FusedLane::SendNvlink: return "send over NVLink";
    case FusedLane::SendNetwork: return "send over the network";
    case FusedLane::Reduce: return "reduce";
  }
  return "?";
}

// ---- the context ----------------------------------------------------------------------------------------------

GenContext placementOf(const std::vector<uint32_t>& nodeOf) {
  // The collectives' placement facts; the collective spec only carries them (its count 1 is never used).
  CollectiveSpec placement;
  placement.count = 1;
  return makeContext(placement, nodeOf, GenOptions{});
}

std::vector<std::pair<FusedLane, uint32_t>> commLanesOf(FusedOp op, const GenContext& g, uint32_t r) {
  const uint32_t near = g.nodeSize(g.nodeOf[r]) - 1;
  if (g.nRanks == 1) return {};
  return fusedDef(op).commLanes(near, g.nRanks - 1 - near);
}

uint32_t mostCommLanes(FusedOp op, const GenContext& placement) {
  std::size_t most = 0;
  for (uint32_t r = 0; r < placement.nRanks; ++r) most = std::max(most, commLanesOf(op, placement, r).size());
  return static_cast<uint32_t>(most);
}

FusedContext makeFusedContext(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt) {
  if (nodeOf.empty()) bad("a schedule needs at least 1 rank (nodeOf is empty)");
  FusedContext ctx;
  ctx.spec = spec;
  ctx.opt = opt;
  ctx.p = static_cast<uint32_t>(nodeOf.size());
  ctx.shards = fusedShards(spec, ctx.p);
  if (opt.tileRows == 0) bad("tileRows must be >= 1 (got 0; planFused chooses a default)");
  if (opt.order != TileOrder::OwnFirst && opt.order != TileOrder::OwnLast && opt.order != TileOrder::Interleaved)
    bad(std::string("order must be own-first, own-last or interleaved (got ") + toString(opt.order) +
        "; planFused chooses among them)");
  if (opt.ctas == 0) bad("ctas must be >= 1 (got 0; planFused takes the GPU's SMs)");
  if (opt.computeLanes == 0) bad("computeLanes must be >= 1 (got 0; planFused chooses)");
  ctx.gen = placementOf(nodeOf);
  ctx.tiles.resize(ctx.p);
  for (uint32_t r = 0; r < ctx.p; ++r) {
    const FusedShard& sh = ctx.shards[r];
    for (uint64_t row = 0; row < sh.rows; row += opt.tileRows)
      ctx.tiles[r].push_back(
          FusedTile{sh.rowBegin + row, static_cast<uint32_t>(std::min<uint64_t>(opt.tileRows, sh.rows - row))});
  }

  // Visiting orders: ring order, the other nodes' places taken rail first (see the header).
  const GenContext& g = ctx.gen;
  ctx.visits.resize(ctx.p);
  for (uint32_t r = 0; r < ctx.p; ++r) {
    std::vector<uint32_t> remote;
    const uint32_t node = g.nodeOf[r], local = g.localIndex[r];
    for (uint32_t o = 1; o < g.nNodes(); ++o) {
      const auto& ranks = g.nodeRanks[(node + o) % g.nNodes()];
      for (std::size_t j = 0; j < ranks.size(); ++j) remote.push_back(ranks[(local + j) % ranks.size()]);
    }
    std::size_t next = 0;
    for (uint32_t d = 1; d < ctx.p; ++d) {
      const uint32_t peer = g.sameNode(r, ctx.ahead(r, d)) ? ctx.ahead(r, d) : remote[next++];
      ctx.visits[r].push_back((peer + ctx.p - r) % ctx.p);
    }
  }
  ctx.arrivals.resize(ctx.p);
  for (uint32_t r = 0; r < ctx.p; ++r) {
    std::vector<std::pair<std::size_t, uint32_t>> when;  // (place in the sender's visits, distance)
    for (uint32_t d = 1; d < ctx.p; ++d) {
      const auto& v = ctx.visits[ctx.behind(r, d)];
      when.emplace_back(static_cast<std::size_t>(std::find(v.begin(), v.end(), d) - v.begin()), d);
    }
    std::sort(when.begin(), when.end());
    for (const auto& [place, d] : when) ctx.arrivals[r].push_back(d);
  }

  ctx.lanes.resize(ctx.p);
  // The compute CTAs shared evenly by the compute lanes (the first ones one more).
  auto addCompute = [&](uint32_t r, uint32_t ctas) {
    if (ctas < opt.computeLanes)
      bad("the split leaves a compute lane without CTAs: " + std::to_string(ctas) + " compute CTAs for " +
          std::to_string(opt.computeLanes) + " compute lanes");
    for (uint32_t l = 0; l < opt.computeLanes; ++l)
      ctx.lanes[r].push_back(
          FusedLanePlan{FusedLane::Compute, ctas / opt.computeLanes + (l < ctas % opt.computeLanes ? 1 : 0), l});
  };
  for (uint32_t r = 0; r < ctx.p; ++r) {
    const auto comm = commLanesOf(spec.op, ctx.gen, r);
    if (comm.empty()) {
      addCompute(r, opt.ctas);
      continue;
    }
    if (opt.commCtas >= opt.ctas)
      bad("the split leaves the compute lane without CTAs: commCtas " + std::to_string(opt.commCtas) + " of ctas " +
          std::to_string(opt.ctas) + " (commCtas must be below ctas)");
    if (opt.commCtas < comm.size())
      bad("the split leaves a communication lane without CTAs: commCtas " + std::to_string(opt.commCtas) +
          " for rank " + std::to_string(r) + "'s " + std::to_string(comm.size()) + " communication lanes (" +
          laneList(comm) + "); commCtas must be at least " + std::to_string(comm.size()) + " on this placement");
    addCompute(r, opt.ctas - opt.commCtas);
    const std::vector<uint32_t> ctas = splitComm(comm, opt.commCtas);
    for (std::size_t i = 0; i < comm.size(); ++i) ctx.lanes[r].push_back(FusedLanePlan{comm[i].first, ctas[i], 0});
  }
  return ctx;
}

std::vector<std::pair<uint32_t, uint32_t>> FusedContext::walk(const std::vector<std::size_t>& tilesAt,
                                                              const std::vector<uint32_t>& peers) const {
  std::vector<std::pair<uint32_t, uint32_t>> items;
  std::vector<uint32_t> distances;
  if (opt.order != TileOrder::OwnLast) distances.push_back(0);
  distances.insert(distances.end(), peers.begin(), peers.end());
  if (opt.order == TileOrder::OwnLast) distances.push_back(0);
  if (opt.order == TileOrder::Interleaved) {
    std::size_t rounds = 0;
    for (std::size_t n : tilesAt) rounds = std::max(rounds, n);
    for (std::size_t t = 0; t < rounds; ++t)
      for (uint32_t d : distances)
        if (t < tilesAt[d]) items.emplace_back(d, static_cast<uint32_t>(t));
  } else {
    for (uint32_t d : distances)
      for (std::size_t t = 0; t < tilesAt[d]; ++t) items.emplace_back(d, static_cast<uint32_t>(t));
  }
  return items;
}

std::vector<std::size_t> FusedContext::tilesByDistance(uint32_t r, bool ahead) const {
  std::vector<std::size_t> n(p);
  for (uint32_t d = 0; d < p; ++d) n[d] = tiles[ahead ? this->ahead(r, d) : behind(r, d)].size();
  return n;
}

uint64_t FusedContext::gemmCols(uint32_t r) const noexcept {
  return spec.op == FusedOp::AllGatherGemm ? shards[r].cols : spec.n;
}

uint64_t FusedContext::gemmDepth(uint32_t r) const noexcept {
  return spec.op == FusedOp::AllGatherGemm ? spec.k : shards[r].kLen;
}

uint32_t FusedContext::ldb(uint32_t r) const noexcept {
  return static_cast<uint32_t>(spec.layoutB == MatrixLayout::ColMajor ? gemmDepth(r) : gemmCols(r));
}

uint32_t FusedContext::ctasOf(uint32_t r, FusedLane purpose, uint32_t index) const noexcept {
  for (const FusedLanePlan& l : lanes[r])
    if (l.purpose == purpose && l.index == index) return l.ctas;
  return 0;
}

uint32_t FusedContext::rankCtas(uint32_t r) const noexcept {
  uint32_t sum = 0;
  for (const FusedLanePlan& l : lanes[r]) sum += l.ctas;
  return sum;
}

uint32_t FusedContext::shareOf(uint32_t r, StepResource resource) const noexcept {
  uint32_t n = 0;
  for (const FusedLanePlan& l : lanes[r]) {
    switch (l.purpose) {
      case FusedLane::Compute: n += resource == StepResource::Tensor; break;
      case FusedLane::SendNvlink: n += resource == StepResource::NvLink; break;
      case FusedLane::SendNetwork: n += resource == StepResource::Network; break;
      case FusedLane::Reduce: n += resource == StepResource::Memory; break;
    }
  }
  return n;
}

std::vector<std::pair<FusedLane, uint32_t>> sendLanes(uint32_t nvlinkPeers, uint32_t networkPeers, uint32_t perPeer) {
  std::vector<std::pair<FusedLane, uint32_t>> lanes;
  if (nvlinkPeers > 0) lanes.emplace_back(FusedLane::SendNvlink, perPeer * nvlinkPeers);
  if (networkPeers > 0) lanes.emplace_back(FusedLane::SendNetwork, perPeer * networkPeers);
  return lanes;
}

// ---- emitting -------------------------------------------------------------------------------------------------

FusedLanes::FusedLanes(ScheduleBuilder& b, const FusedContext& ctx) : ctx_(ctx), index_(ctx.p) {
  for (uint32_t r = 0; r < ctx.p; ++r) {
    for (const FusedLanePlan& l : ctx.lanes[r]) {
      LaneRole role = LaneRole::Intra;
      uint32_t channel = 0;
      switch (l.purpose) {
        case FusedLane::Compute:
          role = LaneRole::Compute;
          channel = l.index;
          break;
        case FusedLane::SendNvlink: break;
        case FusedLane::SendNetwork: role = LaneRole::InterSend; break;
        case FusedLane::Reduce: channel = 1; break;
      }
      index_[r].emplace_back(l, b.lane(r, role, channel));
    }
  }
}

uint32_t FusedLanes::operator()(uint32_t r, FusedLane purpose, uint32_t index) const {
  for (const auto& [plan, lane] : index_.at(r))
    if (plan.purpose == purpose && plan.index == index) return lane;
  throw Error(ErrorCode::Internal, std::string("fused schedule: rank ") + std::to_string(r) + " has no " +
                                       describe(purpose) + " lane in its plan");
}

uint32_t FusedLanes::to(uint32_t r, uint32_t peer) const {
  return (*this)(r, ctx_.sameNode(r, peer) ? FusedLane::SendNvlink : FusedLane::SendNetwork);
}

void applyLaneCtas(Schedule& s, const FusedContext& ctx) {
  for (uint32_t r = 0; r < ctx.p; ++r) {
    if (s.lanes[r].size() != ctx.lanes[r].size())
      throw Error(ErrorCode::Internal, "fused schedule: rank " + std::to_string(r) + " has " +
                                           std::to_string(s.lanes[r].size()) + " lanes but its plan " +
                                           std::to_string(ctx.lanes[r].size()));
    for (std::size_t l = 0; l < s.lanes[r].size(); ++l) s.lanes[r][l].ctas = ctx.lanes[r][l].ctas;
  }
}

GemmShape tileShape(const FusedContext& ctx, uint32_t r, uint32_t rows) {
  GemmShape g;
  g.m = rows;
  g.n = static_cast<uint32_t>(ctx.gemmCols(r));
  g.k = static_cast<uint32_t>(ctx.gemmDepth(r));
  g.lda = g.k;
  g.ldb = ctx.ldb(r);
  g.ldc = g.n;
  return g;
}

uint8_t gemmFlags(const FusedContext& ctx) noexcept {
  return ctx.spec.layoutB == MatrixLayout::ColMajor ? kStepBColMajor : 0;
}

// ---- closed forms ---------------------------------------------------------------------------------------------

TileTimes tileTimes(const std::vector<std::size_t>& tilesAt) {
  TileTimes t(tilesAt.size());
  for (std::size_t d = 0; d < tilesAt.size(); ++d) t[d].assign(tilesAt[d], 0.0);
  return t;
}

double FusedPrices::gemmUs(uint32_t r, uint32_t lane, uint32_t rows) const {
  const GemmShape g = tileShape(ctx, r, rows);
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  StepPrice pr = stepPrice(profile, StepKind::Gemm, LinkClass::Local, flops, false);
  pr.capPerUs = ctaCapPerUs(profile, pr, laneSms(profile, ctx.ctasOf(r, FusedLane::Compute, lane), ctx.rankCtas(r)),
                            gemmTiles128(g.m, g.n));
  return stepLaneUs(pr, ctx.shareOf(r, StepResource::Tensor));
}

double FusedPrices::putBusyUs(uint32_t r, uint32_t peer, FusedLane purpose, uint64_t elems, bool intoUser) const {
  const double bytes = static_cast<double>(elems * dtypeSize(ctx.spec.dtype));
  const bool nvlink = ctx.sameNode(r, peer);
  StepPrice pr = stepPrice(profile, nvlink ? StepKind::Put : StepKind::ProxyPut,
                           nvlink ? LinkClass::NVLink : LinkClass::Network, bytes, intoUser);
  pr.capPerUs = ctaCapPerUs(profile, pr, laneSms(profile, ctx.ctasOf(r, purpose), ctx.rankCtas(r)), 0);
  return stepLaneUs(pr, ctx.shareOf(r, pr.resource));
}

double FusedPrices::putUs(uint32_t r, uint32_t peer, FusedLane purpose, uint64_t elems, bool intoUser) const {
  const double busy = putBusyUs(r, peer, purpose, elems, intoUser);
  return ctx.sameNode(r, peer) ? busy : proxyLaneUs(profile, busy);
}

double FusedPrices::putVisibleUs(uint32_t r, uint32_t peer, FusedLane purpose, uint64_t elems, bool intoUser) const {
  if (!ctx.sameNode(r, peer)) return proxyLandsAfterUs(profile, putBusyUs(r, peer, purpose, elems, intoUser));
  return putAlphaUs(profile, intoUser) - putLaneUs(profile, intoUser);
}

double FusedPrices::reduceUs(uint32_t r, uint64_t elems) const {
  const double bytes = static_cast<double>(elems * dtypeSize(ctx.spec.dtype));
  StepPrice pr = stepPrice(profile, StepKind::Reduce, LinkClass::Local, bytes, false);
  pr.capPerUs = ctaCapPerUs(profile, pr, laneSms(profile, ctx.ctasOf(r, FusedLane::Reduce), ctx.rankCtas(r)), 0);
  return stepLaneUs(pr, ctx.shareOf(r, StepResource::Memory));
}

void FusedTally::lane(FusedLane purpose, const ServingLane& l, bool network) {
  endUs = std::max(endUs, l.freeUs());
  const double busy = l.busyUs();
  switch (purpose) {
    case FusedLane::Compute: tensorUs = std::max(tensorUs, busy); break;
    case FusedLane::Reduce: memoryUs = std::max(memoryUs, busy); break;
    default:
      if (network)
        networkUs = std::max(networkUs, busy);
      else
        nvlinkUs = std::max(nvlinkUs, busy);
  }
}

FusedEstimate FusedTally::finish(const FusedContext& ctx, const Profile& profile, double extraUs) const {
  FusedEstimate e;
  e.dispatchUs = profile.dispatchUs + extraUs;
  e.totalUs = std::max(endUs, profile.dispatchUs) + extraUs;
  e.tensorUs = tensorUs;
  e.nvlinkUs = nvlinkUs;
  e.networkUs = networkUs;
  e.memoryUs = memoryUs;
  e.bound = FusedBound::Tensor;
  e.boundUs = tensorUs;
  for (const auto& [b, us] : {std::pair<FusedBound, double>{FusedBound::NvLink, nvlinkUs},
                              {FusedBound::Network, networkUs},
                              {FusedBound::Memory, memoryUs}})
    if (us > e.boundUs) {
      e.bound = b;
      e.boundUs = us;
    }
  e.fillDrainUs = std::max(0.0, e.totalUs - e.dispatchUs - e.boundUs);
  // Every rank's compute lane runs a tile of every shard (its partials, or the gathered rows).
  for (const auto& shard : ctx.tiles) e.tilesPerRank += shard.size();
  for (const FusedLanePlan& l : ctx.lanes[0])
    if (l.purpose == FusedLane::Compute) e.computeCtas += l.ctas;
  e.formula = "t0 " + formatMicros(e.dispatchUs) + " + steady " + formatMicros(e.boundUs) + " (" + toString(e.bound) +
              ") + fill/drain " + formatMicros(e.fillDrainUs) + " = " + formatMicros(e.totalUs);
  return e;
}

}  // namespace mk::detail
