// mkernel — the per-step rules of the timeline model (docs/cost-model.md, "rules"), in one place for every
// engine that prices a schedule step by step: the uncontended timeline (simulateUncontended) and the SimGrid
// replay (mk::sim::predict). They answer which resource a step uses, how many lanes of its rank share it,
// what the step costs on its lane, when its flag increment becomes visible, when a barrier releases, and
// which profile fields a schedule needs; each engine only decides when steps run.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk {

/// The per-rank resources of timeline rule 2: the lanes of one rank that use a resource share it.
enum class StepResource : uint8_t {
  NvLink = 0,   ///< Put; Copy or Reduce with link nvlink
  Network = 1,  ///< ProxyPut
  Memory = 2,   ///< Copy or Reduce with link local
  Tensor = 3,   ///< Gemm, GroupedGemm, Attention, AttentionGrad
  None = 255,   ///< Signal, Wait, Barrier
};
/// Number of real resources (StepResource::None excluded).
inline constexpr uint32_t kStepResources = 4;

/// The resource step `st` of (rank, lane, step) of `s` uses. Throws Error(InvalidSchedule) naming the step
/// for a Copy or Reduce whose link is neither local nor nvlink (network: use a ProxyPut; none: cost
/// attributes not filled).
StepResource stepResource(const Schedule& s, const Step& st, uint32_t rank, uint32_t lane, uint32_t step);

/// Effective Put issue time of `p`: putIssueUs when it is set and below nvlink.alphaUs, else nvlink.alphaUs.
double putIssueUs(const Profile& p) noexcept;
/// Visibility latency of one NVLink Put: nvlink.alphaUs, plus userPutUs when it lands in a user buffer.
double putAlphaUs(const Profile& p, bool intoUserBuffer) noexcept;
/// Lane time of one NVLink Put before its bytes: the issue time when distinguished (putIssueUs set, below
/// nvlink.alphaUs), else the Put's whole visibility latency (putAlphaUs). Its signal lands putAlphaUs after the Put
/// starts. putIssueUs is a Put into a peer's user buffer (what calib-put-stream times); a Put into scratch skips
/// the engine's entry check (rule 3: the peer entered the op), so its issue is putIssueUs - userPutUs.
double putLaneUs(const Profile& p, bool intoUserBuffer) noexcept;
/// When a Wait that started at `startUs` ends, its flag's threshold being visible at `visibleUs`: max(visibleUs,
/// startUs + waitUs). The one Wait rule of every engine (timeline, replay); a met Wait still costs waitUs.
double waitEndUs(const Profile& p, double startUs, double visibleUs) noexcept;
/// True when step `st` of `s` writes a user buffer (not scratch) of another rank (a Put into a peer's output).
bool writesPeerUserBuffer(const Schedule& s, const Step& st, uint32_t rank) noexcept;

/// Fraction of the line rate a message of `bytes` reaches under transport `t`: its efficiency curve, linear in
/// log(bytes) between points, flat beyond them (1 without a curve). A ProxyPut's bytes count bytes / fraction
/// against the network rate, so its links carry the wire bytes (docs/transports.md).
double transportEfficiency(const TransportModel& t, double bytes) noexcept;
/// A cross-node message before its bytes: proxyUs + network.alphaUs + transport.overheadUs + transport.latencyUs
/// (a cross-node signal or barrier release pays all of it).
double proxyAlphaUs(const Profile& p) noexcept;
/// The serial part of a ProxyPut's alpha, paid on its lane before the bytes: the proxy's work per message
/// (proxyPostUs when set below proxyUs, else proxyUs) + transport.overheadUs.
double proxyIssueUs(const Profile& p) noexcept;
/// The overlapped part of a ProxyPut's alpha: the rest of proxyUs + network.alphaUs + transport.latencyUs. The
/// message lands this long after its bytes left; the lane meanwhile issues the next message (docs/cost-model.md,
/// "ProxyPut").
double proxyLatencyUs(const Profile& p) noexcept;
/// How long a ProxyPut keeps its lane when its issue and bytes take `busyUs` (stepLaneUs of its price): a lane
/// is one connection with transport.inFlight slots, and a message holds its slot from its start until it has
/// landed (busyUs + proxyLatencyUs), so in steady state a lane starts at most inFlight messages per such span:
/// max(busyUs, (busyUs + proxyLatencyUs) / inFlight). inFlight 1 is the serial rule (busyUs + latency).
double proxyLaneUs(const Profile& p, double busyUs) noexcept;
/// When a ProxyPut whose issue and bytes take `busyUs` lands, counted from the end of its lane time
/// (proxyLaneUs): busyUs + proxyLatencyUs - proxyLaneUs.
double proxyLandsAfterUs(const Profile& p, double busyUs) noexcept;

/// Output tiles of 128 x 128 in an m x n Gemm: the unit the GPU's lowering gives one CTA of a compute lane.
uint64_t gemmTiles128(uint64_t m, uint64_t n) noexcept;

