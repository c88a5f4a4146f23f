// mk-bench calibrate — the micro-benchmarks mk-calibrate fits the hardware profile from (docs/calibration.md).
//
// Every benchmark is a small hand-written schedule run through the engine itself (Communicator::execute), timed
// like the collectives: CUDA events around `iters` back-to-back ops submitted as one group, median over `reps`
// loops. The quantity the profile needs (one message) is isolated by DIFFERENCE: the same schedule with R_lo and
// R_hi repetitions of the measured pattern, per message = (T(R_hi) - T(R_lo)) / ((R_hi - R_lo) * messages per
// repetition). Whatever every op pays once (doorbell, descriptor, op boundary, the first step's start) cancels;
// it is calib-dispatch: the intercept T(0) = T(R_lo) - R_lo * messages * per message of the both-ways put
// pattern (ops whose ranks interact, as every collective's do). The per-op time of an op whose lanes have no
// step at all is recorded too (calib-empty-op, not fitted): it is larger (17.4 against 11.7 us on 2 x H200),
// because ranks that never wait for each other expose the whole op-boundary handshake.
//
// Every schedule declares an Output buffer, so consecutive ops are fenced exactly as the collective records are
// (an op writing user memory the previous op wrote starts after that op completed everywhere): the per-op times
// here and in the collective files contain the same op boundary.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"

