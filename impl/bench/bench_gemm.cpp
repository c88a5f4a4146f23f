// mk-bench gemm — placeholder (being written).
#include <cstdio>

#include "bench_commands.hpp"

namespace mkbench {

int gemmMain(int, char**, const std::string&) {
  std::fprintf(stderr, "mk-bench gemm: not built yet\n");
  return 2;
}

}  // namespace mkbench
