// mk-bench gemm-rs | ag-gemm | gemm-ar — the command line and its checks (bench_fused_cli.hpp).
#include "bench_fused_cli.hpp"

#include <sstream>

#include "bench_cli.hpp"
#include "mk/bootstrap.hpp"
#include "mk/error.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/proxy/transport.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"

namespace mkbench {
namespace {

[[noreturn]] void bad(const std::string& what) { throw mk::Error(mk::ErrorCode::InvalidArgument, what); }

/// "0,512,1024" -> {0, 512, 1024}.
std::vector<uint32_t> parseList(const std::string& text, const char* what) {
  std::vector<uint32_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 9)
      bad(std::string(what) + ": '" + text + "' is not a comma list of numbers");
    out.push_back(static_cast<uint32_t>(std::stoul(item)));
  }
  if (out.empty()) bad(std::string(what) + " is empty");
  return out;
}

}  // namespace

void addFusedArgs(CLI::App& app, FusedArgs& a) {
  app.add_option("-b,--minsize", a.minB, "smallest b (M = N = b, K = b / 2)");
  app.add_option("-e,--maxsize", a.maxB, "largest b");
  app.add_option("-f,--stepfactor", a.factor, "b multiplication factor");
  app.add_option("-m", a.m, "one shape instead of -b/-e: rows of A and C");
  app.add_option("-n", a.n, "columns of B and C");
  app.add_option("-k", a.k, "columns of A, rows of B");
  app.add_option("--ranks", a.ranks, "ranks of this process (more than the visible GPUs: they share them)")
      ->check(CLI::Range(1, 8));
  app.add_option("--layout-b", a.layoutB, "B storage: row or col")->check(CLI::IsMember({"row", "col"}));
  app.add_option("--tile-rows", a.tileRows, "rows of C per tile (0: the engine's default); a comma list runs each");
  app.add_option("--order", a.order, "auto | own-first | own-last | interleaved");
  app.add_option("--comm-ctas", a.commCtas,
                 "CTAs of the communication lanes (0: the model's split); a comma list runs each (with every tile)");
  app.add_option("--compute-lanes", a.computeLanes, "compute lanes (0: the model's choice)");
  app.add_option("--iters", a.iters, "ops per timed loop")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", a.warmup, "untimed ops before timing");
  app.add_option("--reps", a.reps,
                 "timed loops; the median is reported (one process per rank: the largest median "
                 "over the ranks)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--check", a.check,
               "compare every rank's C with the exact product (mk::verifyFused's tolerance); one process per rank: "
               "each checks its own, the run fails if any fails");
  app.add_option("--samples", a.samples, "--check: random elements per rank (0 = every element)");
  app.add_option("--json", a.json, "write measurement records (mkernel.measurement.v1) to this file (rank 0)");
  app.add_option("--trace", a.trace, "write the last shape's last fused op as Chrome trace JSON (one process only)");
  addNodeArgs(app, a.ranksPerNode, a.transport, a.shareGpus);  // the fused op's cross-node tiles: ProxyPuts
}

