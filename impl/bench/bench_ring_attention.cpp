// mk-bench ring-attention: ring attention on the resident kernel (Communicator::ringAttention; docs/attention.md,
// "Ring attention") against the layered program, on this machine's GPUs or across nodes of one process per rank.
//
//   mk-bench ring-attention [--ranks R] [--seq-per-rank 4096,8192] [-b 1] [--q-heads 32] [--kv-heads 8]
//                           [--mask causal|none|both] [--iters I] [-w W] [--reps R] [--check] [--json f]
//   impl/tools/launch_ranks.sh --mps P mk-bench ring-attention --ranks-per-node N --transport socket --share-gpus ...
//
// Ranks: R ranks of one process on the visible GPUs in turn (more ranks than GPUs share them), or one process per
// rank (launch_ranks.sh, torchrun, mpirun) in nodes of --ranks-per-node ranks whose K / V blocks cross nodes through
// the proxy over --transport. Head dim 128, bf16, the whole sequence is ranks x --seq-per-rank tokens.
//
// Columns (medians over --reps loops of --iters calls, CUDA events; every time the largest over the processes):
//  * lanes: the worker CTAs of rank 0's compute lane / send lane (Communicator::ringAttentionPlan);
//  * fused_us: Communicator::ringAttention on a compute-capable communicator: the compute lane runs the attention
//    engine on each block while the send lane passes the next one on;
//  * layered_us: the layered program of a framework, on a communication-only communicator (--baseline-ctas worker
//    CTAs: the attention kernels keep the other SMs): per ring step, the K / V transfer to the next rank (an mkernel
//    put or proxy put over the same transport, as execute() of a one-step ring shift) and then the standalone
//    attention kernel (mk::attentionForward) on the block held, with mk::lseMergeDevice merging, one after the other
//    on the rank's stream. Its attention calls and merges are the fused schedule's own steps (same shapes, offsets
//    and order), read from the generated schedule;
//  * attn_us / comm_us: the layered program's kernels alone / its transfers alone; bound_us = max of the two (what
//    any overlap can reach); speedup = layered_us / fused_us; TFLOP/s = the unmasked pairs' 4 B Hq D / fused_us.
// --check: every element of every rank's fused output against the layered program's (the same tolerance as the GPU
// tests: 2.5e-3 on values, 1e-4 relative on log-sum-exps); both against a double reference is
// mk_ring_attention_gpu_tests.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_launch.hpp"
#include "fused_baseline.hpp"
#include "mk/attention.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/format.hpp"

