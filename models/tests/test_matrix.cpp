// The generator x ranks x counts x dtypes matrix, on the CPU reference executor.
//
// Every schedule is validated (with the race check) and run on fresh random inputs; every output element of
// every rank is compared with the plain reference: bit-exact for small-integer inputs (every summation order
// is exact there) and for max/min and data movement; within the summation error bound of exec/verify.hpp for
// uniform inputs.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/exec/verify.hpp"
#include "mk/schedule/validate.hpp"

namespace {

std::vector<uint32_t> layout(uint32_t nRanks, uint32_t perNode) {
  std::vector<uint32_t> nodeOf(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) nodeOf[r] = r / perNode;
  return nodeOf;
}

/// Count argument giving about `bytes` per rank for the op's larger buffer (at least 1).
uint64_t countFor(mk::CollOp op, uint64_t bytes, mk::DType t, uint32_t nRanks) {
  const uint64_t elems = bytes / mk::dtypeSize(t);
  const bool block = op == mk::CollOp::AllGather || op == mk::CollOp::ReduceScatter || op == mk::CollOp::AllToAll;
  const uint64_t c = block ? elems / nRanks : elems;
  return c ? c : 1;
}

void runMatrix(mk::CollOp op, const char* algo, mk::DType dtype) {
  const uint32_t rankCounts[] = {1, 2, 3, 4, 8, 16};
  const uint64_t smallCounts[] = {1, 7, 61, 1021};  // 1 and odd primes
  uint64_t seed = 0x5eed0000u + static_cast<uint64_t>(op) * 1000 + static_cast<uint64_t>(dtype) * 100;
  for (uint32_t p : rankCounts) {
    for (uint32_t perNode : {p, 4u}) {
      if (perNode > p) continue;
      if (perNode != p && p <= 4) continue;  // same layout twice
      const auto nodeOf = layout(p, perNode);
      std::vector<uint64_t> counts(std::begin(smallCounts), std::end(smallCounts));
      counts.push_back(countFor(op, 1u << 18, dtype, p));  // 256 KiB
      for (uint64_t count : counts) {
        const bool big = count == counts.back();
        for (mk::InputKind kind : {mk::InputKind::SmallIntegers, mk::InputKind::Uniform}) {
          if (big && kind == mk::InputKind::SmallIntegers) continue;  // 256 KiB once, with uniform inputs
          mk::CollectiveSpec spec;
          spec.op = op;
          spec.algo = mk::requireAlgorithm(op, algo);
          spec.dtype = dtype;
          spec.count = count;
          spec.root = op == mk::CollOp::Broadcast ? (p - 1) / 2 : 0;
          mk::GenOptions opt;
          opt.chunks = big ? 4u : static_cast<uint32_t>(count % 3) + 1;
          opt.channels = big ? 2 : 1;
          ++seed;
          CAPTURE(p);
          CAPTURE(perNode);
          CAPTURE(count);
          CAPTURE(opt.chunks);
          CAPTURE(seed);
          const mk::Schedule s = mk::generate(spec, nodeOf, opt);
          mk::ValidateOptions vopt;
          vopt.checkRaces = !big;
          const auto issues = mk::validateAll(s, vopt);
          REQUIRE_MESSAGE(issues.empty(), (issues.empty() ? std::string() : issues.front().message));
          const mk::VerifyResult v = mk::verifyCollective(s, spec, seed, kind);
          REQUIRE_MESSAGE(v.ok, v.detail);
          CHECK(v.checked == static_cast<uint64_t>(p) * mk::outputCount(spec, p));
        }
      }
    }
  }
}

}  // namespace

#define MK_MATRIX(OP, ALGO, NAME)                                                                                      \
  TEST_CASE("matrix: " NAME " float32 over ranks 1 to 16 and odd counts") { runMatrix(OP, ALGO, mk::DType::Float32); } \
  TEST_CASE("matrix: " NAME " bfloat16 over ranks 1 to 16 and odd counts") {                                           \
    runMatrix(OP, ALGO, mk::DType::BFloat16);                                                                          \
  }                                                                                                                    \
  TEST_CASE("matrix: " NAME " float16 over ranks 1 to 16 and odd counts") { runMatrix(OP, ALGO, mk::DType::Float16); }

