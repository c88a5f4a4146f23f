// mk-bench-cli — mk-bench's command line without the engine: parses exactly as `mk-bench <collective>` does
// (bench_cli.cpp) and prints what it resolved, so that the CUDA-free build can test mk-bench's --help against the
// CLI convention (scripts/check_cli_convention.py) and its bad-input answers; `mk-bench-cli gemm-rs|ag-gemm|gemm-ar
// ...` parses and checks as `mk-bench gemm-rs ...` does before it looks for a GPU (bench_fused_cli.cpp). Not installed.
#include <cstdio>

#include "bench_cli.hpp"
#include "bench_fused_cli.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && mk::parseFusedOp(argv[1])) {
    mkbench::FusedArgs fa;
    mkbench::FusedJob job;
    if (int rc = mkbench::parseFusedArgs(argc - 1, argv + 1, fa, job); rc != mk::cli::kContinue) return rc;
    std::printf("fused %s, %zu shape(s), %zu variant(s), %u rank(s)%s\n", fa.op.c_str(), job.shapes.size(),
                job.variants.size(), job.ranks, job.multiProcess ? ", one process per rank" : "");
    return 0;
  }
  mkbench::Args a;
  if (int rc = mkbench::parseArgs(argc, argv, a); rc != mk::cli::kContinue) return rc;
  std::printf("collective %s, sizes %s, dtype %s, redop %s, root %u, algo %s\n", a.op.c_str(), a.sweep.c_str(),
              a.dtype.c_str(), a.redop.c_str(), a.root, a.algo.c_str());
  return 0;
}
