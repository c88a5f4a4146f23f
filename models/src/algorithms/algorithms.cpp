#include "mk/algorithms/algorithms.hpp"

#include <algorithm>
#include <string>
#include <tuple>

#include "builder.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

const char* toString(CollOp op) noexcept {
  switch (op) {
    case CollOp::AllReduce: return "allreduce";
    case CollOp::AllGather: return "allgather";
    case CollOp::ReduceScatter: return "reducescatter";
    case CollOp::Broadcast: return "broadcast";
    case CollOp::AllToAll: return "alltoall";
  }
  return "?";
}

std::optional<CollOp> parseCollOp(std::string_view s) noexcept {
  for (CollOp op : {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter, CollOp::Broadcast, CollOp::AllToAll})
    if (s == toString(op)) return op;
  if (s == "all-reduce" || s == "all_reduce") return CollOp::AllReduce;
  if (s == "all-gather" || s == "all_gather") return CollOp::AllGather;
  if (s == "reduce-scatter" || s == "reduce_scatter") return CollOp::ReduceScatter;
  if (s == "bcast") return CollOp::Broadcast;
  if (s == "all-to-all" || s == "all_to_all" || s == "a2a") return CollOp::AllToAll;
  return std::nullopt;
}

CollOp requireCollOp(std::string_view s, std::string_view what) {
  if (const auto op = parseCollOp(s)) return *op;
  throw Error(ErrorCode::InvalidArgument, "unknown " + std::string(what) + " '" + std::string(s) +
                                              "' (expected allreduce, allgather, reducescatter, broadcast, alltoall)");
}

const char* toString(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::OneShot: return "one-shot";
    case Algorithm::TwoShot: return "two-shot";
    case Algorithm::Ring: return "ring";
    case Algorithm::Hierarchical: return "hierarchical";
    case Algorithm::Direct: return "direct";
    case Algorithm::NcclRing: return "nccl-ring";
    case Algorithm::NcclTree: return "nccl-tree";
    case Algorithm::NcclP2p: return "nccl-p2p";
  }
  return "?";
}

std::optional<Algorithm> parseAlgorithm(std::string_view s) noexcept {
  for (Algorithm a : {Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ring, Algorithm::Hierarchical,
                      Algorithm::Direct, Algorithm::NcclRing, Algorithm::NcclTree, Algorithm::NcclP2p})
    if (s == toString(a)) return a;
  return std::nullopt;
}

const char* toString(Protocol p) noexcept {
  switch (p) {
    case Protocol::Auto: return "auto";
    case Protocol::Simple: return "simple";
    case Protocol::LL: return "ll";
    case Protocol::LL128: return "ll128";
  }
  return "?";
}

std::optional<Protocol> parseProtocol(std::string_view s) noexcept {
  for (Protocol p : {Protocol::Auto, Protocol::Simple, Protocol::LL, Protocol::LL128})
    if (s == toString(p)) return p;
  return std::nullopt;
}

const char* toString(InterPhase p) noexcept {
  switch (p) {
    case InterPhase::Auto: return "auto";
    case InterPhase::Ring: return "ring";
    case InterPhase::Rhd: return "rhd";
    case InterPhase::Bruck: return "bruck";
    case InterPhase::BruckHalf: return "bruck-half";
  }
  return "?";
}

std::optional<InterPhase> parseInterPhase(std::string_view s) noexcept {
  for (InterPhase p : {InterPhase::Auto, InterPhase::Ring, InterPhase::Rhd, InterPhase::Bruck, InterPhase::BruckHalf})
    if (s == toString(p)) return p;
  return std::nullopt;
}

namespace {
auto fields(const CollectiveSpec& s) noexcept { return std::tie(s.op, s.algo, s.dtype, s.redop, s.count, s.root); }
auto fields(const GenOptions& g) noexcept { return std::tie(g.chunks, g.channels, g.inter, g.protocol); }

/// The one spelling of "no generator of that name for this op", listing the ones that exist.
[[noreturn]] void throwUnknownAlgorithm(CollOp op, std::string_view name) {
  std::string list;
  for (Algorithm a : algorithmsFor(op)) list += (list.empty() ? "" : ", ") + std::string(toString(a));
  throw Error(ErrorCode::NotFound,
              "unknown algorithm '" + std::string(name) + "' for " + toString(op) + " (expected " + list + ")");
}
}  // namespace

