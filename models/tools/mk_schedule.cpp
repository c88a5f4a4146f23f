// mk-schedule — generate, validate, verify and cost one collective, fused-operator, moe-dispatch-gemm, moe-ffn or
// ring-attention schedule, without a GPU.
//
// Exit codes (mk/util/cli.hpp): 0 success, 1 verification failed or internal error, 2 bad input (one line on
// stderr, no output file written; a request above --max-memory too), 5 out of memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/bottleneck.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/verify.hpp"
#include "mk/exec/verify_attention.hpp"
#include "mk/exec/verify_fused.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/resources.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_collective.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/util/cli_operators.hpp"
#include "mk/util/size.hpp"
#include "mk_schedule_common.hpp"

namespace mkschedule {

/// What this run does with the schedule, for the memory estimate.
mk::MemoryJob jobOf(const Options& o) {
  mk::MemoryJob job;
  job.json = !o.jsonOut.empty();
  job.packed = !o.packedOut.empty();
  job.verify = o.verify;
  return job;
}

/// Steps per lane role and bytes per link class, summed over ranks: the shape of a schedule at a glance.
void printSummary(const mk::Schedule& s) {
  std::map<mk::LaneRole, std::pair<uint64_t, uint64_t>> roleLanesSteps;  // lanes, steps
  std::map<mk::LaneRole, std::pair<uint64_t, uint64_t>> roleMinMax;      // steps per lane min/max
  std::map<mk::StepKind, uint64_t> kinds;
  std::map<mk::LinkClass, double> linkBytes;
  for (const auto& rankLanes : s.lanes) {
    for (const auto& lane : rankLanes) {
      auto& ls = roleLanesSteps[lane.role];
      ls.first += 1;
      ls.second += lane.steps.size();
      auto it = roleMinMax.find(lane.role);
      const uint64_t n = lane.steps.size();
      if (it == roleMinMax.end())
        roleMinMax[lane.role] = {n, n};
      else
        it->second = {std::min(it->second.first, n), std::max(it->second.second, n)};
      for (const auto& st : lane.steps) {
        kinds[st.kind] += 1;
        if (st.link != mk::LinkClass::None && st.kind != mk::StepKind::Signal)
          linkBytes[st.link] += static_cast<double>(st.bytes);
      }
    }
  }
  std::printf("  ranks      %u on %u node(s); %u flag(s) per rank, %u barrier(s)\n", s.nRanks,
              s.nodeOf.empty() ? 0u : *std::max_element(s.nodeOf.begin(), s.nodeOf.end()) + 1, s.nFlags, s.nBarriers);
  std::printf("  steps      %llu in all:", static_cast<unsigned long long>(s.stepCount()));
  for (const auto& [k, n] : kinds) std::printf(" %s %llu", mk::toString(k), static_cast<unsigned long long>(n));
  std::printf("\n");
  for (const auto& [role, ls] : roleLanesSteps) {
    const auto mm = roleMinMax[role];
    std::printf("  lanes      %-10s %llu lane(s), %llu..%llu steps per lane\n", mk::toString(role),
                static_cast<unsigned long long>(ls.first), static_cast<unsigned long long>(mm.first),
                static_cast<unsigned long long>(mm.second));
  }
  std::printf("  bytes      ");
  if (linkBytes.empty()) std::printf("none");
  for (const auto& [link, b] : linkBytes) std::printf("%s %s  ", mk::toString(link), mk::formatBytes(b).c_str());
  std::printf("(summed over ranks)\n");
}

/// The one size of this run: --bytes, or a --sweep (-b/-e/-f) of one size; a range is refused (one schedule per run).
uint64_t oneSize(const Options& o) {
  if (o.sizes.sweep.empty()) return mk::parseSize(o.coll.bytes);
  const std::vector<uint64_t> sizes = mk::parseSweep(o.sizes.sweep);
  if (sizes.size() != 1)
    throw mk::Error(mk::ErrorCode::InvalidArgument,
                    "--sweep " + o.sizes.sweep + " is " + std::to_string(sizes.size()) +
                        " sizes: mk-schedule makes one schedule per run (give one size: --bytes, or -b equal to -e); "
                        "mk-sim --sweep predicts a range");
  return sizes.front();
}

/// What bounds the op, from the uncontended timeline's resource use (mk/cost/bottleneck.hpp): "network-bound: ...".
void printBound(const mk::Schedule& s, const mk::Profile& profile, const mk::Topology& topo, double closedUs) {
  // The timeline holds every step's times: above this many steps mk-sim --fast is the tool for the question.
  constexpr uint64_t kTimelineMaxSteps = 2000000;
  if (s.stepCount() > kTimelineMaxSteps) {
    std::printf("  bound      not computed (%llu steps: the timeline is not worth the memory; mk-sim says it)\n",
                static_cast<unsigned long long>(s.stepCount()));
    return;
  }
  const mk::Timeline t = mk::simulateUncontended(s, profile, topo);
  std::printf("  bound      %s\n", mk::bottleneckText(mk::timelineResourceUse(s, t, profile)).c_str());
  const bool same = std::fabs(t.totalUs - closedUs) <= 1e-3 * closedUs;
  std::printf("  timeline   %s uncontended%s\n", mk::formatMicros(t.totalUs).c_str(),
              same ? " (= the closed form: the formula is exact for this schedule when nothing contends)"
                   : " (the closed form differs: it sums the critical path's terms, the timeline plays every step)");
}

/// Run `check` (a verification on the CPU reference executor), print its verdict and time; the exit code.
int verify(const Options& o, uint32_t nRanks, const std::function<mk::VerifyResult()>& check) {
  const auto t0 = std::chrono::steady_clock::now();
  const mk::VerifyResult v = mk::withProgress("mk-schedule", "verify", o.guard.progressWanted(), check);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!v.ok) {
    std::printf("verify: FAILED: %s (seed %llu)\n", v.detail.c_str(), static_cast<unsigned long long>(o.seed));
    return kExitVerifyFailed;
  }
  std::printf("verify: OK (%llu elements on %u ranks, %s inputs, seed %llu, %.0f ms)\n",
              static_cast<unsigned long long>(v.checked), nRanks, o.inputs.c_str(),
              static_cast<unsigned long long>(o.seed), ms);
  return 0;
}

