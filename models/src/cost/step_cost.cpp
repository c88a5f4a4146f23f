// mkernel — the per-step rules of the timeline model (step_cost.hpp, docs/cost-model.md).
#include "mk/cost/step_cost.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "mk/error.hpp"
#include "mk/schedule/check.hpp"
#include "mk/util/size.hpp"

namespace mk {

namespace {

// GB/s is 1e3 bytes per microsecond, TFLOP/s 1e6 FLOPs per microsecond.
constexpr double kBytesPerUsPerGBs = 1e3;
constexpr double kFlopsPerUsPerTflops = 1e6;

[[noreturn]] void badStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, const std::string& what) {
  throw Error(ErrorCode::InvalidSchedule, describeStep(s, rank, lane, step) + ": " + what);
}

}  // namespace

double rampFraction(const std::vector<RampPoint>& r, double bytes) noexcept {
  if (r.empty()) return 1.0;
  if (!(bytes > r.front().bytes)) return r.front().fraction;
  if (bytes >= r.back().bytes) return r.back().fraction;
  const auto hi = std::upper_bound(r.begin(), r.end(), bytes, [](double b, const RampPoint& p) { return b < p.bytes; });
  const RampPoint& b = *hi;
  const RampPoint& a = *(hi - 1);
  const double t = std::log(bytes / a.bytes) / std::log(b.bytes / a.bytes);
  return a.fraction + t * (b.fraction - a.fraction);
}

double linkRate(const LinkCost& c, double bytes) noexcept { return c.bwGBs * rampFraction(c.ramp, bytes); }

double reduceRate(const Profile& p, double bytes) noexcept { return p.reduceGBs * rampFraction(p.reduceRamp, bytes); }

void validateRamp(const std::vector<RampPoint>& ramp, const std::string& what, bool capped) {
  for (std::size_t i = 0; i < ramp.size(); ++i) {
    const RampPoint& p = ramp[i];
    const std::string at = what + "[" + std::to_string(i) + "]";
    if (!std::isfinite(p.bytes) || p.bytes <= 0)
      throw Error(ErrorCode::InvalidArgument, at + ".bytes must be finite and > 0 (got " + formatNumber(p.bytes) + ")");
    if (!std::isfinite(p.fraction) || p.fraction <= 0 || (capped && p.fraction > 1))
      throw Error(ErrorCode::InvalidArgument, at + ".fraction must be " + (capped ? "in (0, 1]" : "finite and > 0") +
                                                  " (got " + formatNumber(p.fraction) + ")");
    if (i == 0) continue;
    if (p.bytes <= ramp[i - 1].bytes)
      throw Error(ErrorCode::InvalidArgument, at + ".bytes must be larger than the point before (" +
                                                  formatNumber(ramp[i - 1].bytes) + "): points in increasing size");
    if (capped && p.fraction < ramp[i - 1].fraction)
      throw Error(ErrorCode::InvalidArgument, at + ".fraction must not fall below the point before (" +
                                                  formatNumber(ramp[i - 1].fraction) +
                                                  "): a larger transfer never reaches less of the link");
  }
}

StepResource stepResource(const Schedule& s, const Step& st, uint32_t rank, uint32_t lane, uint32_t step) {
  switch (st.kind) {
    case StepKind::Put: return StepResource::NvLink;
    case StepKind::ProxyPut: return StepResource::Network;
    case StepKind::Gemm:
    case StepKind::GroupedGemm:
    case StepKind::Attention:
    case StepKind::AttentionGrad: return StepResource::Tensor;
    case StepKind::Copy:
    case StepKind::Reduce:
    case StepKind::Route:
    case StepKind::Gather:
    case StepKind::Combine:
      if (st.link == LinkClass::NVLink) return StepResource::NvLink;
      if (st.link == LinkClass::Local) return StepResource::Memory;
      if (st.link == LinkClass::Network)
        badStep(s, rank, lane, step,
                std::string("a ") + toString(st.kind) +
                    " cannot touch another node's memory (link network): use a ProxyPut");
      badStep(s, rank, lane, step,
              std::string("a ") + toString(st.kind) + " needs link local or nvlink (got " + toString(st.link) +
                  "): call fillCostAttributes() first");
    default: return StepResource::None;
  }
}

double putIssueUs(const Profile& p) noexcept {
  return p.putIssueUs > 0 && p.putIssueUs < p.nvlink.alphaUs ? p.putIssueUs : p.nvlink.alphaUs;
}

