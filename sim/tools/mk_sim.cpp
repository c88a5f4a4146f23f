// mk-sim — predict a collective's or a fused operator's time by replaying its schedule on the SimGrid model of a
// cluster.
//
// Exit codes: 0 success, 1 internal failure (the simulation process died: a bug), 2 bad input (one line on
// stderr, no output file written).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/bottleneck.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/resources.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/sim/link_use.hpp"
#include "mk/sim/output.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_collective.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"
#include "mk_sim_common.hpp"

namespace {

using namespace mksim;

/// `st` with the plan of one size.
Setup planned(const Setup& st, const mk::CollectivePlan& plan) {
  Setup one = st;
  one.spec = plan.spec;
  one.gen = plan.gen;
  one.chosenByAuto = plan.chosenByAuto;
  // The layered baseline (nccl-*) is priced as that library runs: its kernel's cost per op and protocol.
  if (mk::isLayered(plan.spec.algo)) one.profile = mk::layeredProfile(st.profile, plan.gen.protocol);
  return one;
}

/// Predict one schedule, with the references that are cheap enough to compute next to it.
/// `reference` (when given) receives the uncontended timeline's numbers for the "bound:" line.
std::pair<mk::sim::RunInfo, mk::sim::Prediction> predictOne(const Options& o, const Setup& st, const mk::Schedule& s,
                                                            bool trace, Uncontended* reference = nullptr) {
  mk::sim::RunInfo info = baseInfo(st, s);
  if (st.spec) {
    try {
      const double us = mk::closedForm(*st.spec, st.gen, st.topo, st.nRanks, st.profile).totalUs;
      if (us > 0) info.closedFormUs = us;
    } catch (const mk::Error&) {
      // Not every generator has a closed form (Unsupported): the report just omits it.
    }
  }
  if (!o.fast && s.stepCount() > kSuggestFastSteps)
    std::fprintf(stderr,
                 "mk-sim: %llu steps: the exact replay may take a while; --fast times node-local steps "
                 "analytically and simulates only the network\n",
                 static_cast<unsigned long long>(s.stepCount()));
  Uncontended u = uncontended(st, s);
  info.uncontendedUs = u.us;
  if (reference != nullptr) *reference = std::move(u);
  mk::sim::Prediction p = mk::sim::predict(s, st.topo, st.profile, simOptions(o, trace));
  return {std::move(info), std::move(p)};
}

/// Why the closed-form or uncontended line is absent, and what it means when the three times coincide.
void printReferenceNotes(const mk::sim::RunInfo& info, const mk::sim::Prediction& p, bool generated, uint64_t steps) {
  if (!info.closedFormUs)
    std::printf("closed form: none (%s)\n", generated ? "this algorithm has no closed form"
                                                      : "a loaded --schedule has no generator parameters to price");
  if (!info.uncontendedUs)
    std::printf("uncontended: not computed (%llu steps, above %llu: its timeline is not worth the memory)\n",
                static_cast<unsigned long long>(steps), static_cast<unsigned long long>(kUncontendedMaxSteps));
  auto same = [&](const std::optional<double>& v) { return v && std::fabs(*v - p.totalUs) <= 1e-3 * p.totalUs; };
  if (same(info.closedFormUs) && same(info.uncontendedUs))
    std::printf(
        "note: predicted, closed form and uncontended agree: no link is shared by two transfers at once, so "
        "the simulation adds no contention to the formulas\n");
}

void printPrediction(const mk::sim::RunInfo& info, const mk::sim::Prediction& p, const Uncontended& reference,
                     bool generated, uint64_t steps) {
  const double algbw = mk::sim::algBwGBs(info.bytes, p.totalUs);
  std::printf("predicted: %s  algbw %.2f GB/s  busbw %.2f GB/s\n", mk::formatMicros(p.totalUs).c_str(), algbw,
              algbw * info.busBwFactor);
  if (info.closedFormUs)
    std::printf("closed form: %s (predicted / closed form = %.3f)\n", mk::formatMicros(*info.closedFormUs).c_str(),
                *info.closedFormUs > 0 ? p.totalUs / *info.closedFormUs : 0.0);
  if (info.uncontendedUs)
    std::printf("uncontended: %s (the timeline without link sharing; predicted / uncontended = %.3f)\n",
                mk::formatMicros(*info.uncontendedUs).c_str(),
                *info.uncontendedUs > 0 ? p.totalUs / *info.uncontendedUs : 0.0);
  printReferenceNotes(info, p, generated, steps);
  std::printf("bound: %s\n", boundText(p, reference).c_str());
  std::printf("busiest links:%s\n", p.links.empty() ? " none (no bytes crossed a link)" : "");
  printBusiestLinks(p.links);
}

int run(const Options& o) {
  // Before hours of simulation are spent: outputs writable, and none of them one of the inputs.
  const std::vector<std::string> inputs{o.scheduleIn, o.extentsIn, o.coll.profile, o.coll.cluster};
  mk::checkDistinctOutputs(
      {{"--json", o.jsonOut, mk::OutputKind::File}, {"--trace", o.traceOut, mk::OutputKind::File}});
  mk::checkOutputPath("--json", o.jsonOut, inputs);
  mk::checkOutputPath("--trace", o.traceOut, inputs);
  mk::cli::checkOperatorOptions(o.coll.op, o.ops, o.coll);
  if (mk::cli::isOperatorOp(o.coll.op)) {
    if (!o.scheduleIn.empty())
      bad("--schedule replays a saved schedule: --op " + o.coll.op + " generates one; give one of them");
    return mk::cli::isMoeOp(o.coll.op) ? runMoe(o) : runAttention(o);
  }
  if (o.scheduleIn.empty() && mk::isFusedOp(o.coll.op)) return runFused(o);
  if (!o.sweep.empty()) mk::parseSweep(o.sweep);  // a malformed sweep is the first thing to report
  if (!o.sweep.empty() && !o.traceOut.empty()) bad("--trace needs one size: use --bytes, not --sweep");
  if (!o.sweep.empty() && !o.scheduleIn.empty()) bad("--sweep generates schedules: it cannot be used with --schedule");
  if (!o.extentsIn.empty() && o.scheduleIn.empty())
    bad("--extents gives the runtime extents of a loaded --schedule or of --op moe-dispatch-gemm or moe-ffn (" +
        o.coll.op + " has none)");

  mk::Schedule loaded;
  if (!o.scheduleIn.empty()) {
    loaded = mk::loadSchedule(o.scheduleIn);
    mk::validate(loaded);
    // Priced at the extents' expected values unless a routing is given (mk/schedule/extent.hpp).
    if (!o.extentsIn.empty()) mk::fillCostAttributes(loaded, mk::loadExtentValues(loaded, o.extentsIn));
  }
  Setup st = makeSetup(o, o.scheduleIn.empty() ? nullptr : &loaded);
  if (!o.scheduleIn.empty()) {
    // Priced before anything that grows with it: a 1 KiB file may declare 5000000 flags per rank, which the replay
    // keeps one counter each of (nRanks x nFlags), far more than its steps.
    st.nRanks = loaded.nRanks;
    mk::requireWithin(mk::memoryNeed(mk::countOf(loaded), jobOf(st, !o.traceOut.empty())), o.guard.maxMemory());
  }

  std::vector<uint64_t> sizes;
  std::optional<mk::CollectiveRequest> request;
  if (o.scheduleIn.empty()) {
    request = mk::parseCollective(o.coll);
    sizes = o.sweep.empty() ? std::vector<uint64_t>{mk::parseSize(o.coll.bytes)} : mk::parseSweep(o.sweep);
    st.spec = request->spec;
    st.gen = request->gen;
    if (o.sweep.empty()) {
      // One size: decide "auto" (algorithm, chunks, channels and inter-node phase) under the profile this run
      // uses, so the schedule and the closed form printed next to the prediction are the same one.
      st.spec->count = mk::requireCountForBytes(st.spec->op, sizes[0], st.spec->dtype, st.nRanks);
      st = planned(st, request->ncclAuto
                           ? mk::planNccl(*st.spec, request->gen, st.topo, st.nRanks, st.profile)
                           : mk::planCollective(*st.spec, request->algo, request->gen, st.topo, st.nRanks, st.profile));
    }
  }

  // ---- header ----
  if (st.spec) {
    const bool perSize = !request->algo && !o.sweep.empty();  // auto over a sweep: decided per size
    std::printf("mk-sim: %s %s on %s x %u node(s) (%u ranks, %u GPU(s) per node), %s, %s, %s\n",
                mk::toString(st.spec->op), perSize ? "auto" : mk::toString(st.spec->algo), st.topo.name.c_str(),
                st.topo.nodes, st.nRanks, st.topo.node.gpus, mk::toString(st.spec->dtype),
                mk::cli::shapeText("chunks", st.gen.chunks, o.coll.chunksGiven).c_str(),
                mk::cli::shapeText("channels", st.gen.channels, o.coll.channelsGiven).c_str());
    if (st.chosenByAuto)
      std::printf("auto: %s\n",
                  mk::cli::describeAutoChoice(mk::CollectivePlan{*st.spec, st.gen, true}, o.coll).c_str());
  } else {
    std::printf("mk-sim: %s (%s %s, %u ranks) on %s x %u node(s)\n", o.scheduleIn.c_str(), loaded.info.op.c_str(),
                loaded.info.algo.c_str(), loaded.nRanks, st.topo.name.c_str(), st.topo.nodes);
    if (!loaded.extents.empty())
      std::printf("extents: %zu, priced at %s\n", loaded.extents.size(),
                  o.extentsIn.empty() ? "their expected values (--extents gives a routing)" : o.extentsIn.c_str());
  }
  printProfile(o, st);
  if (o.fast) std::printf("mode: fast (node-local steps analytic, network simulated)\n");
  std::fflush(stdout);

  const bool wantTrace = !o.traceOut.empty();
  // ---- one schedule ----
  if (!st.spec || o.sweep.empty()) {
    mk::Schedule s;
    if (st.spec) {
      if (st.spec->op == mk::CollOp::AllReduce && st.spec->algo == mk::Algorithm::Hierarchical)
        std::printf("inter-node: %s%s\n", mk::toString(st.gen.inter),
                    request->gen.inter == mk::InterPhase::Auto ? " (auto: the lower closed form)" : "");
      mk::checkMemory(*st.spec, st.topo.layout(st.nRanks), st.gen, jobOf(st, wantTrace), o.guard.maxMemory());
      s = mk::withProgress("mk-sim", "generate", o.guard.progressWanted(),
                           [&] { return mk::generate(*st.spec, st.topo.layout(st.nRanks), st.gen); });
      const uint64_t used = mk::opBytes(*st.spec, st.nRanks);
      std::printf("size: %s = %llu element(s)%s\n", mk::formatSizeWithBytes(used).c_str(),
                  static_cast<unsigned long long>(st.spec->count),
                  used != sizes[0] ? " (--bytes rounded down to whole elements)" : "");
    } else {
      s = std::move(loaded);  // its memory was checked right after loading
    }
    Uncontended reference;
    auto [info, p] = predictOne(o, st, s, wantTrace, &reference);
    printPrediction(info, p, reference, st.spec.has_value(), s.stepCount());
    if (o.verbose) printStats(p.stats);
    writeOutputs(o, o.jsonOut.empty() ? std::string() : mk::sim::predictionToJson(p, info),
                 wantTrace ? mk::sim::traceToJson(s, p.steps) : std::string());
    return 0;
  }

  // ---- a sweep over sizes: an nccl-tests-like table ----
  // What auto (algorithm) or the engine's rule (chunks, channels) chose, per size.
  const bool autoColumns = !request->algo || !o.coll.chunksGiven || !o.coll.channelsGiven;
  std::printf("%14s %12s %9s %14s %12s %12s %14s", "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
              "closed(us)");
  if (autoColumns) std::printf(" %14s %7s %9s", "algo", "chunks", "channels");
  std::printf("\n");
  std::vector<std::pair<mk::sim::RunInfo, mk::sim::Prediction>> rows;
  for (const uint64_t bytes : sizes) {
    mk::CollectiveSpec spec = *st.spec;
    spec.count = mk::countForBytes(spec.op, bytes, spec.dtype, st.nRanks);
    if (spec.count == 0) {
      std::printf("# %llu B holds less than one element per rank: skipped\n", static_cast<unsigned long long>(bytes));
      continue;
    }
    // Per size: "auto" may choose another algorithm, chunks, channels or inter-node phase at every size.
    const Setup one = planned(
        st, request->ncclAuto ? mk::planNccl(spec, request->gen, st.topo, st.nRanks, st.profile)
                              : mk::planCollective(spec, request->algo, request->gen, st.topo, st.nRanks, st.profile));
    mk::checkMemory(*one.spec, st.topo.layout(st.nRanks), one.gen, jobOf(st, false), o.guard.maxMemory());
    const mk::Schedule s = mk::withProgress("mk-sim", "generate", o.guard.progressWanted(), [&] {
      return mk::generate(*one.spec, st.topo.layout(st.nRanks), one.gen);
    });
    auto row = predictOne(o, one, s, false);
    const auto& [info, p] = row;
    const double algbw = mk::sim::algBwGBs(info.bytes, p.totalUs);
    // One decimal convention in every table: times (us) and rates (GB/s) with two decimals, "-" for none.
    const std::string closed = info.closedFormUs ? mk::strprintf("%.2f", *info.closedFormUs) : "-";
    std::printf("%14llu %12llu %9s %14.2f %12.2f %12.2f %14s", static_cast<unsigned long long>(info.bytes),
                static_cast<unsigned long long>(info.count), info.dtype.c_str(), p.totalUs, algbw,
                algbw * info.busBwFactor, closed.c_str());
    if (autoColumns) std::printf(" %14s %7u %9u", info.algo.c_str(), info.chunks, info.channels);
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
  if (!rows.empty()) {
    std::printf("bound at %s: %s\n", mk::formatSizeWithBytes(rows.back().first.bytes).c_str(),
                mk::bottleneckText(mk::sim::linkResourceUse(rows.back().second.links)).c_str());
    std::printf("busiest links at %s:\n", mk::formatSizeWithBytes(rows.back().first.bytes).c_str());
    printBusiestLinks(rows.back().second.links);
  }
  writeOutputs(o, o.jsonOut.empty() ? std::string() : mk::sim::sweepToJson(rows), std::string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "mk-sim: predict the time of a collective or of a fused GEMM + collective by replaying its schedule (the\n"
      "same one the GPU runs) on a SimGrid 3.32 model of the cluster: NVLink through NVSwitch or direct links,\n"
      "PCIe, one NIC per GPU into a rail-optimised leaf/spine fabric. Link rates and latencies come from a profile\n"
      "(--profile; default: the cluster's datasheet numbers, printed as uncalibrated). Prints the predicted time,\n"
      "algbw, busbw (a fused op: TFLOP/s, its plan, what bounds it, the unfused baseline), the closed form and\n"
      "the three busiest links.\n\n"
      "  mk-sim --op allreduce --algo ring --cluster dgx-h100 --nodes 2 --bytes 1G --dtype bfloat16\n"
      "  mk-sim --op allreduce --algo hierarchical --cluster dgx-h100 --nodes 128 --bytes 1G --json p.json\n"
      "  mk-sim --op allreduce --algo one-shot --cluster h200x2 --sweep 8:1G:2\n"
      "  mk-sim --op gemm-ar --cluster h200x2 --m 8192 --n 8192 --k 4096   (prints what bounds it)\n"
      "  mk-sim --op moe-dispatch-gemm --cluster dgx-h100 --nodes 2 --experts 2 --topk 4 --tokens 4096 --hidden 7168\n"
      "         --out-cols 2048 --imbalance 1.5   (expected loads; --extents routing.json prices a given routing)\n"
      "  mk-sim --op moe-ffn --cluster dgx-h100 --nodes 2 --experts 2 --topk 4 --tokens 4096 --hidden 7168 --ffn 2048\n"
      "         (dispatch, the SwiGLU expert FFN and the combine back to the tokens' ranks)\n"
      "  mk-sim --op ring-attention --cluster dgx-h100 --seq 131072 --heads 32 --kv-heads 8 --head-dim 128 --causal\n"
      "         (--backward: the backward pass, K/V travelling with their dK/dV accumulators)\n"
      "  mk-sim --schedule s.json --cluster dgx-h100 --trace t.json   (open t.json in ui.perfetto.dev)\n\n"
      "Outputs: --json writes {\"schema\": \"mkernel.prediction.v1\", \"time_us\", \"algbw_gbs\", \"busbw_gbs\",\n"
      "\"closed_form_us\", \"busiest_links\", \"links\", \"stats\", ...} (a sweep: one \"results\" entry per size);\n"
      "--trace writes every step as a Chrome/Perfetto trace event (pid = rank, tid = lane + 1, ts/dur in us).\n"
      "Progress goes to stderr for runs longer than 2 s (a terminal, or --progress). Format details: "
      "docs/simulator.md.\n\n"
      "Exit codes: 0 success, 1 internal failure (the simulation process died), 2 bad input (or above\n"
      "--max-memory), 5 out of memory.",
      "mk-sim"};
  // Without --algo a collective runs what the engine runs for it: "auto" (chooseAlgorithm, policy.hpp), not a
  // flat ring, so that mk-sim's answer is the engine's.
  o.coll.algo = "auto";
  mk::cli::addCollectiveOptions(app, o.coll);
  mk::cli::addOperatorOptions(app, o.ops);
  app.get_option("--op")->description(app.get_option("--op")->get_description() +
                                      "; or moe-dispatch-gemm (--experts --topk --tokens --hidden --out-cols), "
                                      "moe-ffn (--experts --topk --tokens --hidden --ffn), "
                                      "ring-attention (--seq --heads --head-dim)");
  app.get_option("--nodes")->description(
      "nodes of the cluster (default: the preset's, enough for --ranks, or enough for --schedule)");
  for (const char* decidedPerSize : {"--algo", "--inter"})
    app.get_option(decidedPerSize)
        ->description(app.get_option(decidedPerSize)->get_description() + "; per size with --sweep");
  app.get_option("--profile")
      ->description(
          "hardware profile JSON (schema mkernel.profile.v1, docs/simulator.md); default: datasheet "
          "numbers for the cluster, printed as 'profile: uncalibrated (datasheet defaults)'");
  app.add_option("--json", o.jsonOut, "write the prediction as JSON (schema mkernel.prediction.v1)");
  app.add_option("--trace", o.traceOut, "write the per-step trace as Chrome/Perfetto trace-event JSON (one size only)");
  mk::cli::addSweepOptions(app, o.sizes, "predict each and print an nccl-tests-like table (replaces --bytes)");
  app.add_option("--schedule", o.scheduleIn,
                 "replay this schedule JSON (validated first) instead of generating one; --cluster must fit its "
                 "ranks (--nodes defaults to the schedule's node count)");
  app.add_option(
      "--extents", o.extentsIn,
      "with --schedule or --op moe-dispatch-gemm / moe-ffn: runtime extent values to price, e.g. a routing (JSON "
      "mkernel.extents.v1: extent name -> one value, or one per rank; docs/schedule-format.md); default: "
      "each extent's expected value");
  app.add_flag("--fast", o.fast,
               "scale mode: time steps that stay inside a node (NVLink, memory, GEMM, flags) with the uncontended "
               "formulas and simulate only the network flows (exact when nothing contends inside a node)");
  app.add_flag("--verbose", o.verbose, "show SimGrid's own log (info level) and the simulation's cost");
  mk::cli::addGuardOptions(app, o.guard);
  if (int rc = mk::cli::parse(app, argc, argv, "mk-sim"); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::finishCollectiveOptions(app, "mk-sim", o.coll); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::finishOperatorOptions(app, "mk-sim", o.ops); rc != mk::cli::kContinue) return rc;
  return mk::cli::run("mk-sim", [&] {
    o.sweep = mk::cli::resolveSweep(app, o.sizes, o.coll.bytes + ":" + o.coll.bytes + ":2");
    return run(o);
  });
}
