// mkernel — internal: the toolkit every generator uses to emit a Schedule.
//
// Generators are written as "for each rank, append these steps to this lane". The builder picks the
// step kind that matches the ranks' placement (Put inside a node, ProxyPut across nodes), counts the
// signals sent to every flag so a generator can ask for the right Wait threshold, and keeps lanes per
// (rank, role, channel) so channels never share a lane.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::detail {

/// A half-open element range [begin, begin + size).
struct Range {
  uint64_t begin = 0;
  uint64_t size = 0;
  uint64_t end() const noexcept { return begin + size; }
};

/// Piece `i` of `parts` near-equal pieces of `r`: the first (r.size % parts) pieces get one extra element.
Range splitRange(Range r, uint32_t parts, uint32_t i) noexcept;

/// Placement facts every generator needs, derived once from nodeOf.
struct GenContext {
  CollectiveSpec spec;
  GenOptions opt;
  uint32_t nRanks = 0;
  std::vector<uint32_t> nodeOf;                  ///< rank -> node (dense node ids 0..nNodes-1, in first-seen order)
  std::vector<std::vector<uint32_t>> nodeRanks;  ///< node -> its ranks, ascending
  std::vector<uint32_t> localIndex;              ///< rank -> index within its node
  uint32_t maxLocal = 0;                         ///< largest node size
  uint16_t input = 0, output = 0;                ///< buffer ids
  int scratch = -1;                              ///< buffer id, or -1 when the algorithm has none
  uint8_t putFlags = 0;  ///< protocol bits every Put / ProxyPut gets (kStepLL, kStepLL128; set by nccl-* setups)
  /// The rings run NCCL's rail orders (ringOrder): each channel enters and leaves every node by a GPU of its
  /// own, so the channels' traffic across nodes spreads over the NICs (set by nccl-ring where railRingsApply).
  bool railRings = false;
  uint32_t nNodes() const noexcept { return static_cast<uint32_t>(nodeRanks.size()); }
  /// Ranks on node `node`.
  uint32_t nodeSize(uint32_t node) const noexcept { return static_cast<uint32_t>(nodeRanks[node].size()); }
  bool sameNode(uint32_t a, uint32_t b) const noexcept { return nodeOf[a] == nodeOf[b]; }
};

/// Whether NCCL's rail orders apply to the rings of `ctx`: several equal nodes, ranks node-major (rank r the
/// local GPU r % G of node r / G), so that every ring order visits the nodes in turn as the rank-order ring does.
bool railRingsApply(const GenContext& ctx);
/// The ranks of channel `channel`'s ring in ring order (position i sends to position i + 1): rank order unless
/// ctx.railRings; then node after node, node k's local GPUs from (channel - k) mod G on, so that node k leaves
/// by local GPU (channel - k - 1) mod G to the same local GPU of node k + 1 (one rail, as NCCL's rings leave
/// and enter a node on one NIC), and the channels leave every node by different GPUs (their NICs).
std::vector<uint32_t> ringOrder(const GenContext& ctx, uint32_t channel);
/// Most channels of `channels` that leave a node by one GPU under ctx.railRings (ceil(channels / G)); `channels`
/// otherwise: the lanes of a rank that share its network rate in a ring.
double ringNetworkLanes(const GenContext& ctx, double channels);
/// Most channels of `channels` whose ring hop from one rank stays on its node under ctx.railRings (channels -
/// floor(channels / G): every rank leaves its node in floor(channels / G) of them or more); `channels` otherwise.
double ringNvlinkLanes(const GenContext& ctx, double channels);

/// Appends steps; finish() produces the Schedule with cost attributes filled.
class ScheduleBuilder {
 public:
  explicit ScheduleBuilder(const GenContext& ctx);
  /// A builder that counts instead of storing: every step is counted and dropped, so a generator run through it
  /// tells how many steps (and which lanes and buffers) its schedule will hold, in little memory. Once steps +
  /// lanes x `laneWeight` pass `maxWeight` it throws StepLimitReached, so an absurd request stops early (lanes
  /// weigh in because a request for millions of channels creates lanes faster than steps).
  ScheduleBuilder(const GenContext& ctx, uint64_t maxWeight, uint64_t laneWeight);

