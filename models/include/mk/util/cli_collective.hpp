// mkernel — the command-line block every collective tool shares (mk-schedule, mk-sim): the options that fill
// mk::CollectiveArgs, one help text each. Turning them into a request is parseCollective() and planCollective()
// (mk/algorithms/request.hpp, mk/algorithms/policy.hpp). Header-only and for tools: it needs CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "mk/algorithms/policy.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/util/cli.hpp"

namespace mk::cli {

/// Add --op, --algo, --cluster, --nodes, --ranks, --bytes, --dtype, --redop, --root, --chunks, --channels,
/// --inter and --profile to `app`, bound to `a`. A tool whose use of one differs rewords it afterwards
/// (app.get_option("--nodes")->description(...)).
inline void addCollectiveOptions(CLI::App& app, CollectiveArgs& a) {
  app.add_option("--op", a.op, "collective: allreduce, allgather, reducescatter, broadcast, alltoall")
      ->capture_default_str();
  app.add_option("--algo", a.algo,
                 "algorithm: allreduce one-shot|two-shot|ring|hierarchical; allgather and reducescatter "
                 "ring|direct|hierarchical; broadcast direct|ring; alltoall direct; or auto (the engine's choice: "
                 "the lowest closed form under the profile used, with the engine's chunks and channels per size "
                 "unless --chunks or --channels is given)")
      ->capture_default_str();
  app.add_option("--cluster", a.cluster, "preset (h200x2, dgx-h100, dgx-h200) or a topology JSON file")
      ->capture_default_str();
  app.add_option("--nodes", a.nodes, "nodes of the cluster (default: the preset's, or enough for --ranks)");
  app.add_option("--ranks", a.ranks, "ranks (GPUs) taking part, placed node-major (default: every GPU)");
  app.add_option("--bytes", a.bytes,
                 "op size as nccl-tests counts it: the larger buffer of one rank (8, 1021, 64K, 1MiB, 1G; binary "
                 "multiples); rounded down to whole elements (per rank block for allgather/reducescatter/alltoall)")
      ->capture_default_str();
  app.add_option("--dtype", a.dtype, "float32, bfloat16 or float16")->capture_default_str();
  app.add_option("--redop", a.redop, "sum, max or min (allreduce, reducescatter)")->capture_default_str();
  app.add_option("--root", a.root, "broadcast root rank")->capture_default_str();
  app.add_option("--chunks", a.chunks, "pipeline depth: chunks per transfer (>= 1)")->capture_default_str();
  app.add_option("--channels", a.channels, "parallel lanes, each on a slice of the data (>= 1)")->capture_default_str();
  app.add_option("--inter", a.inter,
                 "inter-node phase of the hierarchical all-reduce: ring (2(M-1) steps per chunk over M nodes), rhd "
                 "(recursive halving + doubling, 2 log2 M steps; other node counts fold the extra nodes), or auto "
                 "(the lower closed form under the profile used)")
      ->check(CLI::IsMember({"ring", "rhd", "auto"}))
      ->capture_default_str();
  app.add_option("--profile", a.profile,
                 "hardware profile JSON (mkernel.profile.v1, e.g. from mk-calibrate); default: the cluster's "
                 "datasheet defaults");
}

/// After parse(): the counting options must not be 0 (requirePositive on --ranks, --nodes, --chunks,
/// --channels), and `a` notes whether --chunks and --channels were given. Returns kContinue or the exit code.
inline int finishCollectiveOptions(const CLI::App& app, const char* tool, CollectiveArgs& a) {
  a.chunksGiven = app.count("--chunks") > 0;
  a.channelsGiven = app.count("--channels") > 0;
  return requirePositive(
      app, tool, {{"--ranks", a.ranks}, {"--nodes", a.nodes}, {"--chunks", a.chunks}, {"--channels", a.channels}});
}

/// What --algo auto chose, for the tools' report line: "one-shot (the lowest closed form), chunks 8 by size,
/// channels 1 by size" ("as given" for --chunks / --channels on the command line).
inline std::string describeAutoChoice(const CollectivePlan& plan, const CollectiveArgs& a) {
  return std::string(toString(plan.spec.algo)) + " (the lowest closed form), chunks " +
         std::to_string(plan.gen.chunks) + (a.chunksGiven ? " as given" : " by size") + ", channels " +
         std::to_string(plan.gen.channels) + (a.channelsGiven ? " as given" : " by size");
}

}  // namespace mk::cli
