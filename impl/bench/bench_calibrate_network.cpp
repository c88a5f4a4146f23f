// mk-bench calibrate-network — the inter-node micro-benchmarks mk-calibrate fits proxyUs and the network's
// alpha / beta from (docs/calibration.md). Two rank processes, one per node:
//
//   impl/tools/launch_ranks.sh [--mps] 2 mk-bench calibrate-network --ranks-per-node 1 [--share-gpus] --json f
//
// Like mk-bench calibrate, every engine benchmark is a hand-written schedule run through the engine itself
// (Communicator::execute), timed with CUDA events around back-to-back ops, the median over --reps loops, and one
// message is isolated by DIFFERENCE between R_lo and R_hi repetitions of the pattern:
//   calib-put-network         both ranks ProxyPut `bytes` with a signal to each other, then wait for the other's:
//                             one message each way at once, as the collectives use the network; the whole time of
//                             a ProxyPut (device push, proxy, transport, remote inbox, flag). Fits network.bwGBs and,
//                             less proxyUs, network.alphaUs.
//   calib-put-network-oneway  the same ProxyPut as a ping-pong (one direction at a time); recorded, not fitted.
//   put-network-streams       with --streams S: the both-ways pattern with the bytes split into S ProxyPuts from S
//                             lanes in flight at once (a fused op's tile messages); recorded, not fitted.
//   calib-proxy               what a signal-only ProxyPut (ping-pong) takes beyond the wire: its one-way time less
//                             the one-way latency of 8 bytes over a plain TCP connection between the same two
//                             processes (the wire alone), both measured in this run; fits proxyUs.
// Next to them, the plain TCP connection's one-way ping-pong time at every size (impl "tcp-loopback", op
// "put-network"): the bandwidth the transport is judged against.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"
#include "net/socket_util.hpp"
#include "proxy_bench_pair.hpp"