/// Rule 2b: the SMs a lane holds on a rank that runs Gemm steps: the GPU's `p.sms` shared among the rank's lanes
/// in proportion to their Lane::ctas (weights, as the GPU engine reads them; `rankCtas` = their sum). 0 when
/// p.sms is 0.
double laneSms(const Profile& p, double laneCtas, double rankCtas) noexcept;

/// The tensor rate a step of `kind` computes at, TFLOP/s per GPU (all SMs): attentionTflops for Attention and
/// AttentionGrad, gemmTflops for the other tensor steps (Gemm, GroupedGemm). The one home of that rule.
double tensorTflops(const Profile& p, StepKind kind) noexcept;

/// The price of one step that moves bytes or computes (Copy, Reduce, Put, ProxyPut, Gemm), in pieces: the
/// lane first pays `alphaUs`, then moves `amount` units at `rate` divided by its rank's share of `resource`
/// (rule 2), or at `capPerUs` where that is lower (rule 2b). Rule 3's duration is laneUs(); an engine that
/// meters the payload itself (the SimGrid replay) uses the pieces.
struct StepPrice {
  StepResource resource = StepResource::None;
  double alphaUs = 0;     ///< on the lane before the payload (a Put: its issue part, see putLaneUs)
  double amount = 0;      ///< bytes, or FLOPs for a tensor step; 0 for a ProxyPut that only signals
  double rate = 0;        ///< one lane's full rate: GB/s, or TFLOP/s for a tensor step (tensorTflops)
  double unitsPerUs = 0;  ///< `amount` units per microsecond at rate 1: 1e3 (GB/s) or 1e6 (TFLOP/s)
  double capPerUs = 0;    ///< rule 2b: what the lane's CTAs reach, units per microsecond; 0 = no cap
  /// `amount` units per second at rate 1 (1e9 or 1e12).
  double unitsPerSecond() const noexcept { return unitsPerUs * 1e6; }
};

/// Rule 2b: the most a step priced `pr` (stepPrice) reaches on a lane holding `sms` SMs (laneSms) of a rank that
/// runs Gemm steps, in units per microsecond: a tensor step (Gemm, Attention, ...) of `gemmTiles` work units (128 x
/// 128 output tiles, 128-row attention blocks: one CTA's work each) its own rate pr.rate*1e6 * min(sms, gemmTiles) /
/// p.sms; a Copy, Reduce or Put sms * ctaGBs * 1e3 bytes. 0 (no cap) for a ProxyPut (the host proxy moves its
/// bytes), a synchronising step, or a rate the profile does not distinguish (p.sms or ctaGBs 0).
double ctaCapPerUs(const Profile& p, const StepPrice& pr, double sms, uint64_t gemmTiles) noexcept;

/// Rule 3's price of a step of `kind` moving `amount` (bytes; FLOPs for a Gemm), without rule 2b's cap: a Copy
/// or Reduce over `link` (nvlink, else local; a Route or Gather as a Copy of its bytes), a Put (`intoPeerUser`: landing
/// in another rank's user buffer), a ProxyPut, a tensor step at tensorTflops; resource None for the other kinds.
/// StepCosts prices a schedule's steps with it; closed forms price the steps their generator would emit. `stepFlags`:
/// the step's protocol bits (kStepLL, kStepLL128) price a Put at its protocol's latency (lane time and visibility) and
/// a Put or ProxyPut's bytes at the link rate times the protocol's bwFraction.
StepPrice stepPrice(const Profile& p, StepKind kind, LinkClass link, double amount, bool intoPeerUser,
                    uint8_t stepFlags = 0) noexcept;
/// The packet protocol the flags of a Put / ProxyPut select (Profile::ll, Profile::ll128); nullptr for none.
const ProtocolCost* stepProtocol(const Profile& p, uint8_t stepFlags) noexcept;
/// `p` as a closed form sees Puts of the protocol `stepFlags` selects: a plain Put under the result costs what a
/// Put with those flags costs under `p` (nvlink.alphaUs the protocol's latency, putIssueUs and userPutUs 0, the
/// NVLink and network rates times its bwFraction). For generators whose only NVLink steps are Puts; `p` itself
/// when no protocol bit is set.
Profile protocolView(const Profile& p, uint8_t stepFlags);
/// Whether rule 2b's cap, not rule 2's share of `share` lanes, sets the rate of `pr`.
bool capBinds(const StepPrice& pr, uint32_t share) noexcept;
/// Rule 3 under rules 2 and 2b: alpha, then the amount at the rate over `share` lanes or at the cap where lower.
double stepLaneUs(const StepPrice& pr, uint32_t share) noexcept;

/// One lane of a schedule, in (rank, lane) order, with the index of its first step in the flat
/// (rank, lane, step) order every engine's per-step output uses.
struct LaneRef {
  uint32_t rank = 0;
  uint32_t lane = 0;
  uint64_t firstStep = 0;
};

