// mk-bench — nccl-tests-style benchmark of the resident-kernel engine, with NCCL measured in the same run.
//
//   mk-bench allreduce -b 8 -e 512M -f 2 [-d float32] [--redop sum] [--algo auto|all|one-shot,ring,...]
//            [--baseline nccl] [--check] [--json out.json] [--trace t.json] [-n iters] [-w warmup]
//
// Timing (as nccl-tests): per size, CUDA events around `iters` back-to-back ops on one stream per GPU after
// `warmup` ops; mkernel submits the loop as one group, so only the last op makes the stream wait, and the
// closing event is recorded after that wait. Reported time = median over `reps` loops of (loop time /
// iters), the slowest GPU's. NCCL runs after the engine has been shut down (so neither disturbs the other)
// with the same buffers, sizes and loop.
//
// One process drives every visible GPU, or — launched by torchrun (RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR
// MASTER_PORT) or mpirun — each process drives the GPU of its node rank, rendezvous and GPU chosen as
// Communicator::createFromEnvironment chooses them (mk::bootstrapFromEnvironment; NCCL then through
// ncclCommInitRank); rank 0 prints and writes the files, times are the slowest rank's.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_cli.hpp"
#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_launch.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify.hpp"
#include "mk/io/measurement.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"
#include "nccl_loader.hpp"

namespace {

using mk::CollOp;
using mk::DType;
using mk::RedOp;
using mkbench::Buffers;
using mkbench::hostNs;
using mkbench::median;
using mkbench::percentile;
using mkbench::quoted;
using mkbench::Streams;

using mkbench::Args;

using mkbench::allGatherValue;
using mkbench::Launch;

bool gQuiet = false;  ///< ranks other than 0 of a multi-process run print nothing

/// printf on the leading process only.
void say(const char* fmt, ...) {
  if (gQuiet) return;
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
}

/// One collective of the sweep: spec + where each rank's send / recv point.
struct Case {
  mk::CollectiveSpec spec;
  std::vector<const void*> send;
  std::vector<void*> recv;
  std::vector<uint64_t> recvOffset;  ///< bytes from the recv buffer's base (in place)
};

Case makeCase(const Args& a, CollOp op, DType dt, RedOp red, uint64_t count, Buffers& buf, int firstRank) {
  Case c;
  c.spec.op = op;
  c.spec.dtype = dt;
  c.spec.redop = red;
  c.spec.count = count;
  c.spec.root = a.root;
  const uint64_t es = mk::dtypeSize(dt);
  for (size_t r = 0; r < buf.devices.size(); ++r) {
    const uint64_t rank = static_cast<uint64_t>(firstRank) + r;  // in-place offsets are by global rank
    uint64_t inOff = 0, outOff = 0;
    if (a.inPlace) {
      if (op == CollOp::AllGather) inOff = rank * count * es;
      if (op == CollOp::ReduceScatter) outOff = rank * count * es;
      c.send.push_back(buf.recv[r] + inOff);
    } else {
      c.send.push_back(buf.send[r]);
    }
    c.recv.push_back(buf.recv[r] + outOff);
    c.recvOffset.push_back(outOff);
  }
  return c;
}

/// Fresh small-integer inputs (every sum exact, so the check is bit-exact), the output poisoned. Copies
/// go through the bench's non-blocking streams and are waited for: the legacy stream's cudaMemcpy from
/// pageable memory may return before the data landed, and nothing would order it before the op.
/// Every rank's input is made (the reference needs them all); this process uploads its own ranks'.
std::vector<std::vector<float>> fillInputs(const Case& c, const Launch& l, Streams& st, uint64_t seed) {
  const uint32_t n = static_cast<uint32_t>(l.nRanks);
  const uint64_t inCount = mk::inputCount(c.spec, n), outCount = mk::outputCount(c.spec, n);
  const uint64_t es = mk::dtypeSize(c.spec.dtype);
  std::vector<std::vector<float>> in(n);
  for (uint32_t q = 0; q < n; ++q) {
    std::mt19937_64 rng(seed * 7919 + q);
    std::uniform_int_distribution<int> d(-8, 8);
    in[q].resize(inCount);
    for (uint64_t i = 0; i < inCount; ++i) in[q][i] = static_cast<float>(d(rng));
  }
  for (size_t r = 0; r < l.devs.size(); ++r) {
    const auto& mine = in[static_cast<size_t>(l.firstRank) + r];
    std::vector<uint8_t> bytes(inCount * es);
    for (uint64_t i = 0; i < inCount; ++i) mk::storeElement(c.spec.dtype, bytes.data(), i, mine[i]);
    MK_CUDA_CHECK(cudaSetDevice(l.devs[r]));
    MK_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(c.recv[r]) - c.recvOffset[r], 0xFF,
                                  std::max(outCount * es + c.recvOffset[r], inCount * es), st.s[r]));
    MK_CUDA_CHECK(
        cudaMemcpyAsync(const_cast<void*>(c.send[r]), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, st.s[r]));
    MK_CUDA_CHECK(cudaStreamSynchronize(st.s[r]));
  }
  return in;
}

