// mk-schedule — generate, validate, verify and cost one collective schedule, without a GPU.
//
// Exit codes (mk/util/cli.hpp): 0 success, 1 verification failed or internal error, 2 bad input (one line on
// stderr, no output file written).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/exec/verify.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"

namespace {

constexpr int kExitVerifyFailed = mk::cli::kExitFailed;

struct Options {
  std::string op = "allreduce";
  std::string algo = "ring";
  std::string cluster = "dgx-h100";
  uint32_t nodes = 0;
  uint32_t ranks = 0;
  std::string bytes = "1MiB";
  std::string dtype = "float32";
  std::string redop = "sum";
  uint32_t root = 0;
  uint32_t chunks = 1;
  uint32_t channels = 1;
  std::string inter = "auto";
  bool verify = false;
  std::string inputs = "uniform";
  uint64_t seed = 1;
  std::string jsonOut;
  std::string packedOut;
  std::string scheduleIn;
  std::string profile;
};

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
      if (it == roleMinMax.end()) roleMinMax[lane.role] = {n, n};
      else it->second = {std::min(it->second.first, n), std::max(it->second.second, n)};
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

/// Count argument of the op from nccl-tests-style "size" bytes; bad input when less than one element per rank.
uint64_t countFromBytes(mk::CollOp op, uint64_t bytes, mk::DType dtype, uint32_t nRanks) {
  const uint64_t count = mk::countForBytes(op, bytes, dtype, nRanks);
  if (count == 0)
    throw mk::Error(mk::ErrorCode::InvalidArgument, "--bytes " + std::to_string(bytes) + " holds less than one " +
                                                        mk::toString(dtype) + " element per rank (need at least " +
                                                        std::to_string(mk::minBytesFor(op, dtype, nRanks)) + " bytes)");
  return count;
}

/// The profile the cost line prices with: --profile's file, else the cluster's datasheet defaults.
mk::Profile profileFor(const Options& o, const mk::Topology& topo) {
  return o.profile.empty() ? mk::defaultProfile(topo) : mk::loadProfile(o.profile);
}

int run(const Options& o) {
  mk::Schedule schedule;
  mk::CollectiveSpec spec;
  bool generated = false;
  mk::InterPhase inter = mk::InterPhase::Auto;  // the resolved inter-node variant of a generated schedule
  mk::Topology topo;

  if (!o.scheduleIn.empty()) {
    schedule = mk::loadSchedule(o.scheduleIn);
    mk::validate(schedule);
    std::printf("mk-schedule: %s (%s %s, %u ranks)\n", o.scheduleIn.c_str(), schedule.info.op.c_str(),
                schedule.info.algo.c_str(), schedule.nRanks);
    std::printf("  validate   OK\n");
  } else {
    const auto op = mk::requireCollOp(o.op, "--op");
    const auto dtype = mk::requireDType(o.dtype, "--dtype");
    const auto redop = mk::requireRedOp(o.redop, "--redop");
    const uint64_t bytes = mk::parseSize(o.bytes);

    const mk::Placement placed = mk::placeRanks(o.cluster, o.nodes, o.ranks);
    topo = placed.topo;
    const uint32_t perNode = topo.node.gpus;
    const uint32_t nRanks = placed.nRanks;

    spec.op = op;
    spec.algo = mk::requireAlgorithm(op, o.algo);
    spec.dtype = dtype;
    spec.redop = redop;
    spec.root = o.root;
    spec.count = countFromBytes(op, bytes, dtype, nRanks);
    mk::GenOptions gen;
    gen.chunks = o.chunks;
    gen.channels = o.channels;
    gen.inter = *mk::parseInterPhase(o.inter);  // CLI11 checked the name
    // "auto" is decided under the profile the cost line below prices with, so both describe one schedule.
    gen.inter = mk::resolveInter(spec, topo.layout(nRanks), gen, profileFor(o, topo));
    inter = gen.inter;

    const auto t0 = std::chrono::steady_clock::now();
    schedule = mk::generate(spec, topo.layout(nRanks), gen);
    const double genMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    mk::validate(schedule, mk::ValidateOptions{schedule.stepCount() <= 200000, 200000});
    generated = true;

    const uint64_t used = mk::opBytes(spec, nRanks);
    std::printf("mk-schedule: %s %s on %s x %u node(s) (%u ranks, %u GPU(s) per node)\n", mk::toString(spec.op),
                mk::toString(spec.algo), topo.name.c_str(), topo.nodes, nRanks, perNode);
    std::printf("  size       %s = %llu %s element(s) per rank%s", mk::formatSize(used).c_str(),
                static_cast<unsigned long long>(spec.count), mk::toString(spec.dtype),
                (op == mk::CollOp::AllReduce || op == mk::CollOp::Broadcast) ? "" : " per block");
    if (used != bytes) std::printf(" (--bytes %llu rounded down to whole elements)", static_cast<unsigned long long>(bytes));
    std::printf("\n  options    redop %s, chunks %u, channels %u%s\n", mk::toString(spec.redop), gen.chunks, gen.channels,
                op == mk::CollOp::Broadcast ? (", root " + std::to_string(spec.root)).c_str() : "");
    if (spec.op == mk::CollOp::AllReduce && spec.algo == mk::Algorithm::Hierarchical)
      std::printf("  inter-node %s%s\n", mk::toString(gen.inter), o.inter == "auto" ? " (auto: the lower closed form)" : "");
    std::printf("  generate   %.1f ms, validate OK\n", genMs);
  }
  printSummary(schedule);

  if (generated) {
    mk::GenOptions gen;
    gen.chunks = o.chunks;
    gen.channels = o.channels;
    gen.inter = inter;
    const mk::Profile profile = profileFor(o, topo);
    const mk::CostEstimate c = mk::closedForm(spec, gen, topo, schedule.nRanks, profile);
    const double algbw = static_cast<double>(mk::opBytes(spec, schedule.nRanks)) / (c.totalUs * 1e3);  // GB/s
    std::printf("  cost       %s closed form (latency %s, bandwidth %s, reduce %s)\n", mk::formatMicros(c.totalUs).c_str(),
                mk::formatMicros(c.latencyUs).c_str(), mk::formatMicros(c.bandwidthUs).c_str(), mk::formatMicros(c.reduceUs).c_str());
    std::printf("             algbw %.2f GB/s, busbw %.2f GB/s\n", algbw, algbw * mk::busBwFactor(spec.op, schedule.nRanks));
    std::printf("  formula    %s\n", c.formula.c_str());
    std::printf("  profile    %s\n", profile.source.c_str());
  }

  int rc = 0;
  if (o.verify) {
    if (!generated)
      throw mk::Error(mk::ErrorCode::InvalidArgument, "--verify needs a generated schedule (not --schedule): the op it computes must be known");
    const mk::InputKind kind = o.inputs == "integers" ? mk::InputKind::SmallIntegers : mk::InputKind::Uniform;
    const auto t0 = std::chrono::steady_clock::now();
    const mk::VerifyResult v = mk::verifyCollective(schedule, spec, o.seed, kind);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (v.ok) {
      std::printf("verify: OK (%llu elements on %u ranks, %s inputs, seed %llu, %.0f ms)\n",
                  static_cast<unsigned long long>(v.checked), schedule.nRanks, o.inputs.c_str(),
                  static_cast<unsigned long long>(o.seed), ms);
    } else {
      std::printf("verify: FAILED: %s (seed %llu)\n", v.detail.c_str(), static_cast<unsigned long long>(o.seed));
      rc = kExitVerifyFailed;
    }
  }
  // Outputs last, and only from a schedule that passed everything asked of it.
  if (rc == 0 && !o.jsonOut.empty()) {
    mk::saveSchedule(schedule, o.jsonOut);
    std::printf("wrote %s\n", o.jsonOut.c_str());
  }
  if (rc == 0 && !o.packedOut.empty()) {
    const auto image = mk::pack(schedule);
    mk::writeFileAtomic(o.packedOut, std::string(image.begin(), image.end()));
    std::printf("wrote %s (%s packed)\n", o.packedOut.c_str(), mk::formatBytes(static_cast<double>(image.size())).c_str());
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "mk-schedule: generate a collective schedule for a cluster, validate it, verify it on the CPU reference\n"
      "executor and print its shape and closed-form cost.\n\n"
      "  mk-schedule --op allreduce --algo ring --ranks 8 --bytes 1MiB --verify\n"
      "  mk-schedule --op allreduce --algo hierarchical --cluster dgx-h100 --nodes 4 --verify --json ar.json\n"
      "  mk-schedule --schedule ar.json --packed ar.bin\n\n"
      "Exit codes: 0 success, 1 verification failed, 2 bad input.",
      "mk-schedule"};
  app.add_option("--op", o.op, "collective: allreduce, allgather, reducescatter, broadcast, alltoall")->capture_default_str();
  app.add_option("--algo", o.algo,
                 "algorithm: allreduce one-shot|two-shot|ring|hierarchical; allgather and reducescatter "
                 "ring|direct|hierarchical; broadcast direct|ring; alltoall direct")
      ->capture_default_str();
  app.add_option("--cluster", o.cluster, "preset (h200x2, dgx-h100, dgx-h200) or a topology JSON file")->capture_default_str();
  app.add_option("--nodes", o.nodes, "nodes of the cluster (default: the preset's, or enough for --ranks)");
  app.add_option("--ranks", o.ranks, "ranks (GPUs) taking part, placed node-major (default: every GPU)");
  app.add_option("--bytes", o.bytes,
                 "op size as nccl-tests counts it: the larger buffer of one rank (8, 1021, 64K, 1MiB, 1G); rounded "
                 "down to whole elements (per rank block for allgather/reducescatter/alltoall)")
      ->capture_default_str();
  app.add_option("--dtype", o.dtype, "float32, bfloat16 or float16")->capture_default_str();
  app.add_option("--redop", o.redop, "sum, max or min (allreduce, reducescatter)")->capture_default_str();
  app.add_option("--root", o.root, "broadcast root rank")->capture_default_str();
  app.add_option("--chunks", o.chunks, "pipeline depth: chunks per transfer (>= 1)")->capture_default_str();
  app.add_option("--channels", o.channels, "parallel lanes, each on a slice of the data (>= 1)")->capture_default_str();
  app.add_option("--inter", o.inter,
                 "inter-node phase of the hierarchical all-reduce: ring (2(M-1) steps per chunk over M nodes), rhd "
                 "(recursive halving + doubling, 2 log2 M steps; other node counts fold the extra nodes), or auto "
                 "(the lower closed form under the cluster's datasheet profile)")
      ->check(CLI::IsMember({"ring", "rhd", "auto"}))
      ->capture_default_str();
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
  app.add_option("--profile", o.profile,
                 "price the closed form with this profile (mkernel.profile.v1, e.g. from mk-calibrate) instead of the "
                 "cluster's datasheet defaults");
  if (int rc = mk::cli::parse(app, argc, argv, "mk-schedule"); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::requirePositive(app, "mk-schedule", {{"--ranks", o.ranks}, {"--nodes", o.nodes},
                                                             {"--chunks", o.chunks}, {"--channels", o.channels}});
      rc != mk::cli::kContinue)
    return rc;
  return mk::cli::run("mk-schedule", [&] { return run(o); });
}