double putAlphaUs(const Profile& p, bool intoUserBuffer) noexcept {
  return p.nvlink.alphaUs + (intoUserBuffer && p.userPutUs > 0 ? p.userPutUs : 0.0);
}

double putLaneUs(const Profile& p, bool intoUserBuffer) noexcept {
  const double alpha = putAlphaUs(p, intoUserBuffer);
  if (!(p.putIssueUs > 0)) return alpha;
  // The entry check (poll the peer's entry, system fence) runs at the start of a step that touches a peer's user
  // buffer: it is lane time as much as latency, and calib-put-stream's puts (into the peers' output) paid it.
  // (Floored at 0: a profile whose entry check exceeds the whole issue leaves the scratch Put no lane time.)
  const double issue = intoUserBuffer || !(p.userPutUs > 0) ? p.putIssueUs : std::max(0.0, p.putIssueUs - p.userPutUs);
  return issue < alpha ? issue : alpha;
}

double waitEndUs(const Profile& p, double startUs, double visibleUs) noexcept {
  return std::max(visibleUs, startUs + (p.waitUs > 0 ? p.waitUs : 0.0));
}

double transportEfficiency(const TransportModel& t, double bytes) noexcept { return rampFraction(t.efficiency, bytes); }

double proxyAlphaUs(const Profile& p) noexcept {
  return p.proxyUs + p.network.alphaUs + p.transport.overheadUs + p.transport.latencyUs;
}

namespace {

/// The proxy's serial part of proxyUs: proxyPostUs when set below proxyUs, else all of it.
double proxyPostPart(const Profile& p) noexcept {
  return p.proxyPostUs > 0 && p.proxyPostUs < p.proxyUs ? p.proxyPostUs : p.proxyUs;
}

}  // namespace

double proxyIssueUs(const Profile& p) noexcept { return proxyPostPart(p) + p.transport.overheadUs; }

double proxyLatencyUs(const Profile& p) noexcept {
  return p.proxyUs - proxyPostPart(p) + p.network.alphaUs + p.transport.latencyUs;
}

double proxyLaneUs(const Profile& p, double busyUs) noexcept {
  const double slots = std::max<uint32_t>(p.transport.inFlight, 1);
  return std::max(busyUs, (busyUs + proxyLatencyUs(p)) / slots);
}

double proxyLandsAfterUs(const Profile& p, double busyUs) noexcept {
  return busyUs + proxyLatencyUs(p) - proxyLaneUs(p, busyUs);
}

double tensorTflops(const Profile& p, StepKind kind) noexcept {
  // An attention step's FLOPs run at the calibrated attention rate (calib-attention; the GEMM rate in a profile
  // without one), a backward's too: FlashAttention-2's backward is the forward's kernel shape, 2.5 x its FLOPs.
  return kind == StepKind::Attention || kind == StepKind::AttentionGrad ? p.attentionTflops : p.gemmTflops;
}

uint64_t gemmTiles128(uint64_t m, uint64_t n) noexcept { return ((m + 127) / 128) * ((n + 127) / 128); }

double laneSms(const Profile& p, double laneCtas, double rankCtas) noexcept {
  if (p.sms == 0 || !(rankCtas > 0)) return 0;
  return static_cast<double>(p.sms) * laneCtas / rankCtas;
}

double ctaCapPerUs(const Profile& p, const StepPrice& pr, double sms, uint64_t gemmTiles) noexcept {
  if (p.sms == 0 || !(sms > 0)) return 0;
  switch (pr.resource) {
    case StepResource::Tensor:
      // The step's own rate (gemmTflops or attentionTflops, stepPrice's choice), a share of it per SM.
      return pr.rate * pr.unitsPerUs * std::min(sms, static_cast<double>(gemmTiles)) / static_cast<double>(p.sms);
    case StepResource::NvLink:
    case StepResource::Memory: return p.ctaGBs > 0 ? sms * p.ctaGBs * kBytesPerUsPerGBs : 0;
    default: return 0;
  }
}

const ProtocolCost* stepProtocol(const Profile& p, uint8_t stepFlags) noexcept {
  if (stepFlags & kStepLL) return &p.ll;
  if (stepFlags & kStepLL128) return &p.ll128;
  return nullptr;
}