namespace mkbench {
namespace {

using mk::BufferKind;
using mk::DType;
using mk::LinkClass;
using mk::Schedule;
using mk::Step;
using mk::StepKind;

struct CalibArgs {
  std::string json;
  std::string minSize = "8", maxSize = "512M";
  std::string localMin = "4K";
  uint64_t factor = 2;
  uint64_t iters = 40, warmup = 10, reps = 3;
  uint32_t workers = 0, threads = 512;
  std::string only = "all";
  std::string link;
};

constexpr uint16_t kIn = 0, kOut = 1;  // buffer indices of every calibration schedule
constexpr uint16_t kScratch = 2;       // added by the patterns that put into the peer's scratch

/// Two ranks on one node, float32 buffers: "in" (2n elements: two operands for reduce) and "out" (n).
Schedule baseSchedule(uint64_t n, const std::string& name) {
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  s.buffers.push_back({"in", DType::Float32, BufferKind::Input, {2 * n, 2 * n}});
  s.buffers.push_back({"out", DType::Float32, BufferKind::Output, {n, n}});
  s.lanes.assign(2, std::vector<mk::Lane>(1));
  s.info.op = "custom";
  s.info.algo = name;
  s.info.dtype = DType::Float32;
  s.info.count = n;
  return s;
}

Step putStep(uint32_t from, uint32_t to, uint64_t n) {
  Step p;
  p.kind = StepKind::Put;
  p.link = LinkClass::NVLink;
  p.count = n;
  p.dst = {0, to, kOut, 0};
  p.a = {0, from, kIn, 0};
  p.flags = mk::kStepSignal;
  p.flag = {to, 0};
  p.value = 1;
  return p;
}

Step signalStep(uint32_t to) {
  Step s;
  s.kind = StepKind::Signal;
  s.flag = {to, 0};
  s.value = 1;
  return s;
}

Step waitStep(uint32_t self, uint64_t threshold) {
  Step w;
  w.kind = StepKind::Wait;
  w.flag = {self, 0};
  w.value = threshold;
  return w;
}

/// What a benchmark varies: a pattern repeated `reps` times in one op, `messages` timed messages per repetition.
struct Pattern {
  std::string op;       ///< record op (calib-...)
  std::string algo;     ///< how it was measured, for the record
  double messages = 1;  ///< messages on the critical path per repetition
  std::function<Schedule(uint64_t n, uint32_t reps)> make;
};

Pattern putOneWay() {
  // Ping-pong: rank 0 puts and waits for rank 1's put back; every message is on the critical path.
  return {"calib-put-nvlink-oneway", "ping-pong", 2, [](uint64_t n, uint32_t reps) {
            Schedule s = baseSchedule(n, "calib put one way");
            s.nFlags = 1;
            for (uint32_t i = 1; i <= reps; ++i) {
              s.lanes[0][0].steps.push_back(putStep(0, 1, n));
              s.lanes[0][0].steps.push_back(waitStep(0, i));
              s.lanes[1][0].steps.push_back(waitStep(1, i));
              s.lanes[1][0].steps.push_back(putStep(1, 0, n));
            }
            return s;
          }};
}

/// Both ranks put at once, then wait for the other's: each repetition is one message in each direction at the
/// same time — how every 2-GPU collective uses the link. Into the peers' output (`intoScratch` false:
/// calib-put-nvlink, whose intercept is calib-dispatch), or into their scratch (calib-put-nvlink-scratch): then
/// no rank's step touches another rank's user buffers, each op completes for its stream on local completion
/// (as one-shot does), and the intercept is calib-dispatch-scratch; the difference is Profile::peerUserUs.
Pattern putBothWays(bool intoScratch) {
  return {intoScratch ? "calib-put-nvlink-scratch" : "calib-put-nvlink",
          intoScratch ? "both-ways-scratch" : "both-ways", 1, [intoScratch](uint64_t n, uint32_t reps) {
            Schedule s = baseSchedule(n, intoScratch ? "calib put both ways into scratch" : "calib put both ways");
            if (intoScratch) s.buffers.push_back({"scratch", DType::Float32, BufferKind::Scratch, {n, n}});
            s.nFlags = 1;
            for (uint32_t i = 1; i <= reps; ++i)
              for (uint32_t r = 0; r < 2; ++r) {
                Step put = putStep(r, 1 - r, n);
                if (intoScratch) put.dst = {0, 1 - r, kScratch, 0};
                s.lanes[r][0].steps.push_back(put);
                s.lanes[r][0].steps.push_back(waitStep(r, i));
              }
            return s;
          }};
}

Pattern putStream() {
  // Both ranks stream puts to each other, one signal each, and wait for all of the peer's at the end: the
  // lane's time per put (what chunked collectives pay per chunk) without each put's wait. Its fit's intercept
  // is putIssueUs; the put's full latency stays calib-put-nvlink's alpha.
  return {"calib-put-stream", "stream", 1, [](uint64_t n, uint32_t reps) {
            Schedule s = baseSchedule(n, "calib put stream");
            s.nFlags = 1;
            for (uint32_t r = 0; r < 2; ++r) {
              for (uint32_t i = 1; i <= reps; ++i) s.lanes[r][0].steps.push_back(putStep(r, 1 - r, n));
              s.lanes[r][0].steps.push_back(waitStep(r, reps));
            }
            return s;
          }};
}

Pattern flagPingPong() {
  return {"calib-flag", "ping-pong", 2, [](uint64_t n, uint32_t reps) {
            Schedule s = baseSchedule(n, "calib flag");
            s.nFlags = 1;
            for (uint32_t i = 1; i <= reps; ++i) {
              s.lanes[0][0].steps.push_back(signalStep(1));
              s.lanes[0][0].steps.push_back(waitStep(0, i));
              s.lanes[1][0].steps.push_back(waitStep(1, i));
              s.lanes[1][0].steps.push_back(signalStep(0));
            }
            return s;
          }};
}

Pattern flagLocalPingPong() {
  // Two lanes of one GPU signal each other (GPU-scope flags); both ranks do it at once, independently.
  return {"calib-flag-local", "ping-pong", 2, [](uint64_t n, uint32_t reps) {
            Schedule s = baseSchedule(n, "calib local flag");
            s.nFlags = 2;
            for (uint32_t r = 0; r < 2; ++r) {
              s.lanes[r].resize(2);
              for (uint32_t i = 1; i <= reps; ++i) {
                Step ping = signalStep(r), pong = signalStep(r);
                pong.flag.id = 1;
                Step waitPong = waitStep(r, i);
                waitPong.flag.id = 1;
                s.lanes[r][0].steps.push_back(ping);
                s.lanes[r][0].steps.push_back(waitPong);
                s.lanes[r][1].steps.push_back(waitStep(r, i));
                s.lanes[r][1].steps.push_back(pong);
              }
            }
            return s;
          }};
}

/// Each rank repeats one step inside its own GPU: a Copy of "in" into "out", or a Reduce of in[0, n) and
/// in[n, 2n) into "out".
Pattern localRepeat(const char* op, StepKind kind) {
  return {op, "repeated", 1, [kind](uint64_t n, uint32_t reps) {
            Schedule s = baseSchedule(n, kind == StepKind::Reduce ? "calib reduce" : "calib local copy");
            for (uint32_t r = 0; r < 2; ++r)
              for (uint32_t i = 0; i < reps; ++i) {
                Step c;
                c.kind = kind;
                c.link = LinkClass::Local;
                c.count = n;
                c.dst = {0, r, kOut, 0};
                c.a = {0, r, kIn, 0};
                if (kind == StepKind::Reduce) c.b = {n, r, kIn, 0};
                s.lanes[r][0].steps.push_back(c);
              }
            return s;
          }};
}

Pattern localCopy() { return localRepeat("calib-copy-local", StepKind::Copy); }
Pattern localReduce() { return localRepeat("calib-reduce", StepKind::Reduce); }

/// Times schedules through the engine, nccl-tests style.
class Timer {
 public:
  Timer(std::vector<mk::Communicator>& comms, Buffers& buf, Streams& st, const CalibArgs& a)
      : comms_(comms), buf_(buf), st_(st), a_(a) {}