/// The timeline rules for one (schedule, profile), built once: checks the schedule's structure and the
/// profile fields it needs, counts the shares of rule 2, and prices steps under rules 1 and 3. The schedule
/// and the profile must outlive it.
class StepCosts {
 public:
  /// An engine's own check of step (rank, lane, step), whose resource is `resource`; it throws to reject.
  using StepCheck = std::function<void(uint32_t rank, uint32_t lane, uint32_t step, StepResource resource)>;

  /// Throws Error(InvalidSchedule) for lane lists or nodeOf not of size nRanks, a lane of 2^32 steps or more,
  /// a Copy or Reduce without a usable link (stepResource), a flag or barrier out of range, or a Wait on
  /// another rank's flag; Error(InvalidArgument) for a negative or non-finite latency of the profile, or a
  /// rate the schedule needs (local copy, NVLink, reduce, network, gemm) that is not > 0. `extra` runs on
  /// every step right after the shared checks of that step.
  /// `networkShares` (one per rank, or empty): the fraction of network.bwGBs each rank's ProxyPuts get from its
  /// node's shared NICs (rankNetworkShares); empty = the whole rate (the SimGrid replay, whose links share).
  StepCosts(const Schedule& s, const Profile& p, const StepCheck& extra = {}, std::vector<double> networkShares = {});

  const Schedule& schedule() const noexcept { return s_; }
  const Profile& profile() const noexcept { return p_; }
  /// Every lane, in (rank, lane) order.
  const std::vector<LaneRef>& lanes() const noexcept { return lanes_; }
  /// Steps over all lanes.
  uint64_t steps() const noexcept { return steps_; }
  /// Lanes that reach barrier `id`.
  uint64_t barrierParticipants(uint32_t id) const { return barrierParticipants_[id]; }
  /// All ranks on one node (barriers release over NVLink flags, not through the proxy).
  bool singleNode() const noexcept { return singleNode_; }
  /// Rule 2: lanes of `rank` with at least one step using `r`.
  uint32_t share(uint32_t rank, StepResource r) const noexcept {
    return share_[static_cast<std::size_t>(rank) * kStepResources + static_cast<uint32_t>(r)];
  }

  /// Whether `rank` runs Gemm steps and the profile distinguishes SMs: its lanes' rates then follow their CTAs
  /// (rule 2b).
  bool computes(uint32_t rank) const noexcept { return !rankCtas_.empty() && rankCtas_[rank] > 0; }

  /// Rule 3's price of a Copy, Reduce, Put, ProxyPut or Gemm executed by lane `lane` of `rank` (resource None
  /// otherwise), with rule 2b's cap when the rank computes.
  StepPrice price(const Step& st, uint32_t rank, uint32_t lane) const;
  /// Whether rule 2b's cap, not rule 2's share, sets the rate of `pr` on `rank`.
  bool capBinds(const StepPrice& pr, uint32_t rank) const noexcept {
    return mk::capBinds(pr, share(rank, pr.resource));
  }
  /// Rule 3: how long `st` keeps lane `lane` of `rank`, for a step that does not synchronise (0 for a Signal;
  /// Wait and Barrier end by the rules of their own).
  double laneUs(const Step& st, uint32_t rank, uint32_t lane) const;
  /// Rule 3: Signal -> Wait visibility from `fromRank` to a flag of `toRank`: localFlagUs on the same rank,
  /// flagUs on the same node, proxyUs + network.alphaUs across nodes.
  double signalDelayUs(uint32_t fromRank, uint32_t toRank) const noexcept;
  /// When the flag increment of `st` (a Signal, or a Put or ProxyPut with kStepSignal) becomes visible,
  /// counted from the step's end: signalDelayUs for a Signal, the rest of the Put's alpha after its issue
  /// time, proxyLandsAfterUs for a ProxyPut.
  double incrementDelayUs(const Step& st, uint32_t rank) const noexcept;
  /// Rule 3: a barrier releases every participant this long after its last arrival.
  double barrierReleaseUs() const noexcept;
  /// Rule 1: the op's total time when its last step ends at `lastEndUs` (dispatchUs without steps), plus
  /// peerUserUs when some rank's step touches another rank's user buffers.
  double opTotalUs(double lastEndUs) const;

 private:
  /// Rules 2 and 3 without rule 2b's cap.
  StepPrice sharedPrice(const Step& st, uint32_t rank) const;

  const Schedule& s_;
  const Profile& p_;
  bool singleNode_ = true;
  std::vector<uint32_t> share_;   ///< [rank * kStepResources + resource]
  std::vector<double> netShare_;  ///< [rank] fraction of network.bwGBs from the node's NICs (empty: 1)
  std::vector<double> rankCtas_;  ///< rule 2b: Lane::ctas summed over a computing rank's lanes (0: not computing)
  std::vector<std::vector<double>> laneSms_;  ///< rule 2b: [rank][lane] SMs the lane holds (computing ranks)
  std::vector<LaneRef> lanes_;
  std::vector<uint64_t> barrierParticipants_;
  uint64_t steps_ = 0;
};

}  // namespace mk