Profile protocolView(const Profile& p, uint8_t stepFlags) {
  const ProtocolCost* proto = stepProtocol(p, stepFlags);
  if (proto == nullptr) return p;
  Profile v = p;
  v.nvlink.alphaUs = proto->latencyUs;
  v.putIssueUs = 0;
  v.userPutUs = 0;
  v.nvlink.bwGBs *= proto->bwFraction;
  v.network.bwGBs *= proto->bwFraction;
  return v;
}

StepPrice stepPrice(const Profile& p, StepKind kind, LinkClass link, double amount, bool intoPeerUser,
                    uint8_t stepFlags) noexcept {
  // A packet protocol (kStepLL, kStepLL128): the flag rides with the data, so a Put has no separate issue and
  // visibility parts, and only bwFraction of the bytes on the wire are payload.
  if (const ProtocolCost* proto = stepProtocol(p, stepFlags); proto != nullptr && kindInfo(kind).protocol) {
    StepPrice pr = stepPrice(p, kind, link, amount, intoPeerUser);
    if (kind == StepKind::Put) pr.alphaUs = proto->latencyUs;
    pr.rate *= proto->bwFraction;
    return pr;
  }
  StepPrice pr;
  pr.amount = amount;
  pr.unitsPerUs = kBytesPerUsPerGBs;
  switch (kind) {
    case StepKind::Copy:
    case StepKind::Route:    // memory traffic: its ids and layout
    case StepKind::Gather:   // a copy through an index list
    case StepKind::Combine:  // a weighted sum through the ids: its rows, weights and ids read, its rows written
      if (link == LinkClass::NVLink) {
        pr.resource = StepResource::NvLink;
        pr.alphaUs = p.nvlink.alphaUs;
        pr.rate = linkRate(p.nvlink, amount);
      } else {
        pr.resource = StepResource::Memory;
        pr.alphaUs = p.local.alphaUs;
        pr.rate = linkRate(p.local, amount);
      }
      return pr;
    case StepKind::Reduce:
      if (link == LinkClass::NVLink) {
        pr.resource = StepResource::NvLink;
        pr.alphaUs = p.nvlink.alphaUs;
        pr.rate = std::min(reduceRate(p, amount), linkRate(p.nvlink, amount));
      } else {
        pr.resource = StepResource::Memory;
        pr.alphaUs = p.local.alphaUs;
        pr.rate = reduceRate(p, amount);
      }
      return pr;
    case StepKind::Put:
      pr.resource = StepResource::NvLink;
      pr.alphaUs = putLaneUs(p, intoPeerUser);
      pr.rate = linkRate(p.nvlink, amount);
      return pr;
    case StepKind::ProxyPut:
      pr.resource = StepResource::Network;
      pr.alphaUs = proxyIssueUs(p);  // the latency overlaps later messages: proxyLaneUs, proxyLandsAfterUs
      pr.amount = amount / transportEfficiency(p.transport, amount);  // wire bytes
      pr.rate = linkRate(p.network, pr.amount);
      return pr;
    case StepKind::Gemm:
    case StepKind::GroupedGemm:
    case StepKind::Attention:
    case StepKind::AttentionGrad:
      pr.resource = StepResource::Tensor;
      pr.rate = tensorTflops(p, kind);
      pr.unitsPerUs = kFlopsPerUsPerTflops;
      return pr;
    default: return StepPrice{};
  }
}

bool capBinds(const StepPrice& pr, uint32_t share) noexcept {
  return pr.capPerUs > 0 && pr.capPerUs * share < pr.rate * pr.unitsPerUs;
}

double stepLaneUs(const StepPrice& pr, uint32_t share) noexcept {
  if (pr.resource == StepResource::None) return 0;
  // alpha, then the payload at the lane's share of the rate (or its CTAs' cap). A payload of 0 adds exactly 0.
  if (capBinds(pr, share)) return pr.alphaUs + pr.amount / pr.capPerUs;
  return pr.alphaUs + pr.amount * static_cast<double>(share) / (pr.rate * pr.unitsPerUs);
}

bool writesPeerUserBuffer(const Schedule& s, const Step& st, uint32_t rank) noexcept {
  return st.dst.rank != rank && st.dst.buffer < s.buffers.size() &&
         s.buffers[st.dst.buffer].kind != BufferKind::Scratch;
}

