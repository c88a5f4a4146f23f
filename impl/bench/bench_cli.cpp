#include "bench_cli.hpp"

#include "mk/algorithms/algorithms.hpp"
#include "mk/error.hpp"
#include "mk/io/output_paths.hpp"

namespace mkbench {
namespace {

constexpr const char* kDescription =
    "mk-bench: nccl-tests-style benchmark of the mkernel resident-kernel engine (NCCL in the same run), on this\n"
    "machine's GPUs (no --cluster: the cluster is the machine it runs on).\n\n"
    "  mk-bench allreduce -b 8 -e 1G -f 2 --algo all --baseline nccl --check\n"
    "  mk-bench --op allgather --sweep 1K:64M:4 -d bfloat16 --json ag.json\n\n"
    "Exit codes: 0 success, 1 wrong results or an internal error, 2 bad input, 3 no GPU (no NVIDIA driver or no\n"
    "device), 4 the NVIDIA driver is too old for this build.";

}  // namespace

void addArgs(CLI::App& app, Args& a) {
  app.add_option(
      "collective", a.op,
      "the collective: allreduce | allgather | reducescatter | broadcast | alltoall (or --op; also: mk-bench "
      "gemm --help, mk-bench calibrate --help, mk-bench calibrate-network --help, mk-bench "
      "gemm-rs|ag-gemm|gemm-ar --help, mk-bench soak --help)");
  app.add_option("--op", a.opFlag, "collective: the same as the positional (the reduction is --redop)");
  app.add_option("--bytes", a.bytes, "one size instead of a sweep (nccl-tests 'size': the larger buffer of one rank)");
  mk::cli::addSweepOptions(app, a.sizes,
                           std::string("time each (default ") + kDefaultSweep +
                               "; a bound not given keeps its default; K/M/G binary suffixes)");
  mk::cli::addDtypeOption(app, a.dtype, "float32 | bfloat16 | float16", true);
  mk::cli::addRedopOption(app, a.redop, "allreduce, reducescatter", true);
  app.add_option("--algo", a.algo, "auto | all | comma-separated generator names (one-shot, two-shot, ring, ...)");
  app.add_option("--baseline", a.baseline, "nccl: also time NCCL (libnccl.so.2, loaded at run time)");
  app.add_flag("-c,--check", a.check, "verify each size once against the CPU reference on fresh random data");
  app.add_flag("--inplace", a.inPlace, "in-place variant (NCCL's conventions)");
  app.add_option("--json", a.json, "write the measurement file (mkernel.measurement.v1)");
  app.add_option("--trace", a.trace, "write a Chrome/Perfetto trace of one op per size");
  app.add_option("-n,--iters", a.iters, "timed ops per loop");
  app.add_option("-w,--warmup_iters", a.warmup, "untimed ops first");
  app.add_option("--reps", a.reps, "timed loops per size (the median is reported)");
  app.add_option("-g,--gpus", a.gpus, "GPUs (0, the default: all visible)")->check(CLI::NonNegativeNumber);
  mk::cli::addRootOption(app, a.root, true);
  app.add_option("--chunks", a.chunks, "GenOptions::chunks (0: by size)");
  app.add_option("--channels", a.channels, "GenOptions::channels (0: by size)");
  app.add_option(
         "--protocol", a.protocol,
         "puts' protocol: auto | simple | ll (LL packets: one-shot / two-shot all-reduce, direct all-gather, one node)")
      ->check(CLI::IsMember({"auto", "simple", "ll"}))
      ->capture_default_str();
  app.add_option("--workers", a.workers, "worker CTAs per GPU (0: auto)");
  app.add_option("--threads", a.threads, "threads per CTA");
  app.add_option("--latency-probes", a.latencyProbes, "isolated ops timed host enqueue -> first step (0: skip)");
  addNodeArgs(app, a.ranksPerNode, a.transport, a.shareGpus);
  app.add_option("--link", a.link, "link name for the metadata (default: NVML's active NVLink count)");
  app.add_option("--profile", a.profile,
                 "profile JSON the 'auto' choice costs against (e.g. from mk-calibrate; default: datasheet)");
}

void addNodeArgs(CLI::App& app, uint32_t& ranksPerNode, std::string& transport, bool& shareGpus) {
  app.add_option("--ranks-per-node", ranksPerNode,
                 "split each host's ranks into nodes of this many (one process per rank): the inter-node path, "
                 "through the proxy, runs between them (0: one node per host)");
  app.add_option("--transport", transport, "the proxy's transport between nodes")
      ->check(CLI::IsMember({"auto", "socket", "ibverbs"}))
      ->capture_default_str();
  app.add_flag("--share-gpus", shareGpus,
               "let several ranks use one GPU (CommConfig::shareGpus; one process per rank needs CUDA MPS)");
}

void checkArgs(const Args& a) {
  const mk::CollOp op = mk::requireCollOp(a.op, "collective");
  // --algo: "all", or a list of "auto" and generator names for this collective, checked here so that a typo is
  // refused before any GPU is looked for.
  if (a.algo != "all") {
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = a.algo.find(',', start);
      const std::string item = a.algo.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (item.empty())
        throw mk::Error(mk::ErrorCode::InvalidArgument,
                        "--algo '" + a.algo + "' has an empty name (a comma-separated list of generator names)");
      if (item != "auto") mk::requireAlgorithm(op, item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  mk::requireDType(a.dtype, "--dtype");
  mk::requireRedOp(a.redop, "--redop");
  mk::parseSweep(a.sweep);
  if (a.iters == 0)
    throw mk::Error(mk::ErrorCode::InvalidArgument, "-n/--iters must be >= 1 (got 0): a timed loop of no op");
  if (a.reps == 0) throw mk::Error(mk::ErrorCode::InvalidArgument, "--reps must be >= 1 (got 0)");
  if (!a.baseline.empty() && a.baseline != "nccl")
    throw mk::Error(mk::ErrorCode::InvalidArgument, "unknown --baseline '" + a.baseline + "' (expected nccl)");
}

void finishArgs(const CLI::App& app, Args& a) {
  if (!a.opFlag.empty()) {
    if (a.opFlag == "sum" || a.opFlag == "max" || a.opFlag == "min" || a.opFlag == "prod")
      throw mk::Error(mk::ErrorCode::InvalidArgument,
                      "--op " + a.opFlag + ": --op is the collective in every tool now; the reduction is --redop " +
                          a.opFlag + " (nccl-tests' -o " + a.opFlag + " still works)");
    if (!a.op.empty() && a.op != a.opFlag)
      throw mk::Error(mk::ErrorCode::InvalidArgument,
                      "two collectives: '" + a.op + "' and --op " + a.opFlag + " (give one)");
    a.op = a.opFlag;
  }
  if (a.op.empty())
    throw mk::Error(mk::ErrorCode::InvalidArgument,
                    "no collective: mk-bench allreduce ... (or --op allreduce; see mk-bench --help)");
  a.sweep = mk::cli::resolveSweep(app, a.sizes, kDefaultSweep);
  if (app.count("--bytes") > 0) {
    mk::parseSize(a.bytes);
    a.sweep = a.bytes + ":" + a.bytes + ":2";
  }
  if (a.sweep.empty()) a.sweep = kDefaultSweep;
  checkArgs(a);
  mk::checkDistinctOutputs({{"--json", a.json, mk::OutputKind::File}, {"--trace", a.trace, mk::OutputKind::File}});
}

int parseArgs(int argc, char** argv, Args& a) {
  CLI::App app{kDescription, "mk-bench"};
  addArgs(app, a);
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench"); rc != mk::cli::kContinue) return rc;
  return mk::cli::run("mk-bench", [&] {
    finishArgs(app, a);
    return mk::cli::kContinue;
  });
}

}  // namespace mkbench
