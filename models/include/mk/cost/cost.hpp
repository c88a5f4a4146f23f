// mkernel — closed-form alpha-beta(-gamma) cost of each generator's schedule (formulas: docs/cost-model.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// One point of a ramp: a transfer of `bytes` reaches `fraction` of the rate it belongs to.
struct RampPoint {
  double bytes = 0;
  double fraction = 1;
};

/// alpha (per message, us) and beta (1/bandwidth) of one link class, with an optional ramp: how much of the
/// bandwidth a transfer of a given size reaches.
struct LinkCost {
  LinkCost() = default;
  LinkCost(double alpha, double bw, std::vector<RampPoint> r = {}) : alphaUs(alpha), bwGBs(bw), ramp(std::move(r)) {}

  double alphaUs = 0;
  double bwGBs = 0;
  /// Points with bytes > 0 strictly increasing; between two points the fraction is linear in log(bytes), below
  /// the first point it is the first one's, beyond the last the last one's. Empty: 1 at every size (the plain
  /// alpha-beta line). A link's ramp (nvlink, network) is capped: fractions in (0, 1], non-decreasing (a put
  /// spread over fewer CTAs than the link needs moves its bytes below the large-size rate). A memory pipe's
  /// (local) is not: a copy whose buffers stay in L2 runs faster than the large-size rate. mk-calibrate fits
  /// them from the micro-benchmarks; datasheet defaults leave them empty.
  std::vector<RampPoint> ramp;
};

/// The fraction `ramp` gives a transfer of `bytes` (1 for an empty ramp).
double rampFraction(const std::vector<RampPoint>& ramp, double bytes) noexcept;
/// c.bwGBs * rampFraction(c.ramp, bytes): the one rate every engine and closed form charges a transfer of `bytes`.
double linkRate(const LinkCost& c, double bytes) noexcept;
/// Throws Error(InvalidArgument) "<what>[i]: ..." naming the first point that breaks the rules of LinkCost::ramp;
/// `capped`: also fractions <= 1 and non-decreasing.
void validateRamp(const std::vector<RampPoint>& ramp, const std::string& what, bool capped);

/// The price of a packet protocol on a Put / ProxyPut that carries its flag bit (kStepLL, kStepLL128): data and
/// flag travel in the same stores, so the message is visible as soon as its bytes are, without the fence and
/// separate flag store of a plain Put. Defaults: NCCL's documented protocol design (docs/algorithms-nccl.md).
struct ProtocolCost {
  /// An NVLink Put of this protocol: lane time before its bytes, and its visibility latency (it replaces
  /// nvlink.alphaUs, putIssueUs and userPutUs). A ProxyPut keeps its issue and latency (proxyIssueUs, proxyLatencyUs).
  double latencyUs = 0;
  /// Payload share of the bytes on the wire (LL: 4 of 8, LL128: 120 of 128): a Put or ProxyPut of this protocol
  /// moves its bytes at the link's rate times this; in (0, 1].
  double bwFraction = 1;
};

/// What a layered library's op (NCCL: one kernel per GPU per op) pays that the resident kernel's dispatch does
/// not: the host runs NCCL's enqueue, plan and launch path for every op and GPU, and each kernel has a fixed cost
/// by protocol. The nccl-* algorithms are priced with layeredProfile() (mk/algorithms/nccl.hpp), which turns the
/// base costs into dispatchUs; layeredOpUs() adds the host path.
struct LayeredCosts {
  /// Host time per op and GPU of NCCL's entry path (argument checks, enqueue, one stream operation): our
  /// one-rank measurement (validation/data/measured/nccl-host/). A one-rank communicator skips NCCL's plan and
  /// collective kernel (enqueue.cc: ncclLaunchOneRank), so a multi-rank op adds groupGpuUs.
  double hostOpUs = 4.42;
  /// Host time per op and GPU that a multi-rank op adds to hostOpUs: NCCL's plan (ncclPrepareTasks: the tuner,
  /// work packing), the collective kernel's launch and the stream ordering of a grouped launch (group.cc). Not
  /// measured (NCCL refuses two ranks on one GPU): 0 unless mk-calibrate fits it (calibrate.hpp).
  double groupGpuUs = 0;
  double baseLlUs = 6.6;  ///< fixed cost of one op's kernel with the LL protocol
  double baseLl128Us = 14.0;
  double baseSimpleUs = 8.4;
};

/// One point of a transport's efficiency curve: messages of `bytes` reach `fraction` of the line rate (a capped
/// ramp: the same points, interpolation and checks as LinkCost::ramp).
using EfficiencyPoint = RampPoint;

