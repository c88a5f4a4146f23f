// mk-bench-cli — mk-bench's command line without the engine: parses exactly as `mk-bench <collective>` does
// (bench_cli.cpp) and prints what it resolved, so that the CUDA-free build can test mk-bench's --help against the
// CLI convention (scripts/check_cli_convention.py) and its bad-input answers. Not installed.
#include <cstdio>

#include "bench_cli.hpp"

int main(int argc, char** argv) {
  mkbench::Args a;
  if (int rc = mkbench::parseArgs(argc, argv, a); rc != mk::cli::kContinue) return rc;
  std::printf("collective %s, sizes %s, dtype %s, redop %s, root %u, algo %s\n", a.op.c_str(), a.sweep.c_str(),
              a.dtype.c_str(), a.redop.c_str(), a.root, a.algo.c_str());
  return 0;
}
