// mk-bench soak — mixed back-to-back collectives for a given time, some checked element-wise, with host and GPU
// memory sampled: what a long training job does to the engine, compressed.
//
//   mk-bench soak [--seconds 600] [--max-bytes 4M] [--sizes 24] [--check-every 8] [--seed 1] [--memory-csv f]
//
// Ops are drawn from one seeded sequence every rank draws alike: the collective (all-reduce, all-gather,
// reduce-scatter, broadcast, all-to-all), one of its algorithms, a dtype, a reduction and one of `--sizes` odd element
// counts up to --max-bytes (a bounded set of shapes, as a training job has: the engine caches one schedule per shape),
// and for half of them LL packets where the algorithm has them.
// Every --check-every-th op gets fresh small-integer inputs and its output is compared element-wise with the CPU
// reference; the others run back to back on whatever the buffers hold. Rounds of 64 ops end with a synchronize; the
// run stops at the first round boundary after --seconds (rank 0's clock decides, for every process).
//
// Memory: every 5 s the processes' resident set (summed over the processes) and the GPU's used memory are sampled.
// The run passes when no element was wrong and memory is flat: the median of the last quarter of the samples is
// within 1 % + 8 MiB of the median of the second quarter (the first quarter is warm-up: every shape's schedule and
// scratch are created then).
//
// Launch: one process driving every visible GPU, `--share-gpus --ranks N` for N ranks on GPU 0 in one process, or
// one process per rank (torchrun-style variables, impl/tools/launch_ranks.sh; ranks may share GPUs under CUDA MPS).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"