/// Outputs last, and only from a schedule that passed everything asked of it; all of them or none.
void writeOutputs(const Options& o, const mk::Schedule& schedule) {
  mk::OutputSet outputs;
  if (!o.jsonOut.empty()) outputs.stage("--json", o.jsonOut, mk::scheduleToJson(schedule) + "\n");
  std::size_t packedBytes = 0;
  if (!o.packedOut.empty()) {
    const auto image = mk::pack(schedule);
    packedBytes = image.size();
    outputs.stage("--packed", o.packedOut, std::string(image.begin(), image.end()));
  }
  outputs.commit();
  if (!o.jsonOut.empty()) std::printf("wrote %s\n", o.jsonOut.c_str());
  if (!o.packedOut.empty())
    std::printf("wrote %s (%s packed)\n", o.packedOut.c_str(),
                mk::formatBytes(static_cast<double>(packedBytes)).c_str());
}

/// " (sms, ctaGBs: datasheet values, not in the profile)" when fillCtaDefaults filled something.
std::string filledNote(const std::vector<std::string>& filled) {
  std::string s;
  for (const auto& f : filled) s += (s.empty() ? "" : ", ") + f;
  return s.empty() ? s : " (" + s + ": datasheet values, not in the profile)";
}

/// Validate a schedule (races too, up to 200 k steps: mk::ValidateOptions' default) and say how: "OK", or "OK"
/// and plainly that the race check did not run and why; never a bare "OK" for a check that was skipped.
std::string validateText(const mk::Schedule& schedule) {
  const std::string skipped = mk::validate(schedule);
  return skipped.empty() ? "OK" : "OK (race check skipped: " + skipped + ")";
}

void printLines(const std::vector<std::pair<std::string, std::string>>& lines) {
  for (const auto& [label, text] : lines) std::printf("  %-10s %s\n", label.c_str(), text.c_str());
}