StepCosts::StepCosts(const Schedule& s, const Profile& p, const StepCheck& extra, std::vector<double> networkShares)
    : s_(s), p_(p), netShare_(std::move(networkShares)) {
  requireRankTables(s);
  if (!netShare_.empty() && netShare_.size() != s.nRanks)
    throw Error(ErrorCode::InvalidArgument, "network shares: one per rank expected (got " +
                                                std::to_string(netShare_.size()) + " for " + std::to_string(s.nRanks) +
                                                " ranks)");
  requireNonNegative("profile.dispatchUs", p.dispatchUs);
  requireNonNegative("profile.flagUs", p.flagUs);
  requireNonNegative("profile.localFlagUs", p.localFlagUs);
  requireNonNegative("profile.proxyUs", p.proxyUs);
  requireNonNegative("profile.proxyPostUs", p.proxyPostUs);
  requireNonNegative("profile.nvlink.alphaUs", p.nvlink.alphaUs);
  requireNonNegative("profile.network.alphaUs", p.network.alphaUs);
  requireNonNegative("profile.local.alphaUs", p.local.alphaUs);

  singleNode_ = std::all_of(s.nodeOf.begin(), s.nodeOf.end(), [&](uint32_t n) { return n == s.nodeOf[0]; });
  share_.assign(static_cast<std::size_t>(s.nRanks) * kStepResources, 0);
  barrierParticipants_.assign(s.nBarriers, 0);
  bool copyLocal = false, nvlink = false, reduce = false, network = false, gemm = false, attention = false, ll = false,
       ll128 = false;
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    for (uint32_t l = 0; l < s.lanes[r].size(); ++l) {
      const auto& steps = s.lanes[r][l].steps;
      if (steps.size() > std::numeric_limits<uint32_t>::max())
        throw Error(ErrorCode::InvalidSchedule,
                    "rank " + std::to_string(r) + " lane " + std::to_string(l) + " has more than 2^32 steps");
      lanes_.push_back(LaneRef{r, l, steps_});
      steps_ += steps.size();
      bool uses[kStepResources] = {false, false, false, false};
      for (uint32_t i = 0; i < steps.size(); ++i) {
        const Step& st = steps[i];
        const StepResource res = stepResource(s, st, r, l, i);
        if (res != StepResource::None) uses[static_cast<uint32_t>(res)] = true;
        requireSyncReferences(s, r, l, i);
        if (st.kind == StepKind::Barrier) ++barrierParticipants_[st.aux];
        if (extra) extra(r, l, i, res);
        copyLocal = copyLocal || (st.kind != StepKind::Reduce && res == StepResource::Memory);
        nvlink = nvlink || res == StepResource::NvLink;
        reduce = reduce || st.kind == StepKind::Reduce;
        network = network || kindInfo(st.kind).remote;
        const bool attends = st.kind == StepKind::Attention || st.kind == StepKind::AttentionGrad;
        gemm = gemm || (res == StepResource::Tensor && !attends);
        attention = attention || attends;
        ll = ll || (st.flags & kStepLL);
        ll128 = ll128 || (st.flags & kStepLL128);
      }
      for (uint32_t k = 0; k < kStepResources; ++k)
        if (uses[k]) ++share_[static_cast<std::size_t>(r) * kStepResources + k];
    }
  }
  // Rule 2b: a rank that runs Gemm steps splits its SMs among its lanes by their CTAs.
  if (p.sms > 0) {
    for (uint32_t r = 0; r < s.nRanks; ++r) {
      if (share(r, StepResource::Tensor) == 0) continue;
      if (rankCtas_.empty()) {
        rankCtas_.assign(s.nRanks, 0);
        laneSms_.resize(s.nRanks);
      }
      for (const Lane& lane : s.lanes[r]) rankCtas_[r] += lane.ctas;
      for (const Lane& lane : s.lanes[r]) laneSms_[r].push_back(mk::laneSms(p, lane.ctas, rankCtas_[r]));
    }
  }
  if (copyLocal) requirePositive("profile.local.bwGBs", p.local.bwGBs, "a local copy");
  if (nvlink) requirePositive("profile.nvlink.bwGBs", p.nvlink.bwGBs, "an NVLink transfer");
  if (reduce) requirePositive("profile.reduceGBs", p.reduceGBs, "a reduce");
  if (network) requirePositive("profile.network.bwGBs", p.network.bwGBs, "a proxy put");
  if (gemm) requirePositive("profile.gemmTflops", p.gemmTflops, "a gemm");
  if (attention) requirePositive("profile.attentionTflops", p.attentionTflops, "an attention step");
  if (ll) requirePositive("profile.protocols.ll.bwFraction", p.ll.bwFraction, "an LL put");
  if (ll128) requirePositive("profile.protocols.ll128.bwFraction", p.ll128.bwFraction, "an LL128 put");
  if (ll) requireNonNegative("profile.protocols.ll.latencyUs", p.ll.latencyUs);
  if (ll128) requireNonNegative("profile.protocols.ll128.latencyUs", p.ll128.latencyUs);
}