/// How a NIC's transport turns line rate into message rate (docs/transports.md). Every ProxyPut pays
/// `overheadUs` + `latencyUs` on top of the proxy and the network path's alpha, and moves its bytes at
/// network.bwGBs x efficiency(bytes) (transportEfficiency, step_cost.hpp).
struct TransportModel {
  std::string kind = "ib";  ///< ib | roce | efa | tcp (nicTransports())
  double overheadUs = 0;    ///< per message, on the sending lane: the transport's own work beyond the proxy's
  double latencyUs = 0;     ///< added one-way latency of a small message beyond the NIC's and the fabric's
  /// (bytes, fraction of line rate), ascending bytes and non-decreasing fractions in (0, 1], interpolated
  /// linearly in log(bytes); below the first point its fraction, above the last the last one's. Empty = 1.
  std::vector<EfficiencyPoint> efficiency;
  /// Messages a NIC keeps in flight per connection: with a round trip of 2 x the message latency, a stream of
  /// m-byte messages cannot beat inFlight x m per round trip (the window cap of transportEfficiency). >= 1.
  uint32_t inFlight = 8;
};

/// Datasheet / protocol-specification defaults of a transport kind (sources: docs/transports.md); throws
/// Error(InvalidArgument) for an unknown kind.
TransportModel defaultTransport(const std::string& kind);
/// InfiniBand RC framing (4096-byte MTU, LRH + BTH + ICRC + VCRC per packet, RETH once): what a profile sets as
/// the ib efficiency to count it; the ib default leaves it out (docs/transports.md).
std::vector<EfficiencyPoint> ibFramingCurve();
/// Throws Error(InvalidArgument) naming `field` + ".<member>" for a value out of range: an unknown kind, a
/// negative or non-finite overhead or latency, a fraction outside (0, 1], points not in ascending bytes or
/// with falling fractions, inFlight 0.
void validateTransport(const TransportModel& t, const std::string& field);

/// Parameters the closed form and the simulator need. Defaults come from datasheets
/// (`defaultProfile`); the calibration issue fits them from measurements.
struct Profile {
  std::string source = "uncalibrated (datasheet defaults)";
  LinkCost nvlink;  ///< Put over NVLink, per GPU per direction
  /// ProxyPut GPU->GPU across nodes (PCIe + NIC + fabric), per GPU per direction, while no other GPU of the
  /// node shares its NICs (nodeNetworkAloneGBs): sharing is the topology's (rankNetworkShares).
  LinkCost network;
  TransportModel transport;           ///< the NICs' transport: per-message overhead, latency, efficiency by size
  LinkCost local;                     ///< Copy inside one GPU
  double reduceGBs = 0;               ///< Reduce throughput (output bytes/s) of one lane
  std::vector<RampPoint> reduceRamp;  ///< reduceGBs by size (LinkCost::ramp, not capped: L2); empty = flat
  double flagUs = 0;                  ///< Signal -> Wait visibility across NVLink (another GPU of the node)
  double localFlagUs = 0;             ///< Signal -> Wait visibility between lanes of one GPU (GPU-scope flag)
  double dispatchUs = 0;              ///< op enqueue -> first step on the GPU
  /// Extra per-op cost of an op in which some rank's step reads or writes another rank's user buffers
  /// (peersTouchUserBuffers): the engine then completes it only once every rank is done and guards peers'
  /// accesses with an entry handshake, where an op whose peers write only scratch completes on local
  /// completion (kProgLocalCompletion). Charged once at the op's end. 0 = not distinguished.
  double peerUserUs = 0;
  /// Time a lane spends issuing one NVLink Put before its next step (plus the bytes at the lane's bandwidth),
  /// when it is less than nvlink.alphaUs: the rest of alpha (visibility at the peer) then overlaps the
  /// lane's next steps, and only the Put's signal waits for it. 0 (or >= alpha) = not distinguished: the lane
  /// is busy for the whole alpha. The closed forms do not use it (they charge alpha per put: pessimistic
  /// for chunked ops when it is set).
  double putIssueUs = 0;
  /// Extra visibility latency of an NVLink Put that lands in a peer's user buffer (input / output) over one
  /// that lands in its scratch (nvlink.alphaUs), per Put: measured as the per-message difference between the
  /// both-ways put patterns into the peers' user buffers and into their scratch. 0 = not distinguished.
  /// The closed forms charge it on every NVLink message of a generator whose peers touch user buffers.
  double userPutUs = 0;
  /// The least time a Wait step keeps its lane, even when its flag is already set: the poll that finds it, the
  /// acquire fence and the lane's hand-off to its next step (mk::waitEndUs). An unmet Wait ends when the flag is
  /// visible (nvlink.alphaUs, flagUs, ... are measured up to the waiting lane's next step, so they contain this
  /// part); a met one ends waitUs after it started. 0 = not distinguished (a met Wait costs nothing).
  double waitUs = 0;
  double proxyUs = 0;  ///< extra per ProxyPut for the FIFO + host proxy
  /// The serial part of proxyUs, when it is set and below proxyUs: the proxy thread's work per message (posting
  /// the work request), which a lane pays before the next message; the rest of proxyUs (the FIFO record
  /// becoming visible to the proxy) overlaps later messages like the network's latency (proxyIssueUs,
  /// proxyLatencyUs). 0 (or >= proxyUs) = not distinguished: the whole proxyUs is serial.
  double proxyPostUs = 0;
  double gemmTflops = 0;  ///< achieved bf16 GEMM rate per GPU (all of its SMs)
  /// Achieved bf16 attention-forward rate per GPU (all of its SMs), TFLOP/s of the attention FLOPs (4 B Hq D per
  /// unmasked query-key pair): what Attention and AttentionGrad steps run at. A profile file without it (written
  /// before it existed) reads gemmTflops, which priced them until then; defaultProfile gives gemmTflops too.
  double attentionTflops = 0;
  /// SMs per GPU (a resident compute kernel holds one CTA per SM). On a rank that runs Gemm steps the lanes
  /// share them in proportion to their Lane::ctas, and each lane's rates follow its share (timeline rule 2b,
  /// docs/cost-model.md). 0 = not distinguished: every lane of such a rank runs as on a communication-only rank.
  uint32_t sms = 0;
  /// What one CTA moves through a Copy, Reduce or Put on a rank that runs Gemm steps (rule 2b), GB/s. 0 = not
  /// distinguished (the lane's data steps are not limited by its CTAs).
  double ctaGBs = 0;
  /// Packet protocols (NCCL's LL and LL128) of the layered baseline; not calibrated: NCCL's documented design.
  ProtocolCost ll{0.6, 0.5};
  ProtocolCost ll128{1.9, 120.0 / 128.0};
  /// NCCL's Simple protocol: a plain Put then its flag. The nccl-* algorithms price their plain Puts with its
  /// latency in place of nvlink.alphaUs (layeredProfile); its bytes go at the link's rate (bwFraction not read).
  ProtocolCost simple{3.4, 1.0};
  LayeredCosts nccl;  ///< per-op costs of the layered library (nccl-* algorithms)
};

