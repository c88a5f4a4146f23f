// mkernel — the checks of a fused call, before anything runs (fused_args.hpp).
#include "engine/fused_args.hpp"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "mk/error.hpp"

namespace mk::runtime {

FusedOperandCounts fusedOperandCounts(const FusedSpec& spec, uint32_t nRanks, uint32_t rank) {
  const std::vector<FusedShard> shards = fusedShards(spec, nRanks);
  const FusedShard& sh = shards.at(rank);
  FusedOperandCounts c;
  switch (spec.op) {
    case FusedOp::GemmReduceScatter: c = {spec.m * sh.kLen, sh.kLen * spec.n, sh.rows * spec.n}; break;
    case FusedOp::GemmAllReduce: c = {spec.m * sh.kLen, sh.kLen * spec.n, spec.m * spec.n}; break;
    case FusedOp::AllGatherGemm: c = {sh.rows * spec.k, spec.k * sh.cols, spec.m * sh.cols}; break;
  }
  return c;
}

uint32_t engineTileRows(const FusedSpec& spec, uint32_t nRanks, uint32_t ctas) {
  uint64_t largest = 0;
  for (const FusedShard& sh : fusedShards(spec, nRanks)) largest = std::max(largest, sh.rows);
  if (nRanks == 1) return static_cast<uint32_t>(spec.m);  // nothing to overlap: one Gemm step, the plain GEMM
  const uint64_t floor = spec.op == FusedOp::AllGatherGemm ? kEngineMinTileRowsAgGemm : kEngineMinTileRows;
  const uint64_t rows = std::max<uint64_t>(fusedDefaultTileRows(spec, nRanks, ctas), floor);
  return static_cast<uint32_t>(std::min(rows, largest));
}

FusedPlan planFusedCall(const FusedSpec& spec, const FusedOptions& optIn, const Topology& topo, uint32_t nRanks,
                        const Profile& profile, uint32_t workers, bool computeLanes) {
  const std::string op = toString(spec.op);
  if (!computeLanes)
    throw Error(ErrorCode::Unsupported, op + ": this communicator runs the communication-only resident kernel; create "
                                             "it with CommConfig::computeLanes = true to run fused operators (their "
                                             "Gemm steps run on the compute lanes)");
  validateFusedSpec(spec, nRanks);
  if (spec.dtype != DType::BFloat16)
    throw Error(ErrorCode::Unsupported, op + ": dtype " + toString(spec.dtype) +
                                            " runs on the CPU reference executor and the models only; the GPU tile "
                                            "engine (bf16 wgmma) takes bfloat16 A, B and C");
  FusedOptions opt = optIn;
  if (opt.ctas == 0) opt.ctas = workers;
  if (opt.ctas != workers)
    throw Error(ErrorCode::InvalidArgument,
                op + ": FusedOptions::ctas " + std::to_string(opt.ctas) + " is not this communicator's " +
                    std::to_string(workers) +
                    " worker CTAs per rank: the split divides the resident kernel's workers (leave ctas 0, or set "
                    "CommConfig::workerCtas)");
  bool tileDefault = false;
  if (opt.tileRows == 0) {
    opt.tileRows = engineTileRows(spec, nRanks, opt.ctas);
    tileDefault = true;
  }
  try {
    FusedPlan plan = planFused(spec, opt, topo, nRanks, profile);
    plan.tileDefault = tileDefault;
    return plan;
  } catch (const Error& e) {
    const std::string msg = e.message();
    throw Error(e.code(), msg.rfind(op, 0) == 0 ? msg : op + ": " + msg);
  }
}

void checkFusedOperands(const FusedSpec& spec, uint32_t nRanks, uint32_t rank, const void* a, const void* b,
                        const void* c) {
  const std::string op = toString(spec.op);
  const FusedOperandCounts n = fusedOperandCounts(spec, nRanks, rank);
  const uint64_t es = dtypeSize(spec.dtype);
  const std::pair<const void*, const char*> ops[3] = {{a, "A"}, {b, "B"}, {c, "C"}};
  for (const auto& [p, name] : ops) {
    std::ostringstream os;
    os << op << ": rank " << rank << "'s " << name << ' ' << p;
    if (!p) throw Error(ErrorCode::InvalidArgument, os.str() + " is null");
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw Error(ErrorCode::InvalidArgument,
                  os.str() +
                      " is not 16-byte aligned (address % 16 = " + std::to_string(reinterpret_cast<uintptr_t>(p) % 16) +
                      "): the tile engine's TMA loads and stores whole 16-byte units (cudaMalloc memory is aligned)");
  }
  auto overlap = [](const void* x, uint64_t xb, const void* y, uint64_t yb) {
    const auto x0 = reinterpret_cast<uintptr_t>(x), y0 = reinterpret_cast<uintptr_t>(y);
    return x0 < y0 + yb && y0 < x0 + xb;
  };
  if (overlap(c, n.c * es, a, n.a * es) || overlap(c, n.c * es, b, n.b * es))
    throw Error(ErrorCode::InvalidArgument, op + ": rank " + std::to_string(rank) + "'s C (" +
                                                std::to_string(n.c * es) + " bytes) overlaps " +
                                                (overlap(c, n.c * es, a, n.a * es) ? "A" : "B") +
                                                ": the output is written while the inputs are still read");
}

}  // namespace mk::runtime