bool operator==(const CollectiveSpec& a, const CollectiveSpec& b) noexcept { return fields(a) == fields(b); }
bool operator!=(const CollectiveSpec& a, const CollectiveSpec& b) noexcept { return !(a == b); }
bool operator<(const CollectiveSpec& a, const CollectiveSpec& b) noexcept { return fields(a) < fields(b); }
bool operator==(const GenOptions& a, const GenOptions& b) noexcept { return fields(a) == fields(b); }
bool operator!=(const GenOptions& a, const GenOptions& b) noexcept { return !(a == b); }
bool operator<(const GenOptions& a, const GenOptions& b) noexcept { return fields(a) < fields(b); }

Algorithm requireAlgorithm(CollOp op, std::string_view s) {
  const auto a = parseAlgorithm(s);
  if (!a) throwUnknownAlgorithm(op, s);
  (void)detail::findAlgorithm(op, *a);
  return *a;
}

namespace detail {
const std::vector<AlgorithmDef>& algorithmRegistry() {
  static const std::vector<AlgorithmDef> all = {
      allReduceOneShot(),    allReduceTwoShot(),          allReduceRing(),         allReduceHierarchical(),
      allGatherRing(),       allGatherDirect(),           allGatherHierarchical(), reduceScatterRing(),
      reduceScatterDirect(), reduceScatterHierarchical(), broadcastDirect(),       broadcastRing(),
      allToAllDirect(),
  };
  return all;
}

const AlgorithmDef& findAlgorithm(CollOp op, Algorithm algo) {
  const char* name = toString(algo);
  for (const auto* registry : {&algorithmRegistry(), &layeredRegistry()})
    for (const auto& d : *registry)
      if (d.op == op && std::string_view(name) == d.name) return d;
  throwUnknownAlgorithm(op, name);
}
}  // namespace detail

std::vector<Algorithm> algorithmsFor(CollOp op) {
  std::vector<Algorithm> algos;
  for (const auto& d : detail::algorithmRegistry()) {
    if (d.op != op) continue;
    const auto a = parseAlgorithm(d.name);
    if (!a) throw Error(ErrorCode::Internal, std::string("generator '") + d.name + "' has no Algorithm value");
    algos.push_back(*a);
  }
  return algos;
}

uint64_t inputCount(const CollectiveSpec& spec, uint32_t nRanks) noexcept {
  switch (spec.op) {
    case CollOp::ReduceScatter:
    case CollOp::AllToAll: return spec.count * nRanks;
    default: return spec.count;
  }
}

uint64_t outputCount(const CollectiveSpec& spec, uint32_t nRanks) noexcept {
  switch (spec.op) {
    case CollOp::AllGather:
    case CollOp::AllToAll: return spec.count * nRanks;
    default: return spec.count;
  }
}

InterPhase resolveInter(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                        const Profile& profile) {
  detail::checkInterPhase(opt.inter);
  if (opt.inter != InterPhase::Auto) return opt.inter;
  if (spec.op != CollOp::AllReduce || spec.algo != Algorithm::Hierarchical) return InterPhase::Ring;
  GenOptions candidate = opt;
  candidate.inter = InterPhase::Ring;
  const detail::GenContext ctx = detail::makeContext(spec, nodeOf, candidate);
  if (ctx.nNodes() < 2) return InterPhase::Ring;  // no network phase: the variants are the same schedule
  // The closed forms of the hierarchical generator read the placement and the profile, not the topology.
  static const Topology kNoTopology{};
  const auto& def = detail::findAlgorithm(spec.op, spec.algo);
  InterPhase best = InterPhase::Ring;
  double tBest = 0;
  const uint32_t nodes = ctx.nNodes();
  for (InterPhase p : {InterPhase::Ring, InterPhase::Rhd, InterPhase::Bruck, InterPhase::BruckHalf}) {
    // rhd on a node count that is not a power of two folds the extra nodes into hosts, whose NICs then receive
    // the fold and their exchange partners' halves at once: the closed forms see no contention, and rhd's
    // undercuts the SimGrid replay by 1.1-1.4x there (docs/results.md), so it is no candidate. Ring and bruck
    // keep every NIC receiving from one partner at a time (replay = closed form).
    if (p == InterPhase::Rhd && (nodes & (nodes - 1)) != 0) continue;
    candidate.inter = p;
    detail::GenContext c = ctx;
    c.opt.inter = p;
    const double t = def.cost(detail::CostContext{spec, candidate, kNoTopology, c, profile}).totalUs;
    if (p == InterPhase::Ring || t < tBest) {
      best = p;
      tBest = t;
    }
  }
  return best;
}