  /// Declare a buffer with the same element count on every rank; returns its id.
  uint16_t addBuffer(const std::string& name, DType dtype, BufferKind kind, uint64_t countPerRank);
  /// Declare a buffer whose element count differs per rank (`countOfRank` has one entry per rank).
  uint16_t addBuffer(const std::string& name, DType dtype, BufferKind kind, std::vector<uint64_t> countOfRank);
  /// A fresh flag id (valid on every rank).
  uint32_t newFlag();
  /// `n` fresh flag ids.
  std::vector<uint32_t> newFlags(std::size_t n);
  /// Index of the lane of `rank` with `role` on `channel`, created on first use.
  uint32_t lane(uint32_t rank, LaneRole role, uint32_t channel = 0);
  /// Reserve room for `steps` more steps on an existing lane: a generator that knows its step count avoids
  /// growing the vector by doubling (which at 1024 ranks can leave up to half of the step memory unused).
  void reserveSteps(uint32_t rank, uint32_t lane, std::size_t steps);

  /// dst <- src, executed by `rank` (either side may be an NVLink peer of `rank`).
  void copy(uint32_t rank, uint32_t lane, BufRef dst, BufRef src, uint64_t count);
  /// dst <- op(a, b) with the spec's reduction operator.
  void reduce(uint32_t rank, uint32_t lane, BufRef dst, BufRef a, BufRef b, uint64_t count);
  /// Write `count` elements from local `src` into `dst` on dst.rank: a Put inside a node, a ProxyPut across
  /// nodes; if `signalFlag` is set, flag (dst.rank, *signalFlag) += 1 once the data has landed. With
  /// count == 0 it is a pure signal (a Signal step inside a node, a zero-byte ProxyPut across nodes).
  void put(uint32_t rank, uint32_t lane, BufRef dst, BufRef src, uint64_t count, std::optional<uint32_t> signalFlag);
  /// flag (target, flagId) += inc.
  void signal(uint32_t rank, uint32_t lane, uint32_t target, uint32_t flagId, uint64_t inc = 1);
  /// C [+]= A x B on `rank`'s own memory: a Gemm step of `shape` (`flags`: kStepAccumulate, kStepBColMajor).
  /// Equal shapes share one entry of Schedule::gemms.
  void gemm(uint32_t rank, uint32_t lane, const GemmShape& shape, BufRef c, BufRef a, BufRef b, uint8_t flags = 0);
  /// Wait until own flag `flagId` >= threshold.
  void wait(uint32_t rank, uint32_t lane, uint32_t flagId, uint64_t threshold);
  /// Wait until own flag `flagId` has seen every signal emitted to it so far; no step if none were.
  void waitAllSent(uint32_t rank, uint32_t lane, uint32_t flagId);

  /// Total increments emitted so far to (rank, flagId).
  uint64_t signalsSent(uint32_t rank, uint32_t flagId) const;

  /// Close the schedule: fill its cost attributes (fillCostAttributes). The builder is spent afterwards.
  Schedule finish();

  /// A counting builder's steps so far.
  uint64_t stepsCounted() const noexcept { return counted_; }
  /// The schedule as built so far: buffers and lanes (a counting builder's lanes hold no steps).
  const Schedule& partial() const noexcept { return s_; }

 private:
  Step& append(uint32_t rank, uint32_t lane, StepKind kind);
  void countSignal(uint32_t rank, uint32_t flagId, uint64_t inc);
  /// A new lane (role, key) of `rank`: lane()'s miss path.
  uint32_t addLane(uint32_t rank, LaneRole role, uint64_t key);

  const GenContext& ctx_;
  Schedule s_;
  bool counting_ = false;
  uint64_t maxWeight_ = 0;
  uint64_t laneWeight_ = 0;
  uint64_t weight_ = 0;  ///< steps + lanes x laneWeight_ so far (counting builder)
  uint64_t counted_ = 0;
  Step dropped_;  ///< where a counting builder's steps are written and forgotten
  // Flat per-rank tables: lane() and countSignal() run once per emitted step, so a std::map lookup there
  // dominated generation at 1024 ranks. A rank has a handful of lanes (a few per channel), so a linear scan
  // beats any tree or hash.
  std::vector<std::vector<std::pair<uint64_t, uint32_t>>> laneIndex_;  ///< per rank: (role << 32 | channel, lane)
  /// Above this many lanes on a rank, lookups go through laneHash_ (many channels) instead of a scan.
  static constexpr std::size_t kLaneScanMax = 32;
  std::vector<std::unordered_map<uint64_t, uint32_t>> laneHash_;  ///< per rank, filled past kLaneScanMax lanes
  std::vector<std::vector<uint64_t>> sent_;                       ///< per rank: increments so far, indexed by flag id
  std::map<std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>, uint32_t> gemmIndex_;
};