/// Compare every output element with the CPU reference; returns the number of wrong elements.
/// Summed over every process: each compares its own ranks' outputs.
uint64_t countWrong(const Case& c, const Launch& l, Streams& st, const std::vector<std::vector<float>>& in) {
  const uint32_t n = static_cast<uint32_t>(l.nRanks);
  const auto expected = mk::referenceCollective(c.spec, n, in);
  const uint64_t outCount = mk::outputCount(c.spec, n), es = mk::dtypeSize(c.spec.dtype);
  uint64_t wrong = 0;
  std::vector<uint8_t> got(outCount * es);
  for (size_t r = 0; r < l.devs.size(); ++r) {
    const auto& want = expected[static_cast<size_t>(l.firstRank) + r];
    MK_CUDA_CHECK(cudaSetDevice(l.devs[r]));
    MK_CUDA_CHECK(cudaMemcpyAsync(got.data(), c.recv[r], got.size(), cudaMemcpyDeviceToHost, st.s[r]));
    MK_CUDA_CHECK(cudaStreamSynchronize(st.s[r]));
    for (uint64_t i = 0; i < outCount; ++i)
      if (mk::loadElement(c.spec.dtype, got.data(), i) != want[i]) ++wrong;
  }
  if (!l.boot) return wrong;
  uint64_t sum = 0;
  for (uint64_t x : allGatherValue(*l.boot, wrong)) sum += x;
  return sum;
}

struct Row {
  std::string impl, algo;
  uint64_t bytes = 0, count = 0;
  double timeUs = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;
  uint64_t iters = 0;
  uint32_t chunks = 0, channels = 0;
};