int run(const Options& o) {
  const std::vector<std::string> inputs{o.scheduleIn, o.coll.profile, o.coll.cluster};
  mk::checkDistinctOutputs(
      {{"--json", o.jsonOut, mk::OutputKind::File}, {"--packed", o.packedOut, mk::OutputKind::File}});
  mk::checkOutputPath("--json", o.jsonOut, inputs);
  mk::checkOutputPath("--packed", o.packedOut, inputs);
  mk::cli::checkOperatorOptions(o.coll.op, o.ops, o.coll);
  if (o.scheduleIn.empty() && mk::cli::isOperatorOp(o.coll.op)) return runOperator(o);
  if (o.scheduleIn.empty() && mk::isFusedOp(o.coll.op)) return runFused(o);
  mk::Schedule schedule;
  mk::CollectiveSpec spec;
  mk::GenOptions gen;
  mk::Profile profile;
  bool generated = false;
  mk::Topology topo;

  if (!o.scheduleIn.empty()) {
    schedule = mk::loadSchedule(o.scheduleIn);
    const std::string validated = validateText(schedule);
    std::printf("mk-schedule: %s (%s %s, %u ranks)\n", o.scheduleIn.c_str(), schedule.info.op.c_str(),
                schedule.info.algo.c_str(), schedule.nRanks);
    std::printf("  validate   %s\n", validated.c_str());
  } else {
    const mk::CollectiveRequest request = mk::parseCollective(o.coll);
    const uint64_t bytes = oneSize(o);

    const mk::Placement placed = mk::placeRanks(o.coll.cluster, o.coll.nodes, o.coll.ranks);
    topo = placed.topo;
    const uint32_t perNode = topo.node.gpus;
    const uint32_t nRanks = placed.nRanks;

    spec = request.spec;
    spec.count = mk::requireCountForBytes(spec.op, bytes, spec.dtype, nRanks);
    // "auto" (algorithm and inter-node phase) is decided under the profile the cost line below prices with,
    // so both describe one schedule.
    profile = mk::profileFor(o.coll, topo);
    const mk::CollectivePlan plan = request.ncclAuto
                                        ? mk::planNccl(spec, request.gen, topo, nRanks, profile)
                                        : mk::planCollective(spec, request.algo, request.gen, topo, nRanks, profile);
    spec = plan.spec;
    gen = plan.gen;
    // The layered baseline (nccl-*) is priced as that library runs: its kernel's cost per op and protocol.
    if (mk::isLayered(spec.algo)) profile = mk::layeredProfile(profile, gen.protocol);

    mk::checkMemory(spec, topo.layout(nRanks), gen, jobOf(o), o.guard.maxMemory());
    const auto t0 = std::chrono::steady_clock::now();
    schedule = mk::withProgress("mk-schedule", "generate", o.guard.progressWanted(),
                                [&] { return mk::generate(spec, topo.layout(nRanks), gen); });
    const double genMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::string validated = validateText(schedule);
    generated = true;

    const uint64_t used = mk::opBytes(spec, nRanks);
    std::printf("mk-schedule: %s %s on %s x %u node(s) (%u ranks, %u GPU(s) per node)\n", mk::toString(spec.op),
                mk::toString(spec.algo), topo.name.c_str(), topo.nodes, nRanks, perNode);
    if (plan.chosenByAuto) std::printf("  auto       %s\n", mk::cli::describeAutoChoice(plan, o.coll).c_str());
    std::printf("  size       %s = %llu %s element(s) per rank%s", mk::formatSizeWithBytes(used).c_str(),
                static_cast<unsigned long long>(spec.count), mk::toString(spec.dtype),
                (spec.op == mk::CollOp::AllReduce || spec.op == mk::CollOp::Broadcast) ? "" : " per block");
    if (used != bytes)
      std::printf(" (--bytes %llu rounded down to whole elements)", static_cast<unsigned long long>(bytes));
    std::printf("\n  options    redop %s, %s, %s%s\n", mk::toString(spec.redop),
                mk::cli::shapeText("chunks", gen.chunks, o.coll.chunksGiven).c_str(),
                mk::cli::shapeText("channels", gen.channels, o.coll.channelsGiven).c_str(),
                spec.op == mk::CollOp::Broadcast ? (", root " + std::to_string(spec.root)).c_str() : "");
    if (spec.op == mk::CollOp::AllReduce && spec.algo == mk::Algorithm::Hierarchical)
      std::printf("  inter-node %s%s\n", mk::toString(gen.inter),
                  request.gen.inter == mk::InterPhase::Auto ? " (auto: the lower closed form)" : "");
    std::printf("  generate   %.1f ms, validate %s\n", genMs, validated.c_str());
  }
  printSummary(schedule);

  if (generated) {
    const mk::CostEstimate c = mk::closedForm(spec, gen, topo, schedule.nRanks, profile);
    const double algbw = static_cast<double>(mk::opBytes(spec, schedule.nRanks)) / (c.totalUs * 1e3);  // GB/s
    std::printf("  cost       %s closed form (latency %s, bandwidth %s, reduce %s)\n",
                mk::formatMicros(c.totalUs).c_str(), mk::formatMicros(c.latencyUs).c_str(),
                mk::formatMicros(c.bandwidthUs).c_str(), mk::formatMicros(c.reduceUs).c_str());
    std::printf("             algbw %.2f GB/s, busbw %.2f GB/s\n", algbw,
                algbw * mk::busBwFactor(spec.op, schedule.nRanks));
    std::printf("  formula    %s\n", c.formula.c_str());
    printBound(schedule, profile, topo, c.totalUs);
    std::printf("  profile    %s\n", profile.source.c_str());
  }

  if (o.verify && !generated)
    throw mk::Error(mk::ErrorCode::InvalidArgument,
                    "--verify needs a generated schedule (not --schedule): the op it computes must be known");
  const mk::InputKind kind = o.inputs == "integers" ? mk::InputKind::SmallIntegers : mk::InputKind::Uniform;
  const int rc =
      o.verify ? verify(o, schedule.nRanks, [&] { return mk::verifyCollective(schedule, spec, o.seed, kind); }) : 0;
  if (rc == 0) writeOutputs(o, schedule);
  return rc;
}

}  // namespace mkschedule