namespace detail {

/// `opt` with "auto" resolved as generate() resolves it without a caller's profile.
GenOptions resolvedForGenerate(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf,
                               const GenOptions& optIn) {
  // "auto" without a caller's profile: the datasheet DGX-H100 profile decides (tools resolve it themselves).
  GenOptions opt = optIn;
  if (opt.inter == InterPhase::Auto && spec.op == CollOp::AllReduce && spec.algo == Algorithm::Hierarchical) {
    static const Profile kReference = defaultProfile(topologyPreset("dgx-h100", 2));
    opt.inter = resolveInter(spec, nodeOf, opt, kReference);
  }
  if (opt.protocol == Protocol::Auto && isLayered(spec.algo)) {
    static const Profile kReference = defaultProfile(topologyPreset("dgx-h100", 2));
    opt.protocol = resolveProtocol(spec, nodeOf, opt, kReference);
  }
  return opt;
}

/// The one body of generate() and countCollective(): declare the buffers, emit every channel into `b`.
void emitCollective(ScheduleBuilder& b, GenContext& ctx, const AlgorithmDef& def) {
  const CollectiveSpec& spec = ctx.spec;
  ctx.input = b.addBuffer("input", spec.dtype, BufferKind::Input, inputCount(spec, ctx.nRanks));
  ctx.output = b.addBuffer("output", spec.dtype, BufferKind::Output, outputCount(spec, ctx.nRanks));
  if (def.setup) def.setup(b, ctx);
  // Channels own disjoint slices of every block; a channel with an empty slice emits nothing.
  const uint32_t channels = static_cast<uint32_t>(std::min<uint64_t>(ctx.opt.channels, spec.count));
  for (uint32_t c = 0; c < channels; ++c)
    def.emit(b, ctx, c, detail::splitRange(detail::Range{0, spec.count}, channels, c));
}

}  // namespace detail

Schedule generate(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& optIn) {
  const auto& def = detail::findAlgorithm(spec.op, spec.algo);
  detail::GenContext ctx = detail::makeContext(spec, nodeOf, detail::resolvedForGenerate(spec, nodeOf, optIn));
  detail::ScheduleBuilder b(ctx);
  detail::emitCollective(b, ctx, def);
  return b.finish();
}

CostEstimate closedForm(const CollectiveSpec& spec, const GenOptions& opt, const Topology& topo, uint32_t nRanks,
                        const Profile& profile) {
  const detail::AlgorithmDef& d = detail::findAlgorithm(spec.op, spec.algo);
  if (!d.cost)
    throw Error(ErrorCode::Unsupported, std::string("algorithm '") + d.name + "' for " + toString(spec.op) +
                                            " has no closed-form cost model (use simulateUncontended on its schedule)");
  // "auto" is the cheaper inter-node variant under this profile (resolveInter), priced as that variant.
  const std::vector<uint32_t> nodeOf = topo.layout(nRanks);
  GenOptions resolved = opt;
  resolved.inter = resolveInter(spec, nodeOf, opt, profile);
  resolved.protocol = resolveProtocol(spec, nodeOf, opt, profile);
  const detail::GenContext ctx = detail::makeContext(spec, nodeOf, resolved);
  // Profile::userPutUs: the closed forms have one NVLink alpha per generator, so a generator whose peers write
  // user buffers pays it on every NVLink message (the timeline charges it per Put by destination).
  Profile pf = profile;
  if (pf.userPutUs > 0 && d.peersTouchUser) pf.nvlink.alphaUs += pf.userPutUs;
  CostEstimate e = d.cost(detail::CostContext{spec, resolved, topo, ctx, pf});
  // The op-level term of the timeline (Profile::peerUserUs), from the generator's declared property (a test
  // checks it against peersTouchUserBuffers on the generated schedules).
  if (profile.peerUserUs > 0 && nRanks > 1 && d.peersTouchUser) {
    e.totalUs += profile.peerUserUs;
    e.latencyUs += profile.peerUserUs;
    e.formula += " + U";
  }
  return e;
}

}  // namespace mk
