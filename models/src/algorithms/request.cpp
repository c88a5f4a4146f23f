#include "mk/algorithms/request.hpp"

#include "mk/algorithms/nccl.hpp"

#include <algorithm>
#include <tuple>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"

namespace mk {
namespace {
bool perRankBlock(CollOp op) noexcept {
  return op == CollOp::AllGather || op == CollOp::ReduceScatter || op == CollOp::AllToAll;
}
}  // namespace

uint64_t countForBytes(CollOp op, uint64_t bytes, DType dtype, uint32_t nRanks) noexcept {
  const uint64_t elems = bytes / dtypeSize(dtype);
  return perRankBlock(op) ? (nRanks ? elems / nRanks : 0) : elems;
}

uint64_t minBytesFor(CollOp op, DType dtype, uint32_t nRanks) noexcept {
  return dtypeSize(dtype) * (perRankBlock(op) ? nRanks : 1);
}

uint64_t requireCountForBytes(CollOp op, uint64_t bytes, DType dtype, uint32_t nRanks) {
  const uint64_t count = countForBytes(op, bytes, dtype, nRanks);
  if (count == 0)
    throw Error(ErrorCode::InvalidArgument, "--bytes " + std::to_string(bytes) + " holds less than one " +
                                                toString(dtype) + " element per rank (need at least " +
                                                std::to_string(minBytesFor(op, dtype, nRanks)) + " bytes)");
  return count;
}

namespace {

bool named(const CollectiveArgs& a, const char* option) {
  return std::find(a.given.begin(), a.given.end(), option) != a.given.end();
}

}  // namespace

CollectiveRequest parseCollective(const CollectiveArgs& a) {
  for (const char* option :
       {"--m", "--n", "--k", "--tile-rows", "--order", "--ctas", "--comm-ctas", "--compute-lanes", "--layout-b"})
    if (named(a, option))
      throw Error(ErrorCode::InvalidArgument, std::string(option) +
                                                  " applies to the fused ops (gemm-rs, ag-gemm, gemm-ar), not to " +
                                                  (parseCollOp(a.op) ? toString(*parseCollOp(a.op)) : a.op));
  CollectiveRequest r;
  r.spec.op = requireCollOp(a.op, "--op");
  r.spec.dtype = requireDType(a.dtype, "--dtype");
  r.spec.redop = requireRedOp(a.redop, "--redop");
  r.spec.root = a.root;
  r.ncclAuto = a.algo == "nccl";
  if (a.algo != "auto" && !r.ncclAuto) {
    r.algo = requireAlgorithm(r.spec.op, a.algo);
    r.spec.algo = *r.algo;
  }
  const auto inter = parseInterPhase(a.inter);
  if (!inter)
    throw Error(ErrorCode::InvalidArgument, "unknown --inter '" + a.inter + "' (expected ring, rhd, bruck, auto)");
  r.gen.inter = *inter;
  const auto protocol = parseProtocol(a.protocol);
  if (!protocol)
    throw Error(ErrorCode::InvalidArgument,
                "unknown --protocol '" + a.protocol + "' (expected simple, ll, ll128, auto)");
  if (*protocol != Protocol::Auto && !(r.ncclAuto || (r.algo && isLayered(*r.algo))))
    throw Error(ErrorCode::InvalidArgument,
                "--protocol applies to the layered algorithms (--algo nccl, nccl-ring, nccl-tree, nccl-p2p)");
  if (*protocol != Protocol::Auto && r.algo && !layeredRuns(*r.algo, *protocol))
    throw Error(ErrorCode::InvalidArgument, std::string("--protocol ") + toString(*protocol) + " does not apply to " +
                                                toString(*r.algo) + " (NCCL's p2p runs ll or simple)");
  r.gen.protocol = *protocol;
  // Chunks and channels not asked for follow the engine's rule for the size (defaultGenOptions), for every
  // algorithm, so that a tool predicts the schedule the engine would run for the same request.
  r.gen.chunks = a.chunksGiven ? a.chunks : 0;
  r.gen.channels = a.channelsGiven ? a.channels : 0;
  return r;
}

bool isFusedOp(std::string_view op) noexcept { return parseFusedOp(op).has_value(); }

FusedRequest parseFused(const CollectiveArgs& a) {
  FusedRequest r;
  r.spec.op = requireFusedOp(a.op, "--op");
  const char* op = toString(r.spec.op);
  for (const char* option :
       {"--bytes", "--algo", "--redop", "--root", "--chunks", "--channels", "--inter", "--protocol"})
    if (named(a, option))
      throw Error(ErrorCode::InvalidArgument,
                  std::string(option) + " does not apply to " + op +
                      ": a fused op is sized by --m, --n, --k and shaped by --tile-rows, --order, --ctas, --comm-ctas, "
                      "--compute-lanes");
  for (const auto& [v, option, what] : {std::tuple<uint64_t, const char*, const char*>{a.m, "--m", "the rows of C"},
                                        {a.n, "--n", "the columns of C"},
                                        {a.k, "--k", "the inner dimension"}})
    if (v == 0)
      throw Error(ErrorCode::InvalidArgument, std::string(option) + " is required for " + op + " (" + what + ")");
  r.spec.m = a.m;
  r.spec.n = a.n;
  r.spec.k = a.k;
  r.spec.dtype = named(a, "--dtype") ? requireDType(a.dtype, "--dtype") : DType::BFloat16;
  const auto layout = parseMatrixLayout(a.layoutB);
  if (!layout) throw Error(ErrorCode::InvalidArgument, "unknown --layout-b '" + a.layoutB + "' (expected row, col)");
  r.spec.layoutB = *layout;
  const auto order = parseTileOrder(a.order);
  if (!order)
    throw Error(ErrorCode::InvalidArgument,
                "unknown --order '" + a.order + "' (expected auto, own-first, own-last, interleaved)");
  r.opt.order = *order;
  r.opt.tileRows = a.tileRows;
  r.opt.ctas = a.ctas;
  r.opt.commCtas = a.commCtas;
  r.opt.computeLanes = a.computeLanes;
  return r;
}

Profile profileFor(const CollectiveArgs& a, const Topology& topo) {
  return a.profile.empty() ? defaultProfile(topo) : loadProfileFor(a.profile, topo);
}

std::vector<std::string> fillCtaDefaults(Profile& p, const Topology& topo) {
  const Profile datasheet = defaultProfile(topo);
  std::vector<std::string> filled;
  if (p.sms == 0) {
    p.sms = datasheet.sms;
    filled.emplace_back("sms");
  }
  if (p.ctaGBs == 0) {
    p.ctaGBs = datasheet.ctaGBs;
    filled.emplace_back("ctaGBs");
  }
  return filled;
}

Placement placeRanks(const std::string& cluster, uint32_t nodes, uint32_t ranks, uint32_t minNodes) {
  Placement p;
  p.topo = loadTopology(cluster, 0);
  const uint32_t perNode = p.topo.node.gpus;
  uint32_t want = nodes ? nodes : std::max(p.topo.nodes, minNodes);
  if (!nodes && ranks > want * perNode) want = (ranks + perNode - 1) / perNode;
  if (want != p.topo.nodes) p.topo = loadTopology(cluster, want);
  p.nRanks = ranks ? ranks : p.topo.totalGpus();
  if (p.nRanks > p.topo.totalGpus())
    throw Error(ErrorCode::InvalidArgument,
                "--ranks " + std::to_string(p.nRanks) + " does not fit the cluster: " + p.topo.name + " x " +
                    std::to_string(p.topo.nodes) + " node(s) has " + std::to_string(p.topo.totalGpus()) + " GPUs");
  return p;
}

}  // namespace mk