int main(int argc, char** argv) {
  using namespace mkschedule;
  Options o;
  CLI::App app{
      "mk-schedule: generate a collective or fused GEMM + collective schedule for a cluster, validate it, verify it\n"
      "on the CPU reference executor and print its shape and closed-form cost.\n\n"
      "  mk-schedule --op allreduce --algo ring --ranks 8 --bytes 1MiB --verify\n"
      "  mk-schedule --op gemm-rs --cluster h200x2 --m 8192 --n 8192 --k 4096\n"
      "  mk-schedule --op gemm-ar --ranks 4 --m 301 --n 264 --k 520 --tile-rows 64 --comm-ctas 12 --verify\n"
      "  mk-schedule --op moe-dispatch-gemm --ranks 4 --experts 2 --topk 2 --tokens 64 --hidden 64 --out-cols 32 "
      "--verify\n"
      "  mk-schedule --op moe-ffn --ranks 4 --experts 2 --topk 2 --tokens 63 --hidden 64 --ffn 32 --verify\n"
      "  mk-schedule --op ring-attention --ranks 4 --seq 256 --heads 4 --kv-heads 2 --head-dim 64 --causal --verify\n"
      "  mk-schedule --op ring-attention --backward --ranks 4 --seq 64 --heads 4 --kv-heads 2 --head-dim 8 --verify\n"
      "  mk-schedule --op allreduce --algo hierarchical --cluster dgx-h100 --nodes 4 --verify --json ar.json\n"
      "  mk-schedule --schedule ar.json --packed ar.bin\n\n"
      "Exit codes: 0 success, 1 verification failed, 2 bad input (or above --max-memory), 5 out of memory.",
      "mk-schedule"};
  mk::cli::addCollectiveOptions(app, o.coll);
  mk::cli::addOperatorOptions(app, o.ops);
  app.get_option("--op")->description(app.get_option("--op")->get_description() +
                                      "; or moe-dispatch-gemm (--experts --topk --tokens --hidden --out-cols), "
                                      "moe-ffn (--experts --topk --tokens --hidden --ffn), "
                                      "ring-attention (--seq --heads --head-dim)");
  app.get_option("--profile")
      ->description(
          "price the closed form (and decide auto) with this profile (mkernel.profile.v1, e.g. from "
          "mk-calibrate) instead of the cluster's datasheet defaults");
  app.add_flag("--verify", o.verify, "run the CPU reference executor on fresh random inputs and compare every element");
  app.add_option("--inputs", o.inputs,
                 "verify inputs: uniform (random in [-1,1), sums within the documented tolerance) or integers "
                 "(small integers, every result must be bit-exact)")
      ->check(CLI::IsMember({"uniform", "integers"}))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "random seed for --verify")->capture_default_str();
  app.add_option("--json", o.jsonOut, "write the schedule as JSON (docs/schedule-format.md)");
  app.add_option("--packed", o.packedOut, "write the packed binary form (what a GPU uploads)");
  app.add_option("--schedule", o.scheduleIn, "read a schedule JSON instead of generating one (validate + summary)");
  mk::cli::addGuardOptions(app, o.guard);
  mk::cli::addSweepOptions(app, o.sizes, "mk-schedule makes one schedule: a range of one size only (mk-sim sweeps)");
  if (int rc = mk::cli::parse(app, argc, argv, "mk-schedule"); rc != mk::cli::kContinue) return rc;
  // A schedule file says its op, ranks and sizes: a generator option next to it would be silently ignored.
  if (app.count("--schedule") > 0)
    if (int rc = mk::cli::refuseOthers(
            app, "mk-schedule", {"--schedule", "--json", "--packed", "--verify", "--max-memory", "--progress"},
            "is ignored with --schedule (the file is the schedule: its op, ranks and sizes)");
        rc != mk::cli::kContinue)
      return rc;
  if (int rc = mk::cli::finishCollectiveOptions(app, "mk-schedule", o.coll); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::finishOperatorOptions(app, "mk-schedule", o.ops); rc != mk::cli::kContinue) return rc;
  return mk::cli::run("mk-schedule", [&] {
    o.sizes.sweep = mk::cli::resolveSweep(app, o.sizes, o.coll.bytes + ":" + o.coll.bytes + ":2");
    return run(o);
  });
}