StepPrice StepCosts::price(const Step& st, uint32_t rank, uint32_t lane) const {
  StepPrice pr = sharedPrice(st, rank);
  if (computes(rank) && pr.resource != StepResource::None) {
    uint64_t tiles = 0;
    if (kindInfo(st.kind).extent == StepExtent::Tile)
      forEachGemm(s_.gemms, st,
                  [&](const Step& one) { tiles += gemmTiles128(s_.gemms[one.aux].m, s_.gemms[one.aux].n); });
    if (st.kind == StepKind::Attention && st.aux < s_.attentions.size()) {
      // FlashAttention's work units: a 128-row block of queries of one (batch, head).
      const AttentionShape& sh = s_.attentions[st.aux];
      tiles = uint64_t{sh.batch} * sh.qHeads * ((uint64_t{sh.sq} + 127) / 128);
    }
    if (st.kind == StepKind::AttentionGrad && st.aux < s_.attentions.size()) {
      // FlashAttention-2's backward work units: a 128-row block of keys of one (batch, query head); with GQA each
      // query head's dK / dV are summed into its KV head's afterwards, so the units do not shrink with kvHeads.
      const AttentionShape& sh = s_.attentions[st.aux];
      tiles = uint64_t{sh.batch} * sh.qHeads * ((uint64_t{sh.skv} + 127) / 128);
    }
    pr.capPerUs = ctaCapPerUs(p_, pr, laneSms_[rank][lane], tiles);
  }
  return pr;
}

StepPrice StepCosts::sharedPrice(const Step& st, uint32_t rank) const {
  const bool gemm = pricedByFlops(st.kind);
  StepPrice pr = stepPrice(p_, st.kind, st.link, gemm ? st.flops : static_cast<double>(st.bytes),
                           st.kind == StepKind::Put && writesPeerUserBuffer(s_, st, rank), st.flags);
  if (kindInfo(st.kind).remote) {
    if (st.count == 0) pr.amount = 0;  // a signal only
    if (!netShare_.empty()) pr.rate *= netShare_[rank];
  }
  return pr;
}

double StepCosts::laneUs(const Step& st, uint32_t rank, uint32_t lane) const {
  const StepPrice pr = price(st, rank, lane);
  if (pr.resource == StepResource::None) return 0;  // share() has no entry for it
  const double busy = stepLaneUs(pr, share(rank, pr.resource));
  return kindInfo(st.kind).remote ? proxyLaneUs(p_, busy) : busy;
}

double StepCosts::signalDelayUs(uint32_t fromRank, uint32_t toRank) const noexcept {
  if (fromRank == toRank) return p_.localFlagUs;
  if (s_.nodeOf[fromRank] == s_.nodeOf[toRank]) return p_.flagUs;
  return proxyAlphaUs(p_);
}

double StepCosts::incrementDelayUs(const Step& st, uint32_t rank) const noexcept {
  switch (st.kind) {
    case StepKind::Signal: return signalDelayUs(rank, st.flag.rank);
    case StepKind::Put: {
      // A packet protocol's flag is in the data: visible when the bytes are, at the step's end.
      if (stepProtocol(p_, st.flags) != nullptr) return 0;
      // The lane moved on after the issue time; the data (and so the signal) lands alpha after the start.
      const bool user = writesPeerUserBuffer(s_, st, rank);
      return putAlphaUs(p_, user) - putLaneUs(p_, user);
    }
    case StepKind::ProxyPut: {
      const StepPrice pr = sharedPrice(st, rank);  // no rule 2b cap: the host proxy moves the bytes
      return proxyLandsAfterUs(p_, stepLaneUs(pr, share(rank, StepResource::Network)));
    }
    default: return 0;
  }
}

double StepCosts::barrierReleaseUs() const noexcept { return singleNode_ ? p_.flagUs : proxyAlphaUs(p_); }

double StepCosts::opTotalUs(double lastEndUs) const {
  double total = std::max(lastEndUs, p_.dispatchUs);
  // Global completion and the entry handshake, when some rank's user buffers are a peer's operand.
  if (p_.peerUserUs > 0 && peersTouchUserBuffers(s_)) total += p_.peerUserUs;
  return total;
}

}  // namespace mk