namespace mkbench {
namespace {

struct Args {
  uint32_t ranks = 0, ranksPerNode = 0, batch = 1, qHeads = 32, kvHeads = 8, baselineCtas = 8;
  std::vector<uint64_t> seqPerRank{4096, 8192};
  std::string mask = "causal", transport = "auto", json;
  bool shareGpus = false, check = false;
  uint64_t iters = 5, warmup = 2, reps = 5;
};

/// One rank's memory: its inputs, the fused op's output, and the layered program's ring slots, part and output.
struct RankMem {
  Dev q, kv, out, ring, part, outLayered;
  RankMem(uint64_t qBytes, uint64_t kvBytes, uint64_t outBytes)
      : q(qBytes), kv(kvBytes), out(outBytes), ring(2 * kvBytes), part(outBytes), outLayered(outBytes) {}
  /// Address of element `offset` of the generated schedule's buffer `name` (out: the layered program's own).
  char* at(const std::string& name, uint64_t offset) const {
    if (name == "q") return q.c() + 2 * offset;
    if (name == "kv") return kv.c() + 2 * offset;
    if (name == "ring") return ring.c() + 2 * offset;
    if (name == "part") return part.c() + 4 * offset;
    return outLayered.c() + 4 * offset;
  }
};

/// A compute step of the generated schedule, as the layered program runs it with standalone kernels.
struct LayeredStep {
  bool merge = false;
  mk::AttentionShape shape;  ///< attention: its shape
  std::string a, b, dst;     ///< buffer names
  uint64_t aOff = 0, bOff = 0, dstOff = 0;
  uint64_t rows = 0;  ///< merge: rows of headDim + 1
};

/// Rank `r`'s compute steps of `s` grouped by ring step (a Wait on the arrival of a block starts the next one).
std::vector<std::vector<LayeredStep>> layeredSteps(const mk::Schedule& s, uint32_t r) {
  std::vector<std::vector<LayeredStep>> steps(1);
  for (const mk::Step& st : s.lanes[r][0].steps) {
    const auto name = [&](const mk::BufRef& ref) { return s.buffers[ref.buffer].name; };
    if (st.kind == mk::StepKind::Wait) {
      steps.emplace_back();
    } else if (st.kind == mk::StepKind::Attention) {
      LayeredStep x;
      x.shape = s.attentions[st.aux];
      x.a = name(st.a), x.b = name(st.b), x.dst = name(st.dst);
      x.aOff = st.a.offset, x.bOff = st.b.offset, x.dstOff = st.dst.offset;
      steps.back().push_back(x);
    } else if (st.kind == mk::StepKind::Reduce) {
      LayeredStep x;
      x.merge = true;
      x.a = name(st.a), x.b = name(st.b), x.dst = name(st.dst);
      x.aOff = st.a.offset, x.bOff = st.b.offset, x.dstOff = st.dst.offset;
      x.rows = st.count / (uint64_t{st.aux} + 1);
      x.shape.headDim = st.aux;
      steps.back().push_back(x);
    }
  }
  return steps;
}

/// The layered program's transfer: every rank puts `src` into the next rank's `dst` (a proxy put across nodes) and
/// waits for the block from the previous rank. One rank passes nothing: an empty schedule, never run.
mk::Schedule ringShift(const std::vector<uint32_t>& nodeOf, uint64_t count) {
  const auto R = static_cast<uint32_t>(nodeOf.size());
  mk::Schedule s;
  if (R < 2) return s;
  s.nRanks = R;
  s.nodeOf = nodeOf;
  s.nFlags = 1;
  s.buffers = {{"src", mk::DType::BFloat16, mk::BufferKind::Input, std::vector<uint64_t>(R, count)},
               {"dst", mk::DType::BFloat16, mk::BufferKind::Output, std::vector<uint64_t>(R, count)}};
  s.lanes.resize(R);
  for (uint32_t r = 0; r < R; ++r) {
    const uint32_t next = (r + 1) % R;
    const bool remote = nodeOf[next] != nodeOf[r];
    mk::Step put;
    put.kind = remote ? mk::StepKind::ProxyPut : mk::StepKind::Put;
    put.count = count;
    put.dst = mk::bufRef(next, 1, 0);
    put.a = mk::bufRef(r, 0, 0);
    put.flags = mk::kStepSignal;
    put.flag = mk::FlagRef{next, 0};
    put.value = 1;
    mk::Step wait;
    wait.kind = mk::StepKind::Wait;
    wait.flag = mk::FlagRef{r, 0};
    wait.value = 1;
    s.lanes[r].push_back(mk::Lane{remote ? mk::LaneRole::InterSend : mk::LaneRole::Intra, 1, {put, wait}});
  }
  s.info.op = "ring-shift";
  mk::validate(s);
  return s;
}

/// The worst |fused - layered| over tolerance of one rank's output rows; counts the elements over it.
double compareOutputs(const std::vector<float>& fused, const std::vector<float>& layered, uint32_t d, uint64_t* bad) {
  double worst = 0;
  for (uint64_t i = 0; i < fused.size(); ++i) {
    const bool lse = i % (d + 1) == d;
    const double tol = lse ? 1e-4 * (1 + std::fabs(layered[i])) : 2.5e-3;
    const double e = std::fabs(double{fused[i]} - layered[i]);
    const double ratio = std::isfinite(e) ? e / tol : 1e30;
    worst = std::max(worst, ratio);
    *bad += ratio > 1;
  }
  return worst;
}

/// The layered program of this process's ranks: per ring step the transfer of the block held to the next rank, then
/// the attention kernels and merges of the step, one after the other on each rank's stream.
struct LayeredProgram {
  const Launch& launch;
  std::vector<std::unique_ptr<RankMem>>& mem;
  Streams& st;
  mk::Schedule shift;
  std::vector<std::vector<std::vector<LayeredStep>>> steps;  ///< [local rank][ring step]
  uint64_t kvCount = 0;
  uint32_t ranks = 0;