namespace mkbench {
namespace {

struct SoakArgs {
  double seconds = 600;
  std::string maxBytes = "4M";
  uint32_t sizes = 24;
  uint32_t checkEvery = 8;
  uint64_t seed = 1;
  std::string memoryCsv;
  bool shareGpus = false;
  int ranks = 0;
  uint32_t workers = 0;
};

/// One op of the sequence.
struct SoakOp {
  mk::CollectiveSpec spec;
  mk::Algorithm algo;
  mk::Protocol protocol = mk::Protocol::Auto;
  bool checked = false;
};

/// Small integers, so every sum, maximum and minimum is exact in every dtype for up to 8 ranks.
float soakInput(uint64_t op, uint32_t rank, uint64_t i) {
  return static_cast<float>(static_cast<int64_t>((i * 7 + rank * 13 + op * 3) % 17) - 8);
}

uint64_t residentBytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

uint64_t gpuUsedBytes(int dev) {
  MK_CUDA_CHECK(cudaSetDevice(dev));
  size_t freeB = 0, total = 0;
  MK_CUDA_CHECK(cudaMemGetInfo(&freeB, &total));
  return total - freeB;
}

/// Whether the samples are flat: median of the last quarter within 1 % + 8 MiB of the median of the second.
bool flat(const std::vector<double>& v, double* early, double* late) {
  const size_t q = v.size() / 4;
  if (q == 0) return true;
  *early = mk::median(std::vector<double>(v.begin() + static_cast<long>(q), v.begin() + static_cast<long>(2 * q)));
  *late = mk::median(std::vector<double>(v.end() - static_cast<long>(q), v.end()));
  return *late <= *early * 1.01 + 8.0 * 1024 * 1024;
}

int runSoak(const SoakArgs& a) {
  const uint64_t maxBytes = mk::parseSize(a.maxBytes);
  if (!(a.seconds > 0) || a.seconds > 7 * 24 * 3600.0)
    throw mk::Error(mk::ErrorCode::InvalidArgument, "--seconds must be in (0, 604800]");
  if (maxBytes < 64 || maxBytes > (uint64_t{1} << 30))
    throw mk::Error(mk::ErrorCode::InvalidArgument, "--max-bytes must be in [64, 1G]");
  const int available = mk::requireCudaDevices();
  std::unique_ptr<mk::Bootstrap> boot;
  std::vector<int> devs;
  int nRanks = 0, firstRank = 0;
  if (mk::launchedAsRanks()) {
    if (a.ranks > 0) throw mk::Error(mk::ErrorCode::InvalidArgument, "--ranks: this process was started as one rank");
    mk::RankLaunch rank = mk::bootstrapFromEnvironment(20000);
    boot = std::move(rank.bootstrap);
    nRanks = boot->size();
    firstRank = boot->rank();
    devs = {rank.device};
  } else if (a.ranks > 0) {
    if (!a.shareGpus && a.ranks > available)
      throw mk::Error(mk::ErrorCode::InvalidArgument, "--ranks " + std::to_string(a.ranks) + " but " +
                                                          std::to_string(available) +
                                                          " device(s) visible (give --share-gpus to share GPU 0)");
    nRanks = a.ranks;
    for (int r = 0; r < nRanks; ++r) devs.push_back(a.shareGpus ? 0 : r);
  } else {
    nRanks = available;
    for (int r = 0; r < nRanks; ++r) devs.push_back(r);
  }
  const bool leader = firstRank == 0;
  const auto n = static_cast<uint32_t>(nRanks);
  // The largest buffer any op needs: all-gather's output / reduce-scatter's input of maxBytes per rank's piece.
  const uint64_t bufBytes = maxBytes * n + 256;
  Buffers buf(devs, bufBytes);
  Streams st(devs);
  mk::CommConfig cfg;
  cfg.shareGpus = a.shareGpus;
  cfg.workerCtas = a.workers;
  std::vector<mk::Communicator> comms;
  if (boot)
    comms.push_back(mk::Communicator::create(*boot, devs[0], cfg));
  else
    comms = mk::Communicator::createLocal(devs, cfg);

  // The bounded set of shapes: odd element counts spread log-uniformly up to maxBytes (of a 4-byte dtype).
  std::mt19937_64 shapeRng(a.seed);
  std::vector<uint64_t> counts;
  for (uint32_t i = 0; i < a.sizes; ++i) {
    const double lg = std::log2(static_cast<double>(maxBytes / 4)) * (i + 1) / a.sizes;
    counts.push_back(std::max<uint64_t>(1, static_cast<uint64_t>(std::exp2(lg)) | 1u));
  }
  const std::vector<mk::CollOp> ops = {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter,
                                       mk::CollOp::Broadcast, mk::CollOp::AllToAll};
  const std::vector<mk::DType> dtypes = {mk::DType::Float32, mk::DType::BFloat16, mk::DType::Float16};
  const std::vector<mk::RedOp> redops = {mk::RedOp::Sum, mk::RedOp::Max, mk::RedOp::Min};
  std::mt19937_64 rng(a.seed * 7919 + 1);
  auto draw = [&](uint64_t index) {
    SoakOp o;
    o.spec.op = ops[rng() % ops.size()];
    const auto algos = mk::algorithmsFor(o.spec.op);
    o.algo = algos[rng() % algos.size()];
    o.spec.algo = o.algo;
    o.spec.dtype = dtypes[rng() % dtypes.size()];
    o.spec.redop = redops[rng() % redops.size()];
    const bool perRank = o.spec.op == mk::CollOp::AllGather || o.spec.op == mk::CollOp::ReduceScatter ||
                         o.spec.op == mk::CollOp::AllToAll;
    uint64_t count = counts[rng() % counts.size()];
    if (perRank) count = std::max<uint64_t>(1, count / n);
    o.spec.count = count;
    o.spec.root = static_cast<uint32_t>(rng() % n);
    // Half the ops ask for LL packets (used by the generators that have them), where a rank's packets of one op fit
    // its packet area (512 KiB of data: kPacketsPerSlot).
    const bool ll = rng() % 2 != 0;
    const uint64_t peerBytes = o.spec.count * mk::dtypeSize(o.spec.dtype) * (n - 1);
    o.protocol = ll && peerBytes <= (uint64_t{256} << 10) ? mk::Protocol::LL : mk::Protocol::Auto;
    o.checked = a.checkEvery > 0 && index % a.checkEvery == 0;
    return o;
  };

  auto submit = [&](const SoakOp& o) {
    const mk::DType dt = o.spec.dtype;
    mk::CollOptions opt(o.algo);
    opt.protocol = o.protocol;
    for (size_t r = 0; r < comms.size(); ++r) {
      const void* s = buf.send[r];
      void* d = buf.recv[r];
      switch (o.spec.op) {
        case mk::CollOp::AllReduce: comms[r].allReduce(s, d, o.spec.count, dt, o.spec.redop, st.s[r], opt); break;
        case mk::CollOp::AllGather: comms[r].allGather(s, d, o.spec.count, dt, st.s[r], opt); break;
        case mk::CollOp::ReduceScatter:
          comms[r].reduceScatter(s, d, o.spec.count, dt, o.spec.redop, st.s[r], opt);
          break;
        case mk::CollOp::Broadcast: comms[r].broadcast(s, d, o.spec.count, dt, o.spec.root, st.s[r], opt); break;
        case mk::CollOp::AllToAll: comms[r].allToAll(s, d, o.spec.count, dt, st.s[r], opt); break;
      }
    }
  };

  // A checked op: fresh inputs on every local rank, the op, and every output element against the reference.
  auto runChecked = [&](const SoakOp& o, uint64_t index) -> uint64_t {
    const uint64_t inCount = mk::inputCount(o.spec, n), outCount = mk::outputCount(o.spec, n);
    const uint64_t es = mk::dtypeSize(o.spec.dtype);
    std::vector<std::vector<float>> inputs(n, std::vector<float>(inCount));
    for (uint32_t q = 0; q < n; ++q)
      for (uint64_t i = 0; i < inCount; ++i) inputs[q][i] = soakInput(index, q, i);
    const auto expected = mk::referenceCollective(o.spec, n, inputs);
    std::vector<uint8_t> bytes(inCount * es), poison(outCount * es, 0xFF);
    for (size_t r = 0; r < comms.size(); ++r) {
      const uint32_t rank = static_cast<uint32_t>(firstRank) + static_cast<uint32_t>(r);
      for (uint64_t i = 0; i < inCount; ++i) mk::storeElement(o.spec.dtype, bytes.data(), i, inputs[rank][i]);
      MK_CUDA_CHECK(cudaSetDevice(devs[r]));
      MK_CUDA_CHECK(cudaMemcpyAsync(buf.send[r], bytes.data(), bytes.size(), cudaMemcpyHostToDevice, st.s[r]));
      MK_CUDA_CHECK(cudaMemcpyAsync(buf.recv[r], poison.data(), poison.size(), cudaMemcpyHostToDevice, st.s[r]));
      MK_CUDA_CHECK(cudaStreamSynchronize(st.s[r]));
    }
    submit(o);
    uint64_t wrong = 0;
    std::vector<uint8_t> got(outCount * es);
    for (size_t r = 0; r < comms.size(); ++r) {
      const uint32_t rank = static_cast<uint32_t>(firstRank) + static_cast<uint32_t>(r);
      MK_CUDA_CHECK(cudaSetDevice(devs[r]));
      MK_CUDA_CHECK(cudaMemcpyAsync(got.data(), buf.recv[r], got.size(), cudaMemcpyDeviceToHost, st.s[r]));
      MK_CUDA_CHECK(cudaStreamSynchronize(st.s[r]));
      for (uint64_t i = 0; i < outCount; ++i)
        if (mk::loadElement(o.spec.dtype, got.data(), i) != expected[rank][i]) ++wrong;
    }
    return wrong;
  };

  if (leader)
    std::printf("# mk-bench soak: %u rank(s)%s, %.0f s, %u shapes up to %s, every %u-th op checked, seed %llu\n", n,
                boot ? " (one process per rank)" : "", a.seconds, a.sizes, a.maxBytes.c_str(), a.checkEvery,
                static_cast<unsigned long long>(a.seed));
  std::FILE* csv = nullptr;
  if (leader && !a.memoryCsv.empty()) {
    csv = std::fopen(a.memoryCsv.c_str(), "w");
    if (!csv) throw mk::Error(mk::ErrorCode::IoError, "--memory-csv: cannot write " + a.memoryCsv);
    std::fprintf(csv, "t_s,ops,rss_bytes_total,gpu_used_bytes\n");
  }
  std::vector<double> rssSamples, gpuSamples;
  std::map<std::string, uint64_t> perOp;
  uint64_t index = 0, checked = 0, wrong = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double nextSample = 0;
  constexpr uint32_t kRound = 64;
  for (;;) {
    for (uint32_t i = 0; i < kRound; ++i, ++index) {
      const SoakOp o = draw(index);
      ++perOp[std::string(mk::toString(o.spec.op)) + " " + mk::toString(o.algo) +
              (o.protocol == mk::Protocol::LL ? " ll" : "")];
      if (o.checked) {
        wrong += runChecked(o, index);
        ++checked;
      } else {
        submit(o);
      }
    }
    for (auto& c : comms) c.synchronize();
    st.sync();
    // Rank 0's clock decides, for every process: [stop, sample].
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double decision[2] = {t >= a.seconds ? 1.0 : 0.0, t >= nextSample ? t : -1.0};
    if (boot) {
      const std::vector<uint8_t> all = boot->allGather(decision, sizeof decision);
      std::memcpy(decision, all.data(), sizeof decision);  // rank 0's entry
    }
    if (decision[1] >= 0) {
      double rss = static_cast<double>(residentBytes());
      double rssTotal = 0;
      if (boot) {
        const std::vector<uint8_t> all = boot->allGather(&rss, sizeof rss);
        std::vector<double> v(all.size() / sizeof(double));
        std::memcpy(v.data(), all.data(), all.size());
        for (double x : v) rssTotal += x;
      } else {
        rssTotal = rss;
      }
      const double gpu = static_cast<double>(gpuUsedBytes(devs[0]));
      rssSamples.push_back(rssTotal);
      gpuSamples.push_back(gpu);
      if (csv) {
        std::fprintf(csv, "%.1f,%llu,%.0f,%.0f\n", decision[1], static_cast<unsigned long long>(index), rssTotal, gpu);
        std::fflush(csv);
      }
      nextSample = decision[1] + 5;
    }
    if (decision[0] != 0) break;
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (csv) std::fclose(csv);
  // Wrong elements of every process.
  uint64_t wrongAll = wrong, checkedAll = checked;
  if (boot) {
    const uint64_t mine[2] = {wrong, checked};
    const std::vector<uint8_t> all = boot->allGather(mine, sizeof mine);
    wrongAll = checkedAll = 0;
    for (size_t i = 0; i + sizeof mine <= all.size(); i += sizeof mine) {
      uint64_t v[2];
      std::memcpy(v, all.data() + i, sizeof v);
      wrongAll += v[0];
      checkedAll += v[1];
    }
  }
  double rssEarly = 0, rssLate = 0, gpuEarly = 0, gpuLate = 0;
  const bool rssFlat = flat(rssSamples, &rssEarly, &rssLate);
  const bool gpuFlat = flat(gpuSamples, &gpuEarly, &gpuLate);
  if (leader) {
    std::printf(
        "# %llu ops in %.1f s (%.1f us per op, checks included), %llu checked (over every process), "
        "%llu wrong elements\n",
        static_cast<unsigned long long>(index), elapsed, elapsed * 1e6 / static_cast<double>(index),
        static_cast<unsigned long long>(checkedAll), static_cast<unsigned long long>(wrongAll));
    for (const auto& [what, k] : perOp)
      std::printf("#   %-28s %llu\n", what.c_str(), static_cast<unsigned long long>(k));
    std::printf(
        "# host memory (RSS, summed over the processes): %.1f MB in the second quarter, %.1f MB in the last: "
        "%s\n",
        rssEarly / 1e6, rssLate / 1e6, rssFlat ? "flat" : "GROWING");
    std::printf("# GPU memory used: %.1f MB in the second quarter, %.1f MB in the last: %s\n", gpuEarly / 1e6,
                gpuLate / 1e6, gpuFlat ? "flat" : "GROWING");
  }
  comms.clear();
  return wrongAll == 0 && rssFlat && gpuFlat ? 0 : 1;
}

}  // namespace

int soakMain(int argc, char** argv, const std::string& command) {
  (void)command;  // nothing is written but the log and the CSV
  SoakArgs a;
  CLI::App app{
      "mk-bench soak: mixed back-to-back collectives for a given time, some checked element-wise, with host "
      "and GPU memory sampled every 5 s; exit 1 on a wrong element or memory that grows",
      "mk-bench soak"};
  app.add_option("--seconds", a.seconds, "how long to run (stops at the first 64-op round boundary after it)");
  app.add_option("--max-bytes", a.maxBytes, "largest op, in bytes of a 4-byte dtype (K, M, G suffixes)");
  app.add_option("--sizes", a.sizes, "distinct element counts drawn from (odd, log-spread up to --max-bytes)")
      ->check(CLI::Range(1, 256));
  app.add_option("--check-every", a.checkEvery, "check every N-th op element-wise against the CPU (0 = never)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--seed", a.seed, "seed of the op sequence (every rank draws the same)");
  app.add_option("--memory-csv", a.memoryCsv, "write the memory samples here (t_s, ops, rss_bytes_total, gpu_used)");
  app.add_flag("--share-gpus", a.shareGpus, "ranks may share GPUs (CommConfig::shareGpus)");
  app.add_option("--ranks", a.ranks, "ranks of one process (with --share-gpus: all on GPU 0)")->check(CLI::Range(1, 8));
  app.add_option("--workers", a.workers, "worker CTAs per rank (0 = the engine's default)");
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench soak"); rc != mk::cli::kContinue) return rc;
  return mk::cli::run("mk-bench soak", [&] { return runSoak(a); });
}

}  // namespace mkbench