FusedJob resolveFusedArgs(const FusedArgs& a) {
  FusedJob job;
  job.op = mk::requireFusedOp(a.op);
  if (a.m || a.n || a.k) {
    if (a.m <= 0 || a.n <= 0 || a.k <= 0) bad("-m, -n and -k go together, each >= 1");
    job.shapes.push_back({uint64_t(a.m), uint64_t(a.n), uint64_t(a.k)});
  } else {
    const uint64_t lo = mk::parseSize(a.minB), hi = mk::parseSize(a.maxB);
    if (lo < 2 || hi < lo) bad("need 2 <= -b <= -e");
    if (a.factor < 2) bad("-f must be >= 2");
    for (uint64_t b = lo; b <= hi; b *= a.factor) {
      job.shapes.push_back({b, b, b / 2});
      if (b > hi / a.factor) break;
    }
  }
  const auto order = mk::parseTileOrder(a.order);
  if (!order) bad("unknown --order '" + a.order + "' (auto, own-first, own-last or interleaved)");
  const auto layoutB = mk::parseMatrixLayout(a.layoutB);
  if (!layoutB) bad("unknown --layout-b '" + a.layoutB + "'");
  job.layoutB = *layoutB;
  for (uint32_t tile : parseList(a.tileRows, "--tile-rows"))
    for (uint32_t comm : parseList(a.commCtas, "--comm-ctas")) {
      mk::FusedOptions opt;
      opt.tileRows = tile;
      opt.order = *order;
      opt.commCtas = comm;
      opt.computeLanes = a.computeLanes;
      job.variants.push_back(opt);
    }
  job.multiProcess = mk::launchedAsRanks();
  if (job.multiProcess) {
    if (a.ranks != 1)
      bad("--ranks: this process was started as one rank (RANK / WORLD_SIZE or an MPI launcher's are set); the job's "
          "ranks are its processes (launch_ranks.sh N)");
    if (!a.trace.empty())
      bad("--trace is written from one process driving every rank (run mk-bench without a launcher)");
    // Under mpirun without MASTER_ADDR the size comes from the MPI bootstrap: checked once it is known.
    job.ranks = mk::preferMpiBootstrap() ? 0 : static_cast<uint32_t>(mk::readLaunchEnvironment().size);
  } else {
    if (a.ranksPerNode > 0)
      bad("--ranks-per-node " + std::to_string(a.ranksPerNode) +
          ": nodes are made of processes; start one process per rank: impl/tools/launch_ranks.sh [--mps] N mk-bench " +
          a.op + " --ranks-per-node " + std::to_string(a.ranksPerNode) + " --share-gpus ...");
    if (a.transport != "auto")
      bad("--transport " + a.transport +
          ": one process is one node, nothing goes through the proxy; start one process per rank "
          "(impl/tools/launch_ranks.sh) with --ranks-per-node");
    job.ranks = a.ranks;
  }
  if (a.transport == "ibverbs") {
    std::string why;
    if (!mk::proxy::ibverbsBuilt())
      throw mk::Error(mk::ErrorCode::Unsupported,
                      "--transport ibverbs: this build has no ibverbs transport (libibverbs-dev was not found when "
                      "mkernel was configured); use --transport socket");
    if (mk::proxy::rdmaDeviceCount(&why) == 0)
      throw mk::Error(mk::ErrorCode::Unsupported,
                      "--transport ibverbs: no RDMA device found here (" + why + "); use --transport socket");
  }
  if (job.ranks > 0) checkFusedWorld(a, job, job.ranks);
  mk::checkDistinctOutputs({{"--json", a.json, mk::OutputKind::File}, {"--trace", a.trace, mk::OutputKind::File}});
  return job;
}

void checkFusedWorld(const FusedArgs& a, const FusedJob& job, uint32_t world) {
  if (job.multiProcess && a.ranksPerNode > 0 && world % a.ranksPerNode != 0)
    bad("--ranks-per-node " + std::to_string(a.ranksPerNode) + " does not divide the job's " + std::to_string(world) +
        " ranks into nodes of equal size (the generated schedules need them): pick a divisor of " +
        std::to_string(world));
  const bool evenRows = job.op != mk::FusedOp::GemmAllReduce;
  for (const FusedShape& s : job.shapes) {
    const std::string shape = std::to_string(s.m) + " x " + std::to_string(s.n) + " x " + std::to_string(s.k);
    try {
      mk::validateFusedSpec(mk::FusedSpec{job.op, mk::DType::BFloat16, s.m, s.n, s.k, job.layoutB}, world);
    } catch (const mk::Error& e) {
      throw mk::Error(e.code(),
                      "shape m x n x k = " + shape + " on " + std::to_string(world) + " ranks: " + e.message());
    }
    if (job.multiProcess && evenRows && s.m % world != 0)
      bad("-m " + std::to_string(s.m) + " (shape " + shape + ") does not divide over the job's " +
          std::to_string(world) + " ranks: the layered baseline's " +
          (job.op == mk::FusedOp::AllGatherGemm ? "all-gather" : "reduce-scatter") +
          " needs equal row blocks; pick m a multiple of " + std::to_string(world));
  }
}

int parseFusedArgs(int argc, char** argv, FusedArgs& a, FusedJob& job) {
  a.op = argv[0];
  const std::string tool = "mk-bench " + a.op;
  CLI::App app{tool + ": the fused operator against cuBLASLt GEMM + the collective, in the same run", tool};
  addFusedArgs(app, a);
  if (int rc = mk::cli::parse(app, argc, argv, tool.c_str()); rc != mk::cli::kContinue) return rc;
  return mk::cli::run(tool.c_str(), [&] {
    job = resolveFusedArgs(a);
    return mk::cli::kContinue;
  });
}

}  // namespace mkbench
