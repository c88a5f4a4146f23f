// Generates and verifies a small all-reduce through the installed headers and library.
#include <cstdio>

#include "mk/algorithms/algorithms.hpp"
#include "mk/exec/verify.hpp"

int main() {
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.algo = mk::Algorithm::Ring;
  spec.count = 1021;
  const mk::Schedule s = mk::generate(spec, {0, 0, 0, 0});
  const mk::VerifyResult v = mk::verifyCollective(s, spec, 7);
  std::printf("consumer: %s\n", v.ok ? "OK" : v.detail.c_str());
  return v.ok ? 0 : 1;
}
