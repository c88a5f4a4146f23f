// mkernel — the command-line block every collective tool shares (mk-schedule, mk-sim): the options that fill
// mk::CollectiveArgs, one help text each, for the collectives and the fused operators. Turning them into a
// request is parseCollective() and planCollective(), or parseFused() and planFused() (mk/algorithms/request.hpp,
// policy.hpp, fused.hpp). Header-only and for tools: it needs CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"

namespace mk::cli {

/// Every option addCollectiveOptions adds (what finishCollectiveOptions records in CollectiveArgs::given).
inline const std::vector<const char*>& collectiveOptionNames() {
  static const std::vector<const char*> names = {
      "--op",   "--algo",      "--cluster",  "--nodes", "--ranks",     "--bytes",         "--dtype",   "--redop",
      "--root", "--chunks",    "--channels", "--inter", "--protocol",  "--profile",       "--m",       "--n",
      "--k",    "--tile-rows", "--order",    "--ctas",  "--comm-ctas", "--compute-lanes", "--layout-b"};
  return names;
}

/// Add --op, --algo, --cluster, --nodes, --ranks, --bytes, -d/--dtype, --redop, --root (the shared ones from
/// cli_convention.hpp), --chunks, --channels,
/// --inter and --profile, and the fused ops' --m, --n, --k, --tile-rows, --order, --ctas, --comm-ctas,
/// --compute-lanes and --layout-b to `app`, bound to `a`. A tool whose use of one differs rewords it afterwards
/// (app.get_option("--nodes")->description(...)).
inline void addCollectiveOptions(CLI::App& app, CollectiveArgs& a) {
  app.add_option("--op", a.op,
                 "collective: allreduce, allgather, reducescatter, broadcast, alltoall; or a fused GEMM + collective: "
                 "gemm-rs, ag-gemm, gemm-ar (sized by --m --n --k; docs/fused-operators.md)")
      ->capture_default_str();
  app.add_option("--algo", a.algo,
                 "algorithm: allreduce one-shot|two-shot|ring|hierarchical; allgather and reducescatter "
                 "ring|direct|hierarchical; broadcast direct|ring; alltoall direct; or auto (the engine's choice: "
                 "the lowest closed form under the profile used); the layered baseline (NCCL, never auto's choice): "
                 "nccl-ring (allreduce, allgather, reducescatter), nccl-tree (allreduce), nccl-p2p (alltoall, "
                 "broadcast: NCCL's p2p sends), or nccl (NCCL's own choice per size by its tuning model)")
      ->capture_default_str();
  app.add_option("--cluster", a.cluster,
                 "preset (h200x2, dgx-h100, dgx-h200, a100-8x200, cloud-efa-32x100, cloud-tcp-8x200) or a topology "
                 "JSON file; " +
                     defaultClusterNote())
      ->capture_default_str();
  app.add_option("--nodes", a.nodes, "nodes of the cluster (default: the preset's, or enough for --ranks)");
  app.add_option("--ranks", a.ranks, "ranks (GPUs) taking part, placed node-major (default: every GPU)");
  app.add_option("--bytes", a.bytes,
                 "op size as nccl-tests counts it: the larger buffer of one rank (8, 1021, 64K, 1MiB, 1G; binary "
                 "multiples); rounded down to whole elements (per rank block for allgather/reducescatter/alltoall)")
      ->capture_default_str();
  addDtypeOption(app, a.dtype, "float32, bfloat16 or float16 (fused ops: bfloat16, the default, or float16)", false);
  addRedopOption(app, a.redop, "allreduce, reducescatter", false);
  addRootOption(app, a.root, false);
  app.add_option("--chunks", a.chunks,
                 "pipeline depth: chunks per transfer (>= 1; default: the engine's rule for the op, algorithm and "
                 "size, per size with --sweep: docs/user-guide.md)");
  app.add_option("--channels", a.channels,
                 "parallel lanes, each on a slice of the data (>= 1; default: the engine's rule, as --chunks)");
  app.add_option("--inter", a.inter,
                 "inter-node phase of the hierarchical all-reduce: ring (2(M-1) steps per chunk over M nodes), rhd "
                 "(recursive halving + doubling, 2 log2 M steps; other node counts fold the extra nodes), bruck "
                 "(dissemination reduce-scatter + all-gather, 2 ceil(log2 M) steps on any M, no node idle), "
                 "bruck-half (the same, each round moving half of the blocks still live, the first M/2), or "
                 "auto (the lowest closed form under the profile used; rhd only on a power-of-two M)")
      ->check(CLI::IsMember({"ring", "rhd", "bruck", "bruck-half", "auto"}))
      ->capture_default_str();
  app.add_option("--protocol", a.protocol,
                 "protocol of the puts: for the layered algorithms (--algo nccl, nccl-ring, nccl-tree, nccl-p2p) "
                 "simple, ll, ll128 (not nccl-p2p), or auto (the lowest closed form under the profile used; "
                 "docs/algorithms-nccl.md); ll also sends "
                 "the puts of one-shot, two-shot and direct all-gather as LL packets on one node (auto: plain puts)")
      ->check(CLI::IsMember({"simple", "ll", "ll128", "auto"}))
      ->capture_default_str();
  app.add_option("--profile", a.profile,
                 "hardware profile JSON (mkernel.profile.v1, e.g. from mk-calibrate); default: the cluster's "
                 "datasheet defaults");
  app.add_option("--m", a.m, "fused ops: rows of C and A (the whole GEMM C[m x n] = A[m x k] B[k x n])");
  app.add_option("--n", a.n, "fused ops: columns of C and B; a multiple of 8 (ag-gemm: at least 8 per rank)");
  app.add_option("--k", a.k, "fused ops: the inner dimension; a multiple of 8 (gemm-rs, gemm-ar: at least 8 per rank)");
  app.add_option("--tile-rows", a.tileRows,
                 "fused ops: rows of C per tile, i.e. per Gemm step and per message (default: the fewest multiple of "
                 "128 rows holding one wave of the kernel's CTAs, at most a shard)");
  app.add_option("--order", a.order,
                 "fused ops: tile order own-first, own-last, interleaved (round by round over the shards), or auto "
                 "(the lowest closed form)")
      ->check(CLI::IsMember({"auto", "own-first", "own-last", "interleaved"}))
      ->capture_default_str();
  app.add_option("--ctas", a.ctas,
                 "fused ops: CTAs of a rank's resident kernel to split (default: the GPU's SMs less the engine's 4)");
  app.add_option("--comm-ctas", a.commCtas,
                 "fused ops: of those, the CTAs of all communication lanes; the compute lane gets the rest (default: "
                 "the split with the lowest closed form)");
  app.add_option("--compute-lanes", a.computeLanes,
                 "fused ops: compute lanes taking the tiles in turn, sharing the compute CTAs evenly; more than one "
                 "keeps the SMs busy when a tile has fewer 128 x 128 output tiles than CTAs (default: 1, 2 or 4, the "
                 "lowest closed form)");
  app.add_option("--layout-b", a.layoutB, "fused ops: B row-major (k x n) or col (n x k, a Linear layer's weight)")
      ->check(CLI::IsMember({"row", "col"}))
      ->capture_default_str();
}

/// After parse(): the counting options must not be 0 (requirePositive on --ranks, --nodes, --chunks,
/// --channels, --m, --n, --k, --tile-rows, --ctas, --comm-ctas, --compute-lanes), and `a` notes which options were
/// given (`given`, chunksGiven, channelsGiven). Returns kContinue or the exit code.
inline int finishCollectiveOptions(const CLI::App& app, const char* tool, CollectiveArgs& a) {
  a.chunksGiven = app.count("--chunks") > 0;
  a.channelsGiven = app.count("--channels") > 0;
  a.given.clear();
  for (const char* name : collectiveOptionNames())
    if (app.count(name) > 0) a.given.emplace_back(name);
  return requirePositive(app, tool,
                         {{"--ranks", a.ranks},
                          {"--nodes", a.nodes},
                          {"--chunks", a.chunks},
                          {"--channels", a.channels},
                          {"--m", a.m},
                          {"--n", a.n},
                          {"--k", a.k},
                          {"--tile-rows", a.tileRows},
                          {"--ctas", a.ctas},
                          {"--comm-ctas", a.commCtas},
                          {"--compute-lanes", a.computeLanes}});
}

/// What --algo auto chose, for the tools' report line: "one-shot (the lowest closed form), chunks 8 by size,
/// channels 1 by size" ("as given" for --chunks / --channels on the command line).
inline std::string describeAutoChoice(const CollectivePlan& plan, const CollectiveArgs& a) {
  return std::string(toString(plan.spec.algo)) + " (the lowest closed form), chunks " +
         std::to_string(plan.gen.chunks) + (a.chunksGiven ? " as given" : " by size") + ", channels " +
         std::to_string(plan.gen.channels) + (a.channelsGiven ? " as given" : " by size");
}

/// "chunks 4" (given on the command line), "chunks 4 by size" (the engine's rule for this size), or "chunks by size"
/// (value 0: decided per size of a sweep): how the tools print a schedule's chunks and channels.
inline std::string shapeText(const char* what, uint32_t value, bool given) {
  if (value == 0) return std::string(what) + " by size";
  return std::string(what) + " " + std::to_string(value) + (given ? "" : " by size");
}

/// "[a:b, :]"-style text of a half-open range, "all" when it is the whole dimension.
inline std::string sliceText(uint64_t begin, uint64_t size, uint64_t whole) {
  return begin == 0 && size == whole ? ":" : std::to_string(begin) + ":" + std::to_string(begin + size);
}

/// What a tool prints about a fused plan on `nRanks` ranks of a GPU with `sms` SMs, as (label, text) lines: the
/// problem, what rank 0 holds, the tiles and their order, the split, and which of them the model chose.
inline std::vector<std::pair<std::string, std::string>> describeFusedPlan(const FusedPlan& plan, uint32_t nRanks,
                                                                          uint32_t sms) {
  const FusedSpec& s = plan.spec;
  const FusedOptions& o = plan.opt;
  std::vector<std::pair<std::string, std::string>> lines;
  const std::string problem = strprintf(
      "C[%llu x %llu] = A[%llu x %llu] B[%llu x %llu], %s, B %s-major: %.4g GFLOP, %.4g per rank",
      static_cast<unsigned long long>(s.m), static_cast<unsigned long long>(s.n), static_cast<unsigned long long>(s.m),
      static_cast<unsigned long long>(s.k), static_cast<unsigned long long>(s.k), static_cast<unsigned long long>(s.n),
      toString(s.dtype), s.layoutB == MatrixLayout::ColMajor ? "column" : "row", fusedFlops(s) / 1e9,
      fusedFlops(s) / 1e9 / nRanks);
  lines.emplace_back("problem", problem);
  const FusedShard r0 = fusedShards(s, nRanks).front();
  const bool ag = s.op == FusedOp::AllGatherGemm;
  const std::string a =
      ag ? "A[" + sliceText(r0.rowBegin, r0.rows, s.m) + ", :]" : "A[:, " + sliceText(r0.kBegin, r0.kLen, s.k) + "]";
  const std::string b =
      ag ? "B[:, " + sliceText(r0.colBegin, r0.cols, s.n) + "]" : "B[" + sliceText(r0.kBegin, r0.kLen, s.k) + ", :]";
  const std::string c = ag                               ? "C[:, " + sliceText(r0.colBegin, r0.cols, s.n) + "]"
                        : s.op == FusedOp::GemmAllReduce ? "all of C"
                                                         : "C[" + sliceText(r0.rowBegin, r0.rows, s.m) + ", :]";
  lines.emplace_back("rank 0", "holds " + a + " and " + b + ", ends with " + c);
  lines.emplace_back("tiles", std::to_string(o.tileRows) + " rows per Gemm step" +
                                  (plan.tileDefault ? " (default: one wave of the kernel's CTAs)" : " (as given)") +
                                  ", " + std::to_string(plan.estimate.tilesPerRank) + " per rank; order " +
                                  toString(o.order) +
                                  (plan.orderByModel ? " (the lowest closed form)" : " (as given)"));
  std::string split = std::to_string(o.ctas) + " CTAs" +
                      (plan.ctasDefault ? " (" + std::to_string(sms) + " SMs less the engine's " +
                                              std::to_string(kEngineReservedSms) + ")"
                                        : std::string(" (as given)"));
  if (nRanks == 1)
    split += ", all computing (one rank: nothing to communicate)";
  else
    split += ": compute " + std::to_string(o.ctas - o.commCtas) + ", communication " + std::to_string(o.commCtas) +
             (plan.splitByModel ? " (the lowest closed form)" : " (as given)");
  if (o.computeLanes > 1 || plan.lanesByModel)
    split += "; " + std::to_string(o.computeLanes) + " compute lane" + (o.computeLanes > 1 ? "s" : "") +
             (plan.lanesByModel ? " (the lowest closed form)" : " (as given)");
  lines.emplace_back("split", split);
  return lines;
}

/// The closed form's breakdown of `e` and the unfused baseline `l`, as (label, text) lines; `fusedUs` is the
/// prediction the speedup is taken from (the closed form, or the simulator's).
inline std::vector<std::pair<std::string, std::string>> describeFusedCost(const FusedEstimate& e,
                                                                          const LayeredEstimate& l, double fusedUs) {
  std::vector<std::pair<std::string, std::string>> lines;
  auto us = [](double v) { return v > 0 ? formatMicros(v) : std::string("-"); };
  lines.emplace_back("busy", "tensor " + us(e.tensorUs) + ", nvlink " + us(e.nvlinkUs) + ", network " +
                                 us(e.networkUs) + ", memory " + us(e.memoryUs) + " (busiest lane of each): bound " +
                                 toString(e.bound));
  std::string unfused = "GEMM alone " + formatMicros(l.gemmUs);
  if (l.collectiveUs > 0) unfused += " + " + l.collective + " " + formatMicros(l.collectiveUs);
  unfused +=
      strprintf(" = %s; physical bound %s; fused: speedup %.2fx, %s exposed over the GEMM",
                formatMicros(l.totalUs()).c_str(), formatMicros(l.boundUs()).c_str(),
                fusedUs > 0 ? l.totalUs() / fusedUs : 0.0, formatMicros(std::max(0.0, fusedUs - l.gemmUs)).c_str());
  lines.emplace_back("unfused", unfused);
  return lines;
}

}  // namespace mk::cli