/// reduceGBs * rampFraction(reduceRamp, bytes): what a Reduce writing `bytes` runs at.
double reduceRate(const Profile& p, double bytes) noexcept;

/// Datasheet defaults for the topology's GPU and links.
Profile defaultProfile(const Topology& t);

/// Closed-form prediction for one schedule shape.
struct CostEstimate {
  double totalUs = 0;
  double latencyUs = 0;    ///< sum of alpha terms (dispatch, per-message, flags, proxy)
  double bandwidthUs = 0;  ///< sum of beta terms (bytes / bandwidth on the critical path)
  double reduceUs = 0;     ///< gamma terms
  std::string formula;     ///< the instantiated formula, for humans
};

/// Start and end of one step in a timeline (microseconds from op submission).
struct StepTime {
  uint32_t rank = 0, lane = 0, step = 0;
  double startUs = 0, endUs = 0;
};

/// The schedule's timeline with no contention beyond a static fair share: every step costs its alpha-beta
/// price from `profile`, a lane's transfers run at bandwidth / (number of lanes of that rank using the same
/// link class), a Wait ends when the threshold-th increment is visible, and every lane starts at
/// `profile.dispatchUs`. Exact rules: docs/cost-model.md. This is the reference the per-generator closed
/// forms are tested against, and the no-contention limit the simulator must reproduce.
struct Timeline {
  double totalUs = 0;
  std::vector<StepTime> steps;  ///< in (rank, lane, step) order
};
/// Throws Error(Deadlock) if the schedule cannot complete. Without a topology every ProxyPut gets the whole
/// network.bwGBs; with one, a rank's ProxyPuts get its rankNetworkShares() fraction of it, the ranks that issue
/// ProxyPuts counted as sending at once (the static share of rule 2 extended to the NICs of a node).
Timeline simulateUncontended(const Schedule& s, const Profile& profile);
Timeline simulateUncontended(const Schedule& s, const Profile& profile, const Topology& topo);

/// nccl-tests bus-bandwidth factor for `op` on n ranks (allreduce 2(n-1)/n, allgather/reducescatter/alltoall
/// (n-1)/n, broadcast 1).
double busBwFactor(CollOp op, uint32_t nRanks) noexcept;
/// Bytes nccl-tests calls the op's "size" (the larger of the input and output buffer of one rank).
uint64_t opBytes(const CollectiveSpec& spec, uint32_t nRanks) noexcept;

}  // namespace mk