MK_MATRIX(mk::CollOp::AllReduce, "one-shot", "allreduce one-shot")
MK_MATRIX(mk::CollOp::AllReduce, "two-shot", "allreduce two-shot")
MK_MATRIX(mk::CollOp::AllReduce, "ring", "allreduce ring")
MK_MATRIX(mk::CollOp::AllReduce, "hierarchical", "allreduce hierarchical")
MK_MATRIX(mk::CollOp::AllGather, "ring", "allgather ring")
MK_MATRIX(mk::CollOp::AllGather, "direct", "allgather direct")
MK_MATRIX(mk::CollOp::AllGather, "hierarchical", "allgather hierarchical")
MK_MATRIX(mk::CollOp::ReduceScatter, "ring", "reducescatter ring")
MK_MATRIX(mk::CollOp::ReduceScatter, "direct", "reducescatter direct")
MK_MATRIX(mk::CollOp::ReduceScatter, "hierarchical", "reducescatter hierarchical")
MK_MATRIX(mk::CollOp::Broadcast, "direct", "broadcast direct")
MK_MATRIX(mk::CollOp::Broadcast, "ring", "broadcast ring")
MK_MATRIX(mk::CollOp::AllToAll, "direct", "alltoall direct")

TEST_CASE("matrix: every registered algorithm is covered by the matrix") {
  // A generator added without a matrix row would escape the CPU oracle.
  const std::vector<std::pair<mk::CollOp, std::vector<std::string>>> covered = {
      {mk::CollOp::AllReduce, {"one-shot", "two-shot", "ring", "hierarchical"}},
      {mk::CollOp::AllGather, {"ring", "direct", "hierarchical"}},
      {mk::CollOp::ReduceScatter, {"ring", "direct", "hierarchical"}},
      {mk::CollOp::Broadcast, {"direct", "ring"}},
      {mk::CollOp::AllToAll, {"direct"}},
  };
  for (const auto& [op, algos] : covered) {
    std::vector<std::string> names;
    for (mk::Algorithm a : mk::algorithmsFor(op)) names.emplace_back(mk::toString(a));
    CHECK(names == algos);
  }
}

TEST_CASE("matrix: max and min reductions are bit-exact for every reducing generator") {
  for (mk::RedOp redop : {mk::RedOp::Max, mk::RedOp::Min}) {
    for (const auto& [op, algo] :
         std::vector<std::pair<mk::CollOp, std::string>>{{mk::CollOp::AllReduce, "one-shot"},
                                                         {mk::CollOp::AllReduce, "two-shot"},
                                                         {mk::CollOp::AllReduce, "ring"},
                                                         {mk::CollOp::AllReduce, "hierarchical"},
                                                         {mk::CollOp::ReduceScatter, "ring"},
                                                         {mk::CollOp::ReduceScatter, "direct"},
                                                         {mk::CollOp::ReduceScatter, "hierarchical"}}) {
      for (mk::DType dtype : {mk::DType::Float32, mk::DType::BFloat16, mk::DType::Float16}) {
        mk::CollectiveSpec spec;
        spec.op = op;
        spec.algo = mk::requireAlgorithm(op, algo);
        spec.dtype = dtype;
        spec.redop = redop;
        spec.count = 257;
        mk::GenOptions opt;
        opt.chunks = 2;
        CAPTURE(algo);
        const auto s = mk::generate(spec, layout(6, 4), opt);
        const auto v = mk::verifyCollective(s, spec, 99 + static_cast<uint64_t>(redop), mk::InputKind::Uniform);
        REQUIRE_MESSAGE(v.ok, v.detail);
      }
    }
  }
}