  LayeredProgram(const Launch& l, std::vector<std::unique_ptr<RankMem>>& m, Streams& s, const mk::Schedule& sched,
                 uint64_t kvElems)
      : launch(l), mem(m), st(s), shift(ringShift(sched.nodeOf, kvElems)), kvCount(kvElems), ranks(sched.nRanks) {
    for (std::size_t i = 0; i < launch.devs.size(); ++i)
      steps.push_back(layeredSteps(sched, static_cast<uint32_t>(launch.firstRank + i)));
  }
  /// Ring step t's transfer: block t (own kv, or ring slot t % 2) into the next rank's slot (t + 1) % 2.
  void transfer(std::vector<mk::Communicator>& comms, uint32_t t) {
    mk::groupStart();
    for (std::size_t i = 0; i < comms.size(); ++i) {
      const RankMem& m = *mem[i];
      const void* src = t == 0 ? m.kv.p : m.ring.c() + (t % 2) * kvCount * 2;
      comms[i].execute(shift, {src}, {m.ring.c() + ((t + 1) % 2) * kvCount * 2}, st.s[i]);
    }
    mk::groupEnd();
  }
  /// Ring step t's attention kernels and merges.
  void compute(uint32_t t) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      MK_CUDA_CHECK(cudaSetDevice(launch.devs[i]));
      const RankMem& m = *mem[i];
      for (const LayeredStep& x : steps[i][t]) {
        if (x.merge)
          mk::lseMergeDevice(reinterpret_cast<float*>(m.at(x.dst, x.dstOff)),
                             reinterpret_cast<const float*>(m.at(x.a, x.aOff)),
                             reinterpret_cast<const float*>(m.at(x.b, x.bOff)), x.rows, x.shape.headDim, st.s[i]);
        else
          mk::attentionForward(x.shape, mk::DType::BFloat16, m.at(x.a, x.aOff), m.at(x.b, x.bOff),
                               reinterpret_cast<float*>(m.at(x.dst, x.dstOff)), st.s[i]);
      }
    }
  }
  /// One whole call: what a framework runs.
  void run(std::vector<mk::Communicator>& comms) {
    for (uint32_t t = 0; t < ranks; ++t) {
      if (t + 1 < ranks) transfer(comms, t);
      compute(t);
    }
  }
};

}  // namespace

