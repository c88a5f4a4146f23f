#include "mk/algorithms/algorithms.hpp"

#include <sstream>

#include "builder.hpp"
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

namespace detail {
const std::vector<AlgorithmDef>& algorithmRegistry() {
  static const std::vector<AlgorithmDef> all = {
      allReduceOneShot(),   allReduceTwoShot(),     allReduceRing(),       allReduceHierarchical(),
      allGatherRing(),      allGatherDirect(),      allGatherHierarchical(),
      reduceScatterRing(),  reduceScatterDirect(),  reduceScatterHierarchical(),
      broadcastDirect(),    broadcastRing(),
      allToAllDirect(),
  };
  return all;
}

const AlgorithmDef& findAlgorithm(CollOp op, const std::string& name) {
  for (const auto& d : algorithmRegistry())
    if (d.op == op && name == d.name) return d;
  std::ostringstream msg;
  msg << "unknown algorithm '" << name << "' for " << toString(op) << " (known:";
  for (const auto& a : algorithmsFor(op)) msg << ' ' << a;
  msg << ')';
  throw Error(ErrorCode::NotFound, msg.str());
}
}  // namespace detail

std::vector<std::string> algorithmsFor(CollOp op) {
  std::vector<std::string> names;
  for (const auto& d : detail::algorithmRegistry())
    if (d.op == op) names.emplace_back(d.name);
  return names;
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

std::string resolveInter(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                         const Profile& profile) {
  if (opt.inter != "ring" && opt.inter != "rhd" && opt.inter != "auto")
    throw Error(ErrorCode::InvalidArgument, "inter must be ring, rhd or auto (got '" + opt.inter + "')");
  if (opt.inter != "auto") return opt.inter;
  if (spec.op != CollOp::AllReduce || spec.algo != "hierarchical") return "ring";
  GenOptions ring = opt, rhd = opt;
  ring.inter = "ring";
  rhd.inter = "rhd";
  const detail::GenContext ctxRing = detail::makeContext(spec, nodeOf, ring);
  if (ctxRing.nNodes() < 2) return "ring";  // no network phase: the variants are the same schedule
  const detail::GenContext ctxRhd = detail::makeContext(spec, nodeOf, rhd);
  // The closed forms of the hierarchical generator read the placement and the profile, not the topology.
  static const Topology kNoTopology{};
  const auto& def = detail::findAlgorithm(spec.op, spec.algo);
  const double tRing = def.cost(detail::CostContext{spec, ring, kNoTopology, ctxRing, profile}).totalUs;
  const double tRhd = def.cost(detail::CostContext{spec, rhd, kNoTopology, ctxRhd, profile}).totalUs;
  return tRhd < tRing ? "rhd" : "ring";
}

Schedule generate(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& optIn) {
  const auto& def = detail::findAlgorithm(spec.op, spec.algo);
  // "auto" without a caller's profile: the datasheet DGX-H100 profile decides (tools resolve it themselves).
  GenOptions opt = optIn;
  if (opt.inter == "auto" && spec.op == CollOp::AllReduce && spec.algo == "hierarchical") {
    static const Profile kReference = defaultProfile(topologyPreset("dgx-h100", 2));
    opt.inter = resolveInter(spec, nodeOf, opt, kReference);
  }
  detail::GenContext ctx = detail::makeContext(spec, nodeOf, opt);
  detail::ScheduleBuilder b(ctx);
  ctx.input = b.addBuffer("input", spec.dtype, BufferKind::Input, inputCount(spec, ctx.nRanks));
  ctx.output = b.addBuffer("output", spec.dtype, BufferKind::Output, outputCount(spec, ctx.nRanks));
  if (def.setup) def.setup(b, ctx);
  // Channels own disjoint slices of every block; a channel with an empty slice emits nothing.
  const uint32_t channels = static_cast<uint32_t>(std::min<uint64_t>(opt.channels, spec.count));
  for (uint32_t c = 0; c < channels; ++c)
    def.emit(b, ctx, c, detail::splitRange(detail::Range{0, spec.count}, channels, c));
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