/// Thrown by a counting builder past its step limit.
struct StepLimitReached {};

/// The "scratch" buffer's id; throws Error(Internal) when the generator's setup declared none.
uint16_t scratchBuffer(const GenContext& ctx);

/// Most shards one rank owns when a node's maxLocal shards (rails) are dealt round-robin over its ranks:
/// ceil(maxLocal / smallest node size).
uint32_t maxOwnedShards(const GenContext& ctx);

/// Closed-form inputs (the generator's view of the cluster).
struct CostContext {
  const CollectiveSpec& spec;
  const GenOptions& opt;
  const Topology& topo;
  const GenContext& gen;  ///< placement of the ranks
  const Profile& profile;
};

/// One generator: its name, how to emit one channel, its closed form.
struct AlgorithmDef {
  CollOp op;
  const char* name;
  const char* summary;  ///< one line for --help and docs
  /// Declare scratch buffers (may be null). Called once, after input and output exist.
  void (*setup)(ScheduleBuilder& b, GenContext& ctx);
  /// Emit the steps of `channel`, which owns elements `part` of every block (see the count conventions).
  void (*emit)(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part);
  /// Closed-form cost of the whole schedule (all channels).
  CostEstimate (*cost)(const CostContext& c);
  /// Whether its schedules (on more than one rank) let a rank's steps touch another rank's user buffers
  /// (peersTouchUserBuffers): the closed form then adds Profile::peerUserUs, as the timeline does.
  bool peersTouchUser = true;
};

/// Every generator, in the order algorithmsFor() lists them (all-reduce first); defined in algorithms.cpp.
const std::vector<AlgorithmDef>& algorithmRegistry();
/// The layered (nccl-*) generators, in the order layeredAlgorithmsFor() lists them; defined in nccl_policy.cpp.
const std::vector<AlgorithmDef>& layeredRegistry();
/// The layered generators' definitions (nccl_ring.cpp, nccl_tree.cpp).
AlgorithmDef ncclRing(CollOp op);
AlgorithmDef ncclTree();
AlgorithmDef ncclP2p(CollOp op);  ///< all-to-all and broadcast (nccl_p2p.cpp)
/// The closed form of layered generator `name` that emits `base`'s steps: `base`'s closed form under
/// layeredProfile() and the protocol's put price, on the rail rings where `railRings` and they apply (nccl_ring.cpp).
CostEstimate costLayered(const AlgorithmDef& base, const char* name, const CostContext& c, bool railRings);
/// Each generator's definition, from the file of the same name (allreduce_one_shot.cpp, ...).
AlgorithmDef allReduceOneShot();
AlgorithmDef allReduceTwoShot();
AlgorithmDef allReduceRing();
AlgorithmDef allReduceHierarchical();  ///< both inter-node variants (ring and rhd)
AlgorithmDef allGatherRing();
AlgorithmDef allGatherDirect();
AlgorithmDef allGatherHierarchical();
AlgorithmDef reduceScatterRing();
AlgorithmDef reduceScatterDirect();
AlgorithmDef reduceScatterHierarchical();
AlgorithmDef broadcastDirect();
AlgorithmDef broadcastRing();
AlgorithmDef allToAllDirect();

/// The generator of `algo` for `op` (the entry whose name is toString(algo)); throws Error(NotFound) listing
/// the known ones.
const AlgorithmDef& findAlgorithm(CollOp op, Algorithm algo);

/// Throws Error(InvalidArgument) unless `inter` is one of the InterPhase values (a cast from a wider integer may
/// hold any).
void checkInterPhase(InterPhase inter);
/// Placement facts for nodeOf (node ids renumbered densely in first-seen order); throws InvalidArgument.
GenContext makeContext(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt);
/// `opt` with "auto" (inter-node phase, protocol) resolved as generate() resolves it (algorithms.cpp).
GenOptions resolvedForGenerate(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt);
/// generate()'s body: declare the buffers of `ctx` (input, output, the generator's scratch) and emit every channel
/// (algorithms.cpp); run with a counting builder it counts what generate() would store.
void emitCollective(ScheduleBuilder& b, GenContext& ctx, const AlgorithmDef& def);

}  // namespace mk::detail