  /// Median per-op time (us) of `s`, with `iters` ops per loop.
  double perOpUs(Schedule s, uint64_t iters) {
    mk::fillCostAttributes(s);
    mk::validate(s);
    auto once = [&] {
      for (size_t r = 0; r < comms_.size(); ++r) comms_[r].execute(s, buf_.send[r], buf_.recv[r], st_.s[r]);
    };
    for (uint64_t i = 0; i < a_.warmup; ++i) once();
    st_.sync();
    std::vector<double> perOp;
    for (uint64_t rep = 0; rep < a_.reps; ++rep) {
      st_.recordStart();
      mk::groupStart();
      for (uint64_t i = 0; i < iters; ++i) once();
      mk::groupEnd();
      perOp.push_back(st_.recordStopAndElapsedMs() * 1e3 / static_cast<double>(iters));
    }
    return median(perOp);
  }

 private:
  std::vector<mk::Communicator>& comms_;
  Buffers& buf_;
  Streams& st_;
  const CalibArgs& a_;
};

int run(const CalibArgs& a, const std::string& command) {
  const uint64_t minB = mk::parseSize(a.minSize), maxB = mk::parseSize(a.maxSize),
                 localMinB = mk::parseSize(a.localMin);
  if (minB < 4 || maxB < minB) throw mk::Error(mk::ErrorCode::InvalidArgument, "need 4 <= -b <= -e (float32 messages)");
  if (a.factor < 2) throw mk::Error(mk::ErrorCode::InvalidArgument, "-f must be >= 2");
  if (a.iters == 0 || a.reps == 0) throw mk::Error(mk::ErrorCode::InvalidArgument, "-n and --reps must be > 0");
  const bool all = a.only == "all";
  const std::vector<std::string> known = {"all", "dispatch", "put", "flag", "copy", "reduce"};
  if (std::find(known.begin(), known.end(), a.only) == known.end())
    throw mk::Error(mk::ErrorCode::InvalidArgument,
                    "--only " + a.only + ": expected all, dispatch, put, flag, copy or reduce");

  const int available = mk::requireCudaDevices();
  if (available < 2)
    throw mk::Error(mk::ErrorCode::Unsupported, "calibrate needs 2 GPUs of one node (NVLink puts and flags); " +
                                                    std::to_string(available) + " visible");
  const std::vector<int> devs = {0, 1};

  std::vector<uint64_t> sizes;
  for (uint64_t b = minB; b <= maxB; b *= a.factor) {
    sizes.push_back(b / 4 * 4);
    if (b > maxB / a.factor) break;
  }
  const uint64_t maxBytes = sizes.back();
  mk::MeasurementFile mf = newMeasurementFile(2, a.link, command);

  // "in" holds two operands of the largest message.
  Buffers buf(devs, 2 * maxBytes + 256);
  Streams st(devs);
  for (size_t r = 0; r < devs.size(); ++r) {
    MK_CUDA_CHECK(cudaSetDevice(devs[r]));
    MK_CUDA_CHECK(cudaMemsetAsync(buf.send[r], 0, buf.bytes, st.s[r]));  // finite operands for reduce
  }
  st.sync();

  mk::CommConfig cfg;
  cfg.workerCtas = a.workers;
  cfg.threadsPerCta = a.threads;
  auto comms = mk::Communicator::createLocal(devs, cfg);
  Timer timer(comms, buf, st, a);
  std::printf(
      "# mk-bench calibrate: 2 GPUs, %u worker CTAs x %u threads, iters %llu (fewer above 4 MiB), warmup %llu, reps "
      "%llu\n",
      comms[0].workerCtas(), a.threads, static_cast<unsigned long long>(a.iters),
      static_cast<unsigned long long>(a.warmup), static_cast<unsigned long long>(a.reps));
  std::printf(
      "# per message = (T(R_hi) - T(R_lo)) / ((R_hi - R_lo) * messages per repetition); T = median per-op time\n");
  std::printf("# %-24s %12s %6s %6s %12s %12s %12s %10s\n", "op", "bytes", "R_lo", "R_hi", "T_lo(us)", "T_hi(us)",
              "msg(us)", "GB/s");

  auto record = [&](const std::string& op, const std::string& algo, uint64_t bytes, double us, uint64_t iters,
                    const std::vector<std::pair<std::string, std::string>>& extra) {
    mk::MeasurementRecord m;
    m.op = op;
    m.impl = "mkernel";
    m.algo = algo;
    m.dtype = "float32";
    m.ranks = 2;
    m.bytes = bytes;
    m.timeUs = us;
    m.algbwGBs = static_cast<double>(bytes) / (us * 1e3);
    m.busbwGBs = m.algbwGBs;
    m.iters = iters;
    m.stat = "median";
    m.extra["reps"] = std::to_string(a.reps);
    m.extra["worker_ctas"] = std::to_string(comms[0].workerCtas());
    for (const auto& [k, v] : extra) m.extra[k] = v;
    mf.records.push_back(m);
  };
  auto itersFor = [&](double opUsEstimate) {
    // Enough ops for ~20 ms per loop, at least 5, at most --iters.
    const double want = 20000.0 / std::max(opUsEstimate, 1.0);
    return std::max<uint64_t>(5, std::min<uint64_t>(a.iters, static_cast<uint64_t>(want)));
  };
  int negative = 0;
  // Intercepts of short both-ways puts (longer ones: the intercept drowns in the message's own noise).
  constexpr uint64_t kInterceptMaxBytes = 1u << 20;
  std::vector<std::pair<uint64_t, double>> intercepts;

  // ---- dispatch: lanes without steps ----------------------------------------------------------------------
  if (all || a.only == "dispatch") {
    Schedule empty = baseSchedule(1, "calib empty op");
    const double t = timer.perOpUs(empty, a.iters);
    std::printf("  %-24s %12d %6d %6d %12.3f %12s %12.3f %10s\n", "calib-empty-op", 0, 0, 0, t, "-", t, "-");
    record(
        "calib-empty-op", "empty-op", 0, t, a.iters,
        {{"how", quoted("per-op time of back-to-back fenced ops whose lanes have no step (events around the loop)")}});
  }

  auto sweep = [&](const Pattern& p, const std::vector<uint64_t>& bytesList, double bwGuessGBs) {
    for (uint64_t bytes : bytesList) {
      const uint64_t n = std::max<uint64_t>(1, bytes / 4);
      const double msgGuessUs = 2.0 + static_cast<double>(bytes) / (bwGuessGBs * 1e3);
      // Short messages: many repetitions so the difference stands far above the timing noise; long ones: few.
      const uint32_t lo = msgGuessUs < 50 ? 2 : 1;
      const uint32_t hi = msgGuessUs < 50 ? 18 : 3;
      const uint64_t it = itersFor(msgGuessUs * hi * p.messages + 20);
      const double tLo = timer.perOpUs(p.make(n, lo), it);
      const double tHi = timer.perOpUs(p.make(n, hi), it);
      const double msg = (tHi - tLo) / (static_cast<double>(hi - lo) * p.messages);
      const uint64_t recBytes = p.op.rfind("calib-flag", 0) == 0 ? 8 : n * 4;
      std::printf("  %-24s %12llu %6u %6u %12.3f %12.3f %12.3f %10.1f\n", p.op.c_str(),
                  static_cast<unsigned long long>(recBytes), lo, hi, tLo, tHi, msg,
                  msg > 0 ? static_cast<double>(recBytes) / (msg * 1e3) : 0.0);
      if (!(msg > 0)) {
        // Timing noise larger than the message: nothing honest to record (the contract wants time > 0).
        ++negative;
        std::printf("#   ^ not recorded: the difference is not positive (noise above the message time)\n");
        continue;
      }
      const bool scratch = p.op == "calib-put-nvlink-scratch";
      if ((p.op == "calib-put-nvlink" || scratch) && recBytes <= kInterceptMaxBytes) {
        const double intercept = tLo - lo * p.messages * msg;
        if (!scratch) intercepts.push_back({recBytes, intercept});
        if (intercept > 0)
          record(scratch ? "calib-dispatch-scratch" : "calib-dispatch",
                 scratch ? "intercept:both-ways-put-scratch" : "intercept:both-ways-put", 0, intercept, it,
                 {{"from_bytes", std::to_string(recBytes)},
                  {"how", quoted("T(0) = T(R_lo) - R_lo * messages_per_rep * time_us of the " + p.op +
                                 " point of from_bytes: the per-op time that is not the op's steps")}});
      }
      record(p.op, p.algo, recBytes, msg, it,
             {{"reps_lo", std::to_string(lo)},
              {"reps_hi", std::to_string(hi)},
              {"op_us_lo", std::to_string(tLo)},
              {"op_us_hi", std::to_string(tHi)},
              {"messages_per_rep", std::to_string(p.messages)}});
    }
  };

  std::vector<uint64_t> localSizes;
  for (uint64_t b : sizes)
    if (b >= localMinB) localSizes.push_back(b);
  if (all || a.only == "flag") {
    sweep(flagPingPong(), {8}, 1.0);
    sweep(flagLocalPingPong(), {8}, 1.0);
  }
  if (all || a.only == "put" || a.only == "dispatch") {
    sweep(putBothWays(false), sizes, 300);
    for (const auto& [bytes, t0] : intercepts)
      std::printf("  %-24s %12llu %6s %6s %12s %12s %12.3f %10s\n", "calib-dispatch",
                  static_cast<unsigned long long>(bytes), "-", "-", "-", "-", t0, "-");
    // Into scratch: only the short messages, whose intercepts give dispatchUs (calib-dispatch-scratch).
    std::vector<uint64_t> shortSizes;
    for (uint64_t b : sizes)
      if (b <= kInterceptMaxBytes) shortSizes.push_back(b);
    sweep(putBothWays(true), shortSizes, 300);
    sweep(putStream(), shortSizes, 300);
    if (a.only != "dispatch") sweep(putOneWay(), sizes, 300);
  }
  if (all || a.only == "copy") sweep(localCopy(), localSizes, 1500);
  if (all || a.only == "reduce") sweep(localReduce(), localSizes, 1000);

  comms.clear();  // the engine stops before the buffers are freed
  if (!a.json.empty()) {
    mk::saveMeasurementFile(mf, a.json);
    std::printf("# wrote %zu records to %s\n", mf.records.size(), a.json.c_str());
  }
  if (negative > 0) std::printf("# %d point(s) not recorded (difference not positive)\n", negative);
  return 0;
}

}  // namespace

int calibrateMain(int argc, char** argv, const std::string& command) {
  CalibArgs a;
  CLI::App app{
      "mk-bench calibrate: micro-benchmarks of the engine on 2 GPUs of one node, for mk-calibrate "
      "(records: docs/calibration.md)",
      "mk-bench calibrate"};
  app.add_option("--json", a.json, "write the calibration records (mkernel.measurement.v1)");
  app.add_option("-b,--minbytes", a.minSize, "smallest NVLink message (K/M/G binary suffixes)");
  app.add_option("-e,--maxbytes", a.maxSize, "largest message");
  app.add_option("-f,--stepfactor", a.factor, "size multiplication factor");
  app.add_option("--local-min", a.localMin, "smallest local copy / reduce message");
  app.add_option("--only", a.only, "all | dispatch | put | flag | copy | reduce");
  app.add_option("-n,--iters", a.iters, "ops per timed loop (at most; fewer for long ops)");
  app.add_option("-w,--warmup_iters", a.warmup, "untimed ops first");
  app.add_option("--reps", a.reps, "timed loops per point (the median is used)");
  app.add_option("--workers", a.workers, "worker CTAs per GPU (0: auto, as the collectives)");
  app.add_option("--threads", a.threads, "threads per CTA");
  app.add_option("--link", a.link, "link name for the metadata (default: NVML's active NVLink count)");
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench calibrate"); rc != mk::cli::kContinue) return rc;
  try {
    return run(a, command);
  } catch (const mk::Error& e) {  // no GPU 3, driver too old 4, the rest 2 (mk/util/cli.hpp)
    std::fprintf(stderr, "mk-bench calibrate: %s\n", e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench calibrate: %s\n", e.what());
    return 2;
  }
}

}  // namespace mkbench