void printHeader(const char* what) {
  say("#\n# %s\n#%12s %12s %9s %7s %8s %-18s %10s %12s %12s %7s\n", what, "size(B)", "count", "type", "redop", "impl",
      "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
}

void printRow(const Row& r, const Args& a) {
  say(" %12llu %12llu %9s %7s %8s %-18s %10.2f %12.2f %12.2f %7s\n", static_cast<unsigned long long>(r.bytes),
      static_cast<unsigned long long>(r.count), a.dtype.c_str(), a.redop.c_str(), r.impl.c_str(), r.algo.c_str(),
      r.timeUs, r.algbw, r.busbw, r.wrong < 0 ? "-" : std::to_string(r.wrong).c_str());
  std::fflush(stdout);
}

void submitMk(std::vector<mk::Communicator>& comms, const Case& c, const std::vector<cudaStream_t>& s,
              const mk::CollOptions& opt) {
  for (size_t r = 0; r < comms.size(); ++r) {
    const auto& sp = c.spec;
    switch (sp.op) {
      case CollOp::AllReduce: comms[r].allReduce(c.send[r], c.recv[r], sp.count, sp.dtype, sp.redop, s[r], opt); break;
      case CollOp::AllGather: comms[r].allGather(c.send[r], c.recv[r], sp.count, sp.dtype, s[r], opt); break;
      case CollOp::ReduceScatter:
        comms[r].reduceScatter(c.send[r], c.recv[r], sp.count, sp.dtype, sp.redop, s[r], opt);
        break;
      case CollOp::Broadcast: comms[r].broadcast(c.send[r], c.recv[r], sp.count, sp.dtype, sp.root, s[r], opt); break;
      case CollOp::AllToAll: comms[r].allToAll(c.send[r], c.recv[r], sp.count, sp.dtype, s[r], opt); break;
    }
  }
}

int run(const Args& a, const std::string& commandLine) {
  const CollOp op = mk::requireCollOp(a.op, "collective");
  const DType dt = mk::requireDType(a.dtype);
  const RedOp red = mk::requireRedOp(a.redop);
  const std::vector<uint64_t> range = mk::parseSweep(a.sweep);  // every word checked by mkbench::checkArgs already

  Launch launch;
  if (mk::launchedAsRanks()) {
    if (a.gpus > 0)
      throw mk::Error(
          mk::ErrorCode::InvalidArgument,
          "--gpus: this process was started as one rank (RANK / WORLD_SIZE or an MPI launcher's are set), and "
          "each rank drives the GPU of its node rank; run without torchrun / mpirun to pick GPUs");
    if (!a.trace.empty())
      throw mk::Error(mk::ErrorCode::InvalidArgument,
                      "--trace is written from one process driving every GPU (run mk-bench without torchrun / mpirun)");
  }
  const int available = mk::requireCudaDevices();
  if (mk::launchedAsRanks()) {
    launch = mkbench::launchFromEnvironment();
    gQuiet = !launch.leader();
  } else {
    const int ranks = a.gpus > 0 ? a.gpus : available;
    if (ranks > available)
      throw mk::Error(mk::ErrorCode::InvalidArgument, "--gpus " + std::to_string(ranks) + " but only " +
                                                          std::to_string(available) + " device(s) visible");
    std::vector<int> devs;
    for (int i = 0; i < ranks; ++i) devs.push_back(i);
    launch = mkbench::launchLocal(std::move(devs));
  }
  const std::vector<int>& devs = launch.devs;
  const int n = launch.nRanks;
  const uint64_t es = mk::dtypeSize(dt);
  const bool perRankCount = op == CollOp::AllGather || op == CollOp::ReduceScatter || op == CollOp::AllToAll;

  // Sizes as nccl-tests: the larger buffer of one rank; count per its conventions.
  std::vector<std::pair<uint64_t, uint64_t>> sizes;  // bytes, count
  for (const uint64_t b : range) {
    const uint64_t count = b / es / (perRankCount ? static_cast<uint64_t>(n) : 1);
    if (count > 0) sizes.emplace_back(count * es * (perRankCount ? static_cast<uint64_t>(n) : 1), count);
  }
  if (sizes.empty())
    throw mk::Error(mk::ErrorCode::InvalidArgument, "no size of " + a.sweep + " holds one element per rank");
  const uint64_t bufBytes = sizes.back().first + 256;

  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, devs[0]));
  // Ranks that share GPUs (one host): the GPUs are the visible ones they use, not one per rank.
  const int gpusUsed = a.shareGpus ? std::min(n, available) : n;
  mk::MeasurementFile mf = mkbench::newMeasurementFile(gpusUsed, a.link, commandLine);
  if (launch.multiProcess()) mf.system["processes"] = std::to_string(n);
  if (a.shareGpus) mf.system["ranks_share_gpu"] = gpusUsed < n ? "true" : "false";

  say("# mk-bench %s: %d x %s%s, dtype %s, redop %s, %s, iters %llu, warmup %llu, reps %llu\n", a.op.c_str(), n,
      prop.name,
      gpusUsed < n ? (launch.multiProcess() ? " (one process per rank, ranks sharing GPUs)" : " (ranks sharing GPUs)")
      : launch.multiProcess() ? " (one process per GPU)"
                              : "",
      a.dtype.c_str(), a.redop.c_str(), a.inPlace ? "in place" : "out of place",
      static_cast<unsigned long long>(a.iters), static_cast<unsigned long long>(a.warmup),
      static_cast<unsigned long long>(a.reps));
  Buffers buf(devs, bufBytes);
  Streams st(devs);
  std::vector<Row> rows;
  uint32_t nodesOfRun = 1;     // set once the communicator exists
  std::string transportOfRun;  // the proxy's transport on several nodes
  auto addRecord = [&](const Row& r, const char* stat, const std::vector<std::pair<std::string, std::string>>& extra) {
    mk::MeasurementRecord m;
    m.op = toString(op);
    m.impl = r.impl;
    m.algo = r.algo;
    m.dtype = a.dtype;
    m.ranks = static_cast<uint32_t>(n);
    m.bytes = r.bytes;
    m.timeUs = r.timeUs;
    m.algbwGBs = r.algbw;
    m.busbwGBs = r.busbw;
    m.iters = r.iters;
    m.stat = stat;
    m.extra["count"] = std::to_string(r.count);
    if (nodesOfRun > 1 && r.impl == "mkernel") {
      m.extra["nodes"] = std::to_string(nodesOfRun);
      m.extra["transport"] = mkbench::quoted(transportOfRun);
    }
    m.extra["redop"] = quoted(a.redop);
    m.extra["inplace"] = a.inPlace ? "true" : "false";
    if (r.wrong >= 0) m.extra["wrong"] = std::to_string(r.wrong);
    for (const auto& kv : extra) m.extra[kv.first] = kv.second;
    mf.records.push_back(m);
  };
  const double busFactor = mk::busBwFactor(op, static_cast<uint32_t>(n));

  // ---- mkernel --------------------------------------------------------------------------------------
  {
    mk::CommConfig cfg;
    cfg.workerCtas = a.workers;
    cfg.threadsPerCta = a.threads;
    cfg.profile = a.profile;
    cfg.ranksPerNode = a.ranksPerNode;
    cfg.shareGpus = a.shareGpus;
    cfg.transport = mkbench::proxyTransport(a.transport);
    std::vector<mk::Communicator> comms = mkbench::createCommunicators(launch, cfg);
    nodesOfRun = comms[0].topology().nodes;
    transportOfRun = comms[0].interNodeTransport();
    if (nodesOfRun > 1) {
      mf.system["nodes"] = std::to_string(nodesOfRun);
      mf.system["transport"] = mkbench::quoted(transportOfRun);
    }
    std::vector<std::string> algos;
    {
      std::string list = a.algo == "all" ? "auto" : a.algo;
      if (a.algo == "all")
        for (mk::Algorithm algo : mk::algorithmsFor(op)) list += std::string(",") + mk::toString(algo);
      std::stringstream ss(list);
      for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) algos.push_back(item);
    }
    say("# mkernel: %u worker CTAs x %u threads per GPU, topology %s, %u node(s)%s%s\n", comms[0].workerCtas(),
        a.threads, comms[0].topology().name.c_str(), nodesOfRun, nodesOfRun > 1 ? ", transport " : "",
        nodesOfRun > 1 ? transportOfRun.c_str() : "");
    say("# auto costs against: %s\n", comms[0].profileSource().c_str());

    // Host enqueue -> first step on the GPU: isolated small ops on an idle engine. Host and GPU clocks
    // are related by a ping-pong calibration (ClockSync); the op's first step is the %globaltimer stamp
    // taken by lane 0's first CTA as it starts its first step.
    if (a.latencyProbes > 0 && launch.multiProcess()) {
      say("# host enqueue -> first step: measured in one process driving every GPU (skipped here)\n");
    } else if (a.latencyProbes > 0) {
      std::vector<mk::ClockSync> cs;
      for (auto& c : comms) cs.push_back(c.calibrateClock(200));
      const uint64_t count = std::max<uint64_t>(1, 8 / es) / 1;
      Case c = makeCase(a, op, dt, red, perRankCount ? 1 : count, buf, launch.firstRank);
      fillInputs(c, launch, st, 1);
      std::vector<double> fromCall, fromReturn, doorbell, publish, hostCall;
      for (uint64_t i = 0; i < a.latencyProbes + 10; ++i) {
        for (auto& x : comms) x.synchronize();
        const double settle = hostNs();
        while (hostNs() - settle < 20000) {
        }
        const uint64_t k = comms[0].nextOpIndex();
        double tLastCall = 0, tReturn = 0;
        for (size_t r = 0; r < comms.size(); ++r) {
          if (r + 1 == comms.size()) tLastCall = hostNs();
          mk::CollOptions opt(a.algo == "all" ? "auto" : algos.front());
          opt.chunks = a.chunks;
          opt.channels = a.channels;
          opt.protocol = *mk::parseProtocol(a.protocol);
          switch (c.spec.op) {
            case CollOp::AllReduce:
              comms[r].allReduce(c.send[r], c.recv[r], c.spec.count, dt, red, st.s[r], opt);
              break;
            case CollOp::AllGather: comms[r].allGather(c.send[r], c.recv[r], c.spec.count, dt, st.s[r], opt); break;
            case CollOp::ReduceScatter:
              comms[r].reduceScatter(c.send[r], c.recv[r], c.spec.count, dt, red, st.s[r], opt);
              break;
            case CollOp::Broadcast:
              comms[r].broadcast(c.send[r], c.recv[r], c.spec.count, dt, a.root, st.s[r], opt);
              break;
            case CollOp::AllToAll: comms[r].allToAll(c.send[r], c.recv[r], c.spec.count, dt, st.s[r], opt); break;
          }
        }
        tReturn = hostNs();
        for (auto& x : comms) x.synchronize();
        if (i < 10) continue;  // warm-up: schedule generation and upload happen on the first call
        double first = 1e300, bell = 1e300, pub = 1e300;
        for (size_t r = 0; r < comms.size(); ++r) {
          const mk::OpTiming t = comms[r].opTiming(k);
          first = std::min(first, static_cast<double>(t.firstStepNs) - cs[r].offsetNs);
          bell = std::min(bell, static_cast<double>(t.doorbellNs) - cs[r].offsetNs);
          pub = std::min(pub, static_cast<double>(t.publishNs) - cs[r].offsetNs);
        }
        fromCall.push_back((first - tLastCall) / 1e3);
        fromReturn.push_back((first - tReturn) / 1e3);
        doorbell.push_back((bell - tLastCall) / 1e3);
        publish.push_back((pub - tLastCall) / 1e3);
        hostCall.push_back((tReturn - tLastCall) / 1e3);
      }
      double unc = 0;
      for (const auto& x : cs) unc = std::max(unc, x.uncertaintyNs / 1e3);
      say("# host enqueue -> first step (%llu isolated %s of %llu B, us): median %.2f  p10 %.2f  p90 %.2f"
          "  | from the call's return: median %.2f | doorbell seen %.2f, published %.2f | host call %.2f"
          " | clock sync +-%.2f\n",
          static_cast<unsigned long long>(a.latencyProbes), a.op.c_str(),
          static_cast<unsigned long long>(c.spec.count * es), median(fromCall), percentile(fromCall, 0.1),
          percentile(fromCall, 0.9), median(fromReturn), median(doorbell), median(publish), median(hostCall), unc);
      mk::MeasurementRecord m;
      m.op = "enqueue-to-first-step";
      m.impl = "mkernel";
      m.algo = mk::toString(comms[0].chooseAlgorithm(op, c.spec.count, dt));
      m.dtype = a.dtype;
      m.ranks = static_cast<uint32_t>(n);
      m.bytes = c.spec.count * es;
      m.timeUs = std::max(1e-3, median(fromCall));
      m.iters = a.latencyProbes;
      m.stat = "median";
      m.extra["collective"] = quoted(a.op);
      m.extra["p10_us"] = std::to_string(percentile(fromCall, 0.1));
      m.extra["p90_us"] = std::to_string(percentile(fromCall, 0.9));
      m.extra["from_return_us"] = std::to_string(median(fromReturn));
      m.extra["doorbell_seen_us"] = std::to_string(median(doorbell));
      m.extra["published_us"] = std::to_string(median(publish));
      m.extra["host_call_us"] = std::to_string(median(hostCall));
      m.extra["clock_uncertainty_us"] = std::to_string(unc);
      m.extra["how"] = quoted(
          "host steady_clock before the last rank's call vs %globaltimer at lane 0's first step, "
          "clocks related by a ping-pong calibration");
      mf.records.push_back(m);
    }

    printHeader("mkernel (resident kernel)");
    for (const auto& [bytes, count] : sizes)
      for (const auto& algoName : algos) {
        Case c = makeCase(a, op, dt, red, count, buf, launch.firstRank);
        mk::CollOptions opt(algoName);
        opt.chunks = a.chunks;
        opt.channels = a.channels;
        opt.protocol = *mk::parseProtocol(a.protocol);
        Row row;
        row.impl = "mkernel";
        row.algo = algoName == "auto" ? "auto:" + std::string(mk::toString(comms[0].chooseAlgorithm(op, count, dt)))
                                      : algoName;
        const mk::GenOptions g = comms[0].chooseGenOptions(op, count, dt, algoName);
        row.chunks = a.chunks ? a.chunks : g.chunks;
        row.channels = a.channels ? a.channels : g.channels;
        row.bytes = bytes;
        row.count = count;
        row.iters = a.iters;
        if (a.check) {
          const auto in = fillInputs(c, launch, st, bytes * 31 + algos.size());
          mk::groupStart();
          submitMk(comms, c, st.s, opt);
          mk::groupEnd();
          st.sync();
          row.wrong = static_cast<int64_t>(countWrong(c, launch, st, in));
        }
        mk::groupStart();
        for (uint64_t i = 0; i < a.warmup; ++i) submitMk(comms, c, st.s, opt);
        mk::groupEnd();
        st.sync();
        std::vector<double> perOp;
        for (uint64_t rep = 0; rep < a.reps; ++rep) {
          st.recordStart();
          mk::groupStart();
          for (uint64_t i = 0; i < a.iters; ++i) submitMk(comms, c, st.s, opt);
          mk::groupEnd();  // the stream waits on the last op; the closing event comes after that wait
          perOp.push_back(launch.maxOverProcesses(st.recordStopAndElapsedMs()) * 1e3 / static_cast<double>(a.iters));
        }
        for (auto& x : comms) x.synchronize();
        row.timeUs = median(perOp);
        row.algbw = static_cast<double>(bytes) / (row.timeUs * 1e3);
        row.busbw = row.algbw * busFactor;
        printRow(row, a);
        rows.push_back(row);
        addRecord(row, "median",
                  {{"reps", std::to_string(a.reps)},
                   {"submit", quoted("batched: one stream wait per loop")},
                   {"chunks", std::to_string(row.chunks)},
                   {"protocol", quoted(a.protocol)},
                   {"channels", std::to_string(row.channels)},
                   {"worker_ctas", std::to_string(comms[0].workerCtas())},
                   {"auto_profile", quoted(comms[0].profileSource())}});
      }

    if (!a.trace.empty()) {
      // A traced engine runs one op per size of the first algorithm; its timings are not reported.
      comms.clear();
      mk::CommConfig tc = cfg;
      tc.trace = true;
      auto traced = mk::Communicator::createLocal(devs, tc);
      for (const auto& [bytes, count] : sizes) {
        (void)bytes;
        Case c = makeCase(a, op, dt, red, count, buf, launch.firstRank);
        mk::CollOptions opt(algos.front() == "all" ? "auto" : algos.front());
        opt.protocol = *mk::parseProtocol(a.protocol);
        submitMk(traced, c, st.s, opt);
        st.sync();
      }
      std::vector<mk::TraceEvent> events;
      for (auto& c : traced) {
        c.synchronize();
        auto e = c.takeTrace();
        events.insert(events.end(), e.begin(), e.end());
      }
      std::ofstream f(a.trace);
      f << mk::traceToChromeJson(events, "mk-bench " + a.op);
      if (!f) throw mk::Error(mk::ErrorCode::IoError, "cannot write trace file " + a.trace);
      say("# trace: %zu step events written to %s\n", events.size(), a.trace.c_str());
    }
  }  // the engine stops here: NCCL runs on quiet GPUs

  // ---- NCCL -----------------------------------------------------------------------------------------
  if (a.baseline == "nccl") {
    std::unique_ptr<mkbench::Nccl> ncclPtr =
        launch.multiProcess() ? std::make_unique<mkbench::Nccl>(devs[0], launch.firstRank, n, *launch.boot)
                              : std::make_unique<mkbench::Nccl>(devs);
    mkbench::Nccl& nccl = *ncclPtr;
    mf.system["nccl"] = quoted(nccl.version());
    say("# NCCL %s from %s (NCCL_NVLS_ENABLE=0)\n", nccl.version().c_str(), nccl.path().c_str());
    printHeader("NCCL");
    for (const auto& [bytes, count] : sizes) {
      Case c = makeCase(a, op, dt, red, count, buf, launch.firstRank);
      Row row;
      row.impl = "nccl";
      row.algo = "";
      row.bytes = bytes;
      row.count = count;
      row.iters = a.iters;
      auto once = [&] { nccl.run(op, c.send, c.recv, count, dt, red, a.root, st.s); };
      if (a.check) {
        const auto in = fillInputs(c, launch, st, bytes * 31 + 7);
        once();
        st.sync();
        row.wrong = static_cast<int64_t>(countWrong(c, launch, st, in));
      }
      for (uint64_t i = 0; i < a.warmup; ++i) once();
      st.sync();
      std::vector<double> perOp;
      for (uint64_t rep = 0; rep < a.reps; ++rep) {
        st.recordStart();
        for (uint64_t i = 0; i < a.iters; ++i) once();
        perOp.push_back(launch.maxOverProcesses(st.recordStopAndElapsedMs()) * 1e3 / static_cast<double>(a.iters));
      }
      row.timeUs = median(perOp);
      row.algbw = static_cast<double>(bytes) / (row.timeUs * 1e3);
      row.busbw = row.algbw * busFactor;
      printRow(row, a);
      rows.push_back(row);
      addRecord(row, "median", {{"reps", std::to_string(a.reps)}});
    }
    // Side by side: the engine's "auto" (else its best algorithm) against NCCL.
    say("#\n# %12s %14s %14s %10s\n", "size(B)", "mkernel(us)", "nccl(us)", "speedup");
    for (const auto& [bytes, count] : sizes) {
      (void)count;
      double mkT = 0, ncT = 0;
      for (const auto& r : rows) {
        if (r.bytes != bytes) continue;
        if (r.impl == "nccl") ncT = r.timeUs;
        if (r.impl == "mkernel" && (r.algo.rfind("auto", 0) == 0 || mkT == 0 || r.timeUs < mkT))
          if (mkT == 0 || r.algo.rfind("auto", 0) == 0) mkT = r.timeUs;
      }
      say("  %12llu %14.2f %14.2f %9.2fx\n", static_cast<unsigned long long>(bytes), mkT, ncT,
          mkT > 0 ? ncT / mkT : 0.0);
    }
  }

  if (!a.json.empty() && launch.leader()) {
    mk::saveMeasurementFile(mf, a.json);
    say("# wrote %zu records to %s\n", mf.records.size(), a.json.c_str());
  }
  int64_t wrongTotal = 0;
  for (const auto& r : rows) wrongTotal += std::max<int64_t>(0, r.wrong);
  if (wrongTotal > 0) {
    std::fprintf(stderr, "mk-bench: %lld wrong elements\n", static_cast<long long>(wrongTotal));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Kernels first launched while the resident kernel runs would wait for it forever under lazy loading.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  std::string cmd = "mk-bench";
  for (int i = 1; i < argc; ++i) cmd += std::string(" ") + argv[i];
  // Subcommands with their own options: mk-bench gemm ..., mk-bench calibrate ...
  if (argc > 1 && std::string(argv[1]) == "gemm") return mkbench::gemmMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && std::string(argv[1]) == "attention") return mkbench::attentionMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && std::string(argv[1]) == "ring-attention") return mkbench::ringAttentionMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && std::string(argv[1]) == "moe-ffn") return mkbench::moeFfnMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && std::string(argv[1]) == "grouped-gemm") return mkbench::groupedGemmMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && std::string(argv[1]) == "calibrate") return mkbench::calibrateMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && std::string(argv[1]) == "calibrate-network")
    return mkbench::calibrateNetworkMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && mk::parseFusedOp(argv[1])) return mkbench::fusedMain(argc - 1, argv + 1, cmd);
  if (argc > 1 && std::string(argv[1]) == "soak") return mkbench::soakMain(argc - 1, argv + 1, cmd);
  Args a;
  if (int rc = mkbench::parseArgs(argc, argv, a); rc != mk::cli::kContinue) return rc;
  return mk::cli::run("mk-bench", [&] { return run(a, cmd); });
}