namespace mkbench {
namespace {

using mk::Schedule;
using mk::Step;
using mk::StepKind;

struct NetArgs {
  std::string json;
  std::string minSize = "8", maxSize = "256M";
  uint64_t factor = 4;
  uint64_t iters = 20, warmup = 3, reps = 3;
  uint32_t threads = 512;
  uint32_t ranksPerNode = 1;
  bool shareGpus = false;
  std::string transport = "auto";
  uint32_t wireRounds = 2000;
  std::string chunk;              ///< CommConfig::proxyChunkBytes ("" : the default)
  std::vector<uint32_t> streams;  ///< also both ways with the bytes split into this many puts in flight
};

constexpr uint16_t kIn = 0, kOut = 1;

/// Two ranks on two nodes, `reps` repetitions of ProxyPuts of n float32 (n = 0: signals only) on lane 0:
/// ping-pong (rank 0 puts and waits for rank 1's put back: two messages on the critical path per repetition), or
/// both ways (each rank puts to the other, then waits for the other's: one message in each direction at once).
/// `streams` > 1 (both ways only): the n elements split into that many puts from as many lanes, in flight at once,
/// every lane waiting for all of the other rank's before its next repetition.
Schedule proxyPattern(uint64_t n, uint32_t reps, bool bothWays, uint32_t streams = 1) {
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 1};
  const uint64_t elems = std::max<uint64_t>(n, 1);
  s.buffers.push_back({"in", mk::DType::Float32, mk::BufferKind::Input, {elems, elems}});
  s.buffers.push_back({"out", mk::DType::Float32, mk::BufferKind::Output, {elems, elems}});
  s.lanes.assign(2, std::vector<mk::Lane>(streams));
  s.info.op = "custom";
  s.info.algo = n == 0        ? "calib proxy signal ping-pong"
                : streams > 1 ? "calib proxyput both ways, " + std::to_string(streams) + " streams"
                : bothWays    ? "calib proxyput both ways"
                              : "calib proxyput ping-pong";
  s.info.dtype = mk::DType::Float32;
  s.info.count = elems;
  s.nFlags = 1;
  auto put = [&](uint32_t from, uint32_t to) {
    Step p;
    p.kind = StepKind::ProxyPut;
    p.link = mk::LinkClass::Network;
    p.count = n;
    p.dst = {0, to, kOut, 0};
    p.a = {0, from, kIn, 0};
    p.flags = mk::kStepSignal;
    p.flag = {to, 0};
    p.value = 1;
    return p;
  };
  auto wait = [](uint32_t self, uint64_t threshold) {
    Step w;
    w.kind = StepKind::Wait;
    w.flag = {self, 0};
    w.value = threshold;
    return w;
  };
  if (streams > 1) {
    for (uint32_t i = 1; i <= reps; ++i)
      for (uint32_t r = 0; r < 2; ++r)
        for (uint32_t l = 0; l < streams; ++l) {
          Step p = put(r, 1 - r);
          const uint64_t first = n * l / streams;
          p.count = n * (l + 1) / streams - first;
          p.a.offset = first;
          p.dst.offset = first;
          s.lanes[r][l].steps.push_back(p);
          s.lanes[r][l].steps.push_back(wait(r, uint64_t{i} * streams));
        }
    return s;
  }
  for (uint32_t i = 1; i <= reps; ++i) {
    s.lanes[0][0].steps.push_back(put(0, 1));
    s.lanes[0][0].steps.push_back(wait(0, i));
    if (bothWays) {
      s.lanes[1][0].steps.push_back(put(1, 0));
      s.lanes[1][0].steps.push_back(wait(1, i));
    } else {
      s.lanes[1][0].steps.push_back(wait(1, i));
      s.lanes[1][0].steps.push_back(put(1, 0));
    }
  }
  return s;
}

/// printf on the leader (rank 0) only.
__attribute__((format(printf, 2, 3))) void say(bool leader, const char* fmt, ...) {
  if (!leader) return;
  va_list args;
  va_start(args, fmt);
  std::vprintf(fmt, args);
  va_end(args);
}

/// One-way times of a plain TCP ping-pong of `bytes` between the two processes: median over `rounds` of half the
/// round trip, in microseconds (process 0 times; process 1 echoes and returns 0).
double tcpPingPongUs(int fd, int me, uint64_t bytes, uint32_t rounds, std::vector<char>& buf) {
  const auto deadline = mk::net::deadlineAfter(300000);
  std::vector<double> oneWay;
  for (uint32_t i = 0; i < rounds; ++i) {
    if (me == 0) {
      const double t0 = hostNs();
      mk::net::sendAll(fd, buf.data(), bytes, deadline, "tcp probe", "process 1");
      mk::net::recvAll(fd, buf.data(), bytes, deadline, "tcp probe", "process 1");
      oneWay.push_back((hostNs() - t0) / 2e3);
    } else {
      mk::net::recvAll(fd, buf.data(), bytes, deadline, "tcp probe", "process 0");
      mk::net::sendAll(fd, buf.data(), bytes, deadline, "tcp probe", "process 0");
    }
  }
  return me == 0 ? median(oneWay) : 0.0;
}

int run(const NetArgs& a, const std::string& command) {
  const uint64_t minB = mk::parseSize(a.minSize), maxB = mk::parseSize(a.maxSize);
  if (minB < 4 || maxB < minB) throw mk::Error(mk::ErrorCode::InvalidArgument, "need 4 <= -b <= -e (float32 messages)");
  if (a.factor < 2) throw mk::Error(mk::ErrorCode::InvalidArgument, "-f must be >= 2");
  if (a.iters == 0 || a.reps == 0 || a.wireRounds == 0)
    throw mk::Error(mk::ErrorCode::InvalidArgument, "-n, --reps and --wire-rounds must be > 0");
  if (!mk::launchedAsRanks())
    throw mk::Error(mk::ErrorCode::InvalidArgument,
                    "calibrate-network runs as two rank processes, one per node: start it with "
                    "impl/tools/launch_ranks.sh [--mps] 2 mk-bench calibrate-network --ranks-per-node 1 ... (or "
                    "torchrun / mpirun with two ranks)");
  mk::requireCudaDevices();
  mk::RankLaunch launch = mk::bootstrapFromEnvironment(20000);
  mk::Bootstrap& boot = *launch.bootstrap;
  if (boot.size() != 2)
    throw mk::Error(
        mk::ErrorCode::InvalidArgument,
        "calibrate-network needs exactly 2 ranks (one per node); this run has " + std::to_string(boot.size()));
  const int me = boot.rank();
  const bool leader = me == 0;

  std::vector<uint64_t> sizes;
  for (uint64_t b = minB; b <= maxB; b *= a.factor) {
    sizes.push_back(b / 4 * 4);
    if (b > maxB / a.factor) break;
  }
  const uint64_t maxBytes = sizes.back();

  // ---- the wire alone: a plain TCP connection between the two processes, before any engine runs -------------
  const int probe = mk::bench::connectProbe(boot);
  std::vector<char> wireBuf(maxBytes);
  const double wireUs = tcpPingPongUs(probe, me, 8, a.wireRounds, wireBuf);

  const std::vector<int> devs = {launch.device};
  Buffers buf(devs, maxBytes + 256);
  Streams st(devs);
  MK_CUDA_CHECK(cudaSetDevice(launch.device));
  MK_CUDA_CHECK(cudaMemsetAsync(buf.send[0], 0, buf.bytes, st.s[0]));
  st.sync();

  mk::CommConfig cfg;
  cfg.threadsPerCta = a.threads;
  cfg.ranksPerNode = a.ranksPerNode;
  cfg.shareGpus = a.shareGpus;
  if (!a.chunk.empty()) cfg.proxyChunkBytes = mk::parseSize(a.chunk);
  cfg.transport = a.transport == "socket"    ? mk::ProxyTransport::Socket
                  : a.transport == "ibverbs" ? mk::ProxyTransport::IbVerbs
                                             : mk::ProxyTransport::Auto;
  mk::Communicator comm = mk::Communicator::create(boot, launch.device, cfg);
  if (comm.topology().nodes != 2)
    throw mk::Error(mk::ErrorCode::InvalidArgument,
                    "calibrate-network needs the two ranks on two nodes; they are on " +
                        std::to_string(comm.topology().nodes) +
                        " (on one host, pass --ranks-per-node 1 to make each rank a node of its own)");
  const std::string transport = comm.interNodeTransport();

  int gpus = 0;
  MK_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  mk::MeasurementFile mf = newMeasurementFile(a.shareGpus ? std::min(gpus, 2) : 2, "", command);
  mf.system["nodes"] = "2";
  mf.system["processes"] = "2";
  mf.system["transport"] = quoted(transport);
  mf.system["ranks_share_gpu"] = a.shareGpus ? "true" : "false";
  mf.system["cpu"] = quoted(mk::bench::cpuModel());
  mf.system["proxy_chunk_bytes"] = std::to_string(cfg.proxyChunkBytes);
  say(leader,
      "# mk-bench calibrate-network: 2 nodes of 1 rank, transport %s%s, iters %llu (fewer for long ops), reps %llu\n",
      transport.c_str(), a.shareGpus ? ", the ranks share GPUs" : "", static_cast<unsigned long long>(a.iters),
      static_cast<unsigned long long>(a.reps));
  say(leader, "# wire: plain TCP between the two processes, 8 B one way (median of %u ping-pongs): %.3f us\n",
      a.wireRounds, wireUs);
  say(leader,
      "# per message = (T(R_hi) - T(R_lo)) / ((R_hi - R_lo) * messages per repetition: 1 both ways, 2 ping-pong); T = "
      "median per-op time\n");
  say(leader, "# %-24s %12s %6s %6s %12s %12s %12s %10s\n", "op", "bytes", "R_lo", "R_hi", "T_lo(us)", "T_hi(us)",
      "msg(us)", "GB/s");

  // Median per-op time of `s` (this process's stream; both processes run the same loops).
  auto perOpUs = [&](Schedule s, uint64_t iters) {
    mk::fillCostAttributes(s);
    mk::validate(s);
    for (uint64_t i = 0; i < a.warmup; ++i) comm.execute(s, buf.send[0], buf.recv[0], st.s[0]);
    st.sync();
    std::vector<double> perOp;
    for (uint64_t rep = 0; rep < a.reps; ++rep) {
      st.recordStart();
      for (uint64_t i = 0; i < iters; ++i) comm.execute(s, buf.send[0], buf.recv[0], st.s[0]);
      perOp.push_back(st.recordStopAndElapsedMs() * 1e3 / static_cast<double>(iters));
    }
    return median(perOp);
  };
  int notRecorded = 0;
  auto record = [&](const std::string& op, const std::string& impl, const std::string& algo, uint64_t bytes, double us,
                    uint64_t iters, const std::vector<std::pair<std::string, std::string>>& extra) {
    mk::MeasurementRecord m;
    m.op = op;
    m.impl = impl;
    m.algo = algo;
    m.dtype = "float32";
    m.ranks = 2;
    m.bytes = bytes;
    m.timeUs = us;
    m.algbwGBs = static_cast<double>(bytes) / (us * 1e3);
    m.busbwGBs = m.algbwGBs;
    m.iters = iters;
    m.stat = "median";
    m.extra["nodes"] = "2";
    m.extra["transport"] = quoted(impl == "mkernel" ? transport : "tcp");
    for (const auto& [k, v] : extra) m.extra[k] = v;
    mf.records.push_back(m);
  };
  // One point: the ping-pong of n elements at R_lo and R_hi repetitions; returns the per-message time (<= 0: the
  // difference drowned in noise).
  auto point = [&](uint64_t n, bool bothWays, double guessUs, double* tLo, double* tHi, uint32_t* lo, uint32_t* hi,
                   uint64_t* iters, uint32_t streams = 1) {
    const double messages = bothWays ? 1 : 2;  // on the critical path per repetition
    *lo = guessUs < 200 ? 2 : 1;
    *hi = guessUs < 200 ? 18 : 3;
    const double opGuess = guessUs * messages * *hi + 30;
    *iters = std::max<uint64_t>(2, std::min<uint64_t>(a.iters, static_cast<uint64_t>(200000.0 / opGuess)));
    *tLo = perOpUs(proxyPattern(n, *lo, bothWays, streams), *iters);
    *tHi = perOpUs(proxyPattern(n, *hi, bothWays, streams), *iters);
    return (*tHi - *tLo) / (static_cast<double>(*hi - *lo) * messages);
  };

  // ---- calib-proxy: signal-only ProxyPuts -----------------------------------------------------------------
  {
    double tLo = 0, tHi = 0;
    uint32_t lo = 0, hi = 0;
    uint64_t it = 0;
    const double sig = point(0, false, 30, &tLo, &tHi, &lo, &hi, &it);
    const double proxy = sig - wireUs;
    say(leader, "  %-24s %12d %6u %6u %12.3f %12.3f %12.3f %10s\n", "proxyput signal", 0, lo, hi, tLo, tHi, sig, "-");
    say(leader, "  %-24s %12d %6s %6s %12s %12s %12.3f %10s\n", "calib-proxy", 0, "-", "-", "-", "-", proxy, "-");
    if (proxy > 0)
      record("calib-proxy", "mkernel", "signal ping-pong less the wire", 0, proxy, it,
             {{"signal_us", std::to_string(sig)},
              {"wire_us", std::to_string(wireUs)},
              {"op_us_lo", std::to_string(tLo)},
              {"op_us_hi", std::to_string(tHi)},
              {"reps_lo", std::to_string(lo)},
              {"reps_hi", std::to_string(hi)},
              {"how", quoted("one-way time of a signal-only ProxyPut (ping-pong, by difference) less the one-way "
                             "time of 8 bytes over a plain TCP connection between the same processes")}});
    else
      ++notRecorded;
  }
  record("pingpong-network", "tcp-loopback", "plain tcp ping-pong", 8, wireUs, a.wireRounds,
         {{"how", quoted("median of half the round trip of 8 bytes over a plain TCP_NODELAY connection")}});

  // ---- ProxyPuts of every size: both ways at once (calib-put-network, what the collectives do) and ping-pong
  // (calib-put-network-oneway, recorded only), next to the plain TCP ping-pong of the same size ----------------
  for (uint64_t bytes : sizes) {
    const uint64_t n = std::max<uint64_t>(1, bytes / 4);
    const uint64_t recBytes = n * 4;
    const double guess = 30 + static_cast<double>(recBytes) / 3e3;  // ~3 GB/s
    for (const bool bothWays : {true, false}) {
      double tLo = 0, tHi = 0;
      uint32_t lo = 0, hi = 0;
      uint64_t it = 0;
      const double msg = point(n, bothWays, guess, &tLo, &tHi, &lo, &hi, &it);
      const char* op = bothWays ? "calib-put-network" : "calib-put-network-oneway";
      say(leader, "  %-24s %12llu %6u %6u %12.3f %12.3f %12.3f %10.2f\n", op, static_cast<unsigned long long>(recBytes),
          lo, hi, tLo, tHi, msg, msg > 0 ? static_cast<double>(recBytes) / (msg * 1e3) : 0.0);
      if (msg > 0)
        record(op, "mkernel", bothWays ? "both-ways" : "ping-pong", recBytes, msg, it,
               {{"reps_lo", std::to_string(lo)},
                {"reps_hi", std::to_string(hi)},
                {"op_us_lo", std::to_string(tLo)},
                {"op_us_hi", std::to_string(tHi)},
                {"messages_per_rep", bothWays ? "1" : "2"}});
      else
        ++notRecorded;
    }
    // Several puts in flight each way (recorded, not fitted): what a fused op's tile messages see.
    for (const uint32_t streams : a.streams) {
      if (streams < 2 || n < streams) continue;
      double tLo = 0, tHi = 0;
      uint32_t lo = 0, hi = 0;
      uint64_t it = 0;
      const double msg = point(n, true, guess, &tLo, &tHi, &lo, &hi, &it, streams);
      const std::string label = "put-network x" + std::to_string(streams);
      say(leader, "  %-24s %12llu %6u %6u %12.3f %12.3f %12.3f %10.2f\n", label.c_str(),
          static_cast<unsigned long long>(recBytes), lo, hi, tLo, tHi, msg,
          msg > 0 ? static_cast<double>(recBytes) / (msg * 1e3) : 0.0);
      if (msg > 0)
        record("put-network-streams", "mkernel", "both-ways", recBytes, msg, it,
               {{"streams", std::to_string(streams)},
                {"reps_lo", std::to_string(lo)},
                {"reps_hi", std::to_string(hi)},
                {"op_us_lo", std::to_string(tLo)},
                {"op_us_hi", std::to_string(tHi)},
                {"how", quoted("calib-put-network's both-ways pattern with the bytes split into `streams` ProxyPuts "
                               "from as many lanes, in flight at once; recorded, not fitted")}});
      else
        ++notRecorded;
    }
    const uint32_t tcpRounds = static_cast<uint32_t>(std::clamp<double>(2e5 / guess, 5, 500));
    const double tcp = tcpPingPongUs(probe, me, recBytes, tcpRounds, wireBuf);
    say(leader, "  %-24s %12llu %6s %6s %12s %12s %12.3f %10.2f\n", "tcp ping-pong",
        static_cast<unsigned long long>(recBytes), "-", "-", "-", "-", tcp,
        static_cast<double>(recBytes) / (tcp * 1e3));
    record("put-network", "tcp-loopback", "plain tcp ping-pong", recBytes, tcp, tcpRounds,
           {{"how", quoted("median of half the round trip over a plain TCP_NODELAY connection")}});
  }
  ::close(probe);
  if (leader && !a.json.empty()) {
    mk::saveMeasurementFile(mf, a.json);
    std::printf("# wrote %zu records to %s\n", mf.records.size(), a.json.c_str());
  }
  if (notRecorded > 0) say(leader, "# %d point(s) not recorded (difference not positive)\n", notRecorded);
  return 0;
}

}  // namespace