int ringAttentionMain(int argc, char** argv, const std::string& command) {
  Args a;
  CLI::App app{"mk-bench ring-attention: ring attention on the resident kernel against the layered program"};
  app.add_option("--ranks", a.ranks, "ranks of this process (default: one per visible GPU); more than the GPUs share")
      ->check(CLI::PositiveNumber);
  app.add_option("--ranks-per-node", a.ranksPerNode, "one process per rank: ranks per node (0: the launcher's)");
  app.add_option("--transport", a.transport, "one process per rank: the proxy's transport between nodes")
      ->check(CLI::IsMember({"auto", "socket", "ibverbs"}));
  app.add_flag("--share-gpus", a.shareGpus, "one process per rank: ranks share GPUs (CUDA MPS)");
  app.add_option("--seq-per-rank", a.seqPerRank, "tokens per rank (the sequence is ranks x this)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("-b,--batch", a.batch, "batch")->check(CLI::PositiveNumber);
  app.add_option("--q-heads", a.qHeads, "query heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", a.kvHeads, "key / value heads (divides --q-heads)")->check(CLI::PositiveNumber);
  app.add_option("--mask", a.mask, "causal (zigzag placement), none, or both")
      ->check(CLI::IsMember({"causal", "none", "both"}));
  app.add_option("--baseline-ctas", a.baselineCtas,
                 "worker CTAs of the layered program's communication-only communicator (its kernels get the rest)")
      ->check(CLI::PositiveNumber);
  app.add_option("--iters", a.iters, "calls per timed loop")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", a.warmup, "untimed calls before timing");
  app.add_option("--reps", a.reps, "timed loops; the median is reported")->check(CLI::PositiveNumber);
  app.add_flag("--check", a.check, "compare every output element of the fused op with the layered program's");
  app.add_option("--json", a.json, "write measurement records (mkernel.measurement.v1) to this file, atomically");
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench ring-attention"); rc != mk::cli::kContinue) return rc;
  try {
    const int available = mk::requireCudaDevices();
    const bool multi = mk::launchedAsRanks();
    Launch launch;
    if (multi) {
      launch = launchFromEnvironment();
    } else {
      std::vector<int> devs;
      const uint32_t n = a.ranks ? a.ranks : static_cast<uint32_t>(available);
      for (uint32_t r = 0; r < n; ++r) devs.push_back(static_cast<int>(r % static_cast<uint32_t>(available)));
      launch = launchLocal(std::move(devs));
    }
    const auto R = static_cast<uint32_t>(launch.nRanks);
    const std::size_t local = launch.devs.size();
    const bool shared = multi ? a.shareGpus : R > static_cast<uint32_t>(available);
    mk::CommConfig base;
    base.shareGpus = shared;
    base.ranksPerNode = a.ranksPerNode;
    base.transport = proxyTransport(a.transport);
    mk::CommConfig fusedCfg = base, layeredCfg = base;
    fusedCfg.computeLanes = true;
    layeredCfg.workerCtas = a.baselineCtas;
    cudaDeviceProp prop{};
    MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, launch.devs[0]));
    std::vector<bool> masks;
    if (a.mask != "none") masks.push_back(true);
    if (a.mask != "causal") masks.push_back(false);
    if (launch.leader()) {
      std::printf(
          "# mk-bench ring-attention: %u rank(s)%s on %s (%d SMs)%s, bf16, D 128, B %u, heads %u/%u, iters %llu, "
          "reps %llu\n",
          R, multi ? " (one process per rank)" : "", prop.name, prop.multiProcessorCount,
          shared ? ", ranks SHARE the GPU" : "", a.batch, a.qHeads, a.kvHeads, static_cast<unsigned long long>(a.iters),
          static_cast<unsigned long long>(a.reps));
      std::printf("%8s %6s %6s %8s %11s %11s %10s %10s %10s %8s %8s %6s\n", "L", "causal", "nodes", "lanes", "fused_us",
                  "layered_us", "attn_us", "comm_us", "bound_us", "speedup", "TFLOPs", "check");
    }
    mk::MeasurementFile file = newMeasurementFile(multi ? 1 : available, "", command);
    const uint64_t seed = launch.fromLeader(std::random_device{}());
    int rc = 0;
    for (const uint64_t L : a.seqPerRank)
      for (const bool causal : masks) {
        mk::RingAttentionSpec spec;
        spec.batch = a.batch;
        spec.qHeads = a.qHeads;
        spec.kvHeads = a.kvHeads;
        spec.headDim = 128;
        spec.seq = L * R;
        spec.causal = causal;
        const uint64_t qCount = uint64_t{a.batch} * L * a.qHeads * 128,
                       kvCount = 2 * uint64_t{a.batch} * L * a.kvHeads * 128;
        const uint64_t outCount = uint64_t{a.batch} * L * a.qHeads * 129;
        std::vector<std::unique_ptr<RankMem>> mem;
        for (std::size_t i = 0; i < local; ++i) {
          MK_CUDA_CHECK(cudaSetDevice(launch.devs[i]));
          mem.push_back(std::make_unique<RankMem>(qCount * 2, kvCount * 2, outCount * 4));
          fillRandomBf16(mem[i]->q.p, qCount, seed + 2 * (launch.firstRank + i));
          fillRandomBf16(mem[i]->kv.p, kvCount, seed + 2 * (launch.firstRank + i) + 1);
        }
        Streams st(launch.devs);
        const BaselineTiming timing{a.iters, a.warmup, a.reps};
        // ---- fused: Communicator::ringAttention
        double fusedUs = 0;
        uint32_t nodes = 1;
        std::vector<uint32_t> nodeOf;
        mk::RingAttentionPlan plan;
        {
          std::vector<mk::Communicator> comms = createCommunicators(launch, fusedCfg);
          nodes = comms[0].topology().nodes;
          nodeOf = comms[0].topology().layout(R);
          plan = comms[0].ringAttentionPlan(spec);
          fusedUs = launch.maxOverProcesses(timeLoopUs(timing, st, true, [&] {
            for (std::size_t i = 0; i < local; ++i)
              comms[i].ringAttention(spec, mem[i]->q.p, mem[i]->kv.p, static_cast<float*>(mem[i]->out.p), st.s[i]);
          }));
          st.sync();
        }
        // ---- layered: transfers and standalone kernels, the schedule's own compute steps. The whole program is
        // timed last, so that its last call leaves a complete output for the check.
        const mk::Schedule sched = mk::generateRingAttention(spec, nodeOf);
        double layeredUs = 0, attnUs = 0, commUs = 0;
        {
          std::vector<mk::Communicator> comms = createCommunicators(launch, layeredCfg);
          LayeredProgram layered(launch, mem, st, sched, kvCount);
          attnUs = launch.maxOverProcesses(timeLoopUs(timing, st, false, [&] {
            for (uint32_t t = 0; t < R; ++t) layered.compute(t);
          }));
          commUs = launch.maxOverProcesses(timeLoopUs(timing, st, false, [&] {
            for (uint32_t t = 0; t + 1 < R; ++t) layered.transfer(comms, t);
          }));
          layeredUs = launch.maxOverProcesses(timeLoopUs(timing, st, false, [&] { layered.run(comms); }));
          st.sync();
        }
        // ---- check, report
        uint64_t bad = 0;
        double worst = 0;
        if (a.check) {
          for (std::size_t i = 0; i < local; ++i) {
            std::vector<float> f(outCount), l(outCount);
            MK_CUDA_CHECK(cudaMemcpy(f.data(), mem[i]->out.p, outCount * 4, cudaMemcpyDeviceToHost));
            MK_CUDA_CHECK(cudaMemcpy(l.data(), mem[i]->outLayered.p, outCount * 4, cudaMemcpyDeviceToHost));
            worst = std::max(worst, compareOutputs(f, l, 128, &bad));
          }
          worst = launch.maxOverProcesses(worst);
          bad = static_cast<uint64_t>(launch.maxOverProcesses(static_cast<double>(bad)));
          if (bad != 0) rc = 1;
        }
        double flops = 0;  // one rank's (the zigzag gives every rank as many unmasked pairs)
        for (const mk::Step& x : sched.lanes[0][0].steps)
          if (x.kind == mk::StepKind::Attention) flops += mk::attentionFlops(sched.attentions[x.aux]);
        const double bound = std::max(attnUs, commUs), tflops = flops / fusedUs * 1e-6;
        if (launch.leader()) {
          const std::string lanes = std::to_string(plan.computeCtas) + "/" + std::to_string(plan.sendCtas);
          std::printf("%8llu %6s %6u %8s %11.1f %11.1f %10.1f %10.1f %10.1f %8.2f %8.1f %6s\n",
                      static_cast<unsigned long long>(L), causal ? "yes" : "no", nodes, lanes.c_str(), fusedUs,
                      layeredUs, attnUs, commUs, bound, layeredUs / fusedUs, tflops,
                      !a.check   ? "-"
                      : bad == 0 ? "ok"
                                 : "FAIL");
          std::fflush(stdout);
        }
        mk::MeasurementRecord rec;
        rec.op = "ring-attention";
        rec.impl = "mkernel";
        rec.algo = spec.causal ? "ring-zigzag" : "ring";
        rec.dtype = "bfloat16";
        rec.ranks = R;
        rec.bytes = (R - 1) * kvCount * 2;  // K / V bytes each rank receives per call
        rec.timeUs = fusedUs;
        rec.algbwGBs = static_cast<double>(rec.bytes) / fusedUs * 1e-3;
        rec.iters = a.iters;
        rec.stat = "median";
        rec.extra["batch"] = std::to_string(a.batch);
        rec.extra["seq_per_rank"] = std::to_string(L);
        rec.extra["q_heads"] = std::to_string(a.qHeads);
        rec.extra["kv_heads"] = std::to_string(a.kvHeads);
        rec.extra["head_dim"] = "128";
        rec.extra["causal"] = causal ? "true" : "false";
        rec.extra["nodes"] = std::to_string(nodes);
        rec.extra["shared_gpu"] = shared ? "true" : "false";
        rec.extra["processes"] = std::to_string(multi ? R : 1);
        if (nodes > 1) rec.extra["transport"] = mkbench::quoted(a.transport);
        rec.extra["layered_us"] = mk::strprintf("%.3f", layeredUs);
        rec.extra["attn_us"] = mk::strprintf("%.3f", attnUs);
        rec.extra["comm_us"] = mk::strprintf("%.3f", commUs);
        rec.extra["bound_us"] = mk::strprintf("%.3f", bound);
        rec.extra["speedup"] = mk::strprintf("%.4f", layeredUs / fusedUs);
        rec.extra["ctas"] = std::to_string(plan.workerCtas);
        rec.extra["compute_ctas"] = std::to_string(plan.computeCtas);
        rec.extra["comm_ctas"] = std::to_string(plan.sendCtas);
        rec.extra["compute_weight"] = std::to_string(plan.spec.computeCtas);
        rec.extra["baseline_ctas"] = std::to_string(a.baselineCtas);
        rec.extra["flops"] = std::to_string(static_cast<uint64_t>(flops));
        rec.extra["tflops_per_rank"] = mk::strprintf("%.3f", tflops);
        if (a.check) {
          rec.extra["check"] = bad == 0 ? "true" : "false";
          rec.extra["worst_error_over_tolerance"] = mk::strprintf("%.4f", worst);
        }
        file.records.push_back(rec);
      }
    if (launch.leader() && !a.json.empty()) mk::saveMeasurementFile(file, a.json);
    return rc;
  } catch (const mk::Error& e) {
    std::fprintf(stderr, "mk-bench ring-attention: %s\n", e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench ring-attention: %s\n", e.what());
    return 2;
  }
}

}  // namespace mkbench
