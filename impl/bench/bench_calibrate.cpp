// mk-bench calibrate — placeholder (being written).
#include <cstdio>

#include "bench_commands.hpp"

namespace mkbench {

int calibrateMain(int, char**, const std::string&) {
  std::fprintf(stderr, "mk-bench calibrate: not built yet\n");
  return 2;
}

}  // namespace mkbench