int calibrateNetworkMain(int argc, char** argv, const std::string& command) {
  NetArgs a;
  CLI::App app{
      "mk-bench calibrate-network: the inter-node micro-benchmarks (calib-proxy, calib-put-network) for "
      "mk-calibrate, run as 2 rank processes on 2 nodes (docs/calibration.md)",
      "mk-bench calibrate-network"};
  app.add_option("--json", a.json, "write the calibration records (mkernel.measurement.v1; rank 0 writes)");
  app.add_option("-b,--minbytes", a.minSize, "smallest ProxyPut (K/M/G binary suffixes)");
  app.add_option("-e,--maxbytes", a.maxSize, "largest ProxyPut");
  app.add_option("-f,--stepfactor", a.factor, "size multiplication factor");
  app.add_option("-n,--iters", a.iters, "ops per timed loop (at most; fewer for long ops)");
  app.add_option("-w,--warmup_iters", a.warmup, "untimed ops first");
  app.add_option("--reps", a.reps, "timed loops per point (the median is used)");
  app.add_option("--threads", a.threads, "threads per CTA (at least 96 across nodes)");
  app.add_option("--ranks-per-node", a.ranksPerNode, "ranks per node (1: each rank its own node on one host)")
      ->capture_default_str();
  app.add_option("--transport", a.transport, "the proxy's transport between nodes")
      ->check(CLI::IsMember({"auto", "socket", "ibverbs"}))
      ->capture_default_str();
  app.add_flag("--share-gpus", a.shareGpus, "let the two ranks use one GPU (one process per rank needs CUDA MPS)");
  app.add_option("--proxy-chunk", a.chunk, "CommConfig::proxyChunkBytes: a ProxyPut travels in chunks of this size");
  app.add_option("--streams", a.streams,
                 "also measure both ways with the bytes split into this many ProxyPuts in flight at once, from as "
                 "many lanes (each >= 2; records op put-network-streams, not fitted)")
      ->delimiter(',')
      ->check(CLI::Range(2u, 16u));
  app.add_option("--wire-rounds", a.wireRounds, "ping-pongs of the plain TCP probe's 8-byte latency")
      ->capture_default_str();
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench calibrate-network"); rc != mk::cli::kContinue) return rc;
  try {
    return run(a, command);
  } catch (const mk::Error& e) {  // no GPU 3, driver too old 4, the rest 2 (mk/util/cli.hpp)
    std::fprintf(stderr, "mk-bench calibrate-network: %s\n", e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench calibrate-network: %s\n", e.what());
    return 2;
  }
}

}  // namespace mkbench
