// mkernel — the fused family's entry points: names, the shape rules, generate() and the closed form
// (fused.hpp; the operators themselves are fused_<op>.cpp).
#include "mk/algorithms/fused.hpp"

#include <limits>

#include "fused_common.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

// TMA moves rows of whole 16-byte units: 8 elements of the 16-bit dtypes (docs/gemm.md, "Inside the resident
// kernel": lda, ldb and ldc must be multiples of 8, every tile 16-byte aligned).
constexpr uint64_t kTmaElems = 8;

[[noreturn]] void bad(const FusedSpec& spec, const std::string& what) {
  throw Error(ErrorCode::InvalidArgument, std::string(toString(spec.op)) + ": " + what);
}

std::string num(uint64_t v) { return std::to_string(v); }

}  // namespace

const char* toString(FusedOp op) noexcept {
  switch (op) {
    case FusedOp::GemmReduceScatter: return "gemm-rs";
    case FusedOp::AllGatherGemm: return "ag-gemm";
    case FusedOp::GemmAllReduce: return "gemm-ar";
  }
  return "?";
}

std::vector<FusedOp> fusedOps() { return {FusedOp::GemmReduceScatter, FusedOp::AllGatherGemm, FusedOp::GemmAllReduce}; }

std::optional<FusedOp> parseFusedOp(std::string_view s) noexcept {
  for (FusedOp op : fusedOps())
    if (s == toString(op)) return op;
  if (s == "gemm_rs") return FusedOp::GemmReduceScatter;
  if (s == "ag_gemm") return FusedOp::AllGatherGemm;
  if (s == "gemm_ar") return FusedOp::GemmAllReduce;
  return std::nullopt;
}

FusedOp requireFusedOp(std::string_view s, std::string_view what) {
  if (const auto op = parseFusedOp(s)) return *op;
  throw Error(ErrorCode::InvalidArgument,
              "unknown " + std::string(what) + " '" + std::string(s) + "' (expected gemm-rs, ag-gemm, gemm-ar)");
}

const char* toString(MatrixLayout l) noexcept { return l == MatrixLayout::ColMajor ? "col" : "row"; }

std::optional<MatrixLayout> parseMatrixLayout(std::string_view s) noexcept {
  if (s == "row" || s == "row-major") return MatrixLayout::RowMajor;
  if (s == "col" || s == "col-major" || s == "column-major") return MatrixLayout::ColMajor;
  return std::nullopt;
}

const char* toString(TileOrder o) noexcept {
  switch (o) {
    case TileOrder::Auto: return "auto";
    case TileOrder::OwnFirst: return "own-first";
    case TileOrder::OwnLast: return "own-last";
    case TileOrder::Interleaved: return "interleaved";
  }
  return "?";
}

std::optional<TileOrder> parseTileOrder(std::string_view s) noexcept {
  for (TileOrder o : {TileOrder::Auto, TileOrder::OwnFirst, TileOrder::OwnLast, TileOrder::Interleaved})
    if (s == toString(o)) return o;
  return std::nullopt;
}

const char* toString(FusedBound b) noexcept {
  switch (b) {
    case FusedBound::Tensor: return "tensor";
    case FusedBound::NvLink: return "nvlink";
    case FusedBound::Network: return "network";
    case FusedBound::Memory: return "memory";
  }
  return "?";
}

void validateFusedSpec(const FusedSpec& spec, uint32_t nRanks) {
  if (spec.op != FusedOp::GemmReduceScatter && spec.op != FusedOp::AllGatherGemm && spec.op != FusedOp::GemmAllReduce)
    throw Error(ErrorCode::InvalidArgument, "unknown fused op value " + std::to_string(static_cast<unsigned>(spec.op)));
  if (nRanks == 0) bad(spec, "needs at least 1 rank (got 0)");
  if (spec.dtype == DType::Float32)
    throw Error(ErrorCode::Unsupported,
                std::string(toString(spec.op)) +
                    ": dtype float32 is not supported: the GEMM engine takes 16-bit inputs (bfloat16; float16 on the "
                    "CPU reference and the models)");
  if (spec.dtype != DType::BFloat16 && spec.dtype != DType::Float16)
    bad(spec, "unknown dtype value " + std::to_string(static_cast<unsigned>(spec.dtype)));
  if (spec.layoutB != MatrixLayout::RowMajor && spec.layoutB != MatrixLayout::ColMajor)
    bad(spec, "unknown layout of B (value " + std::to_string(static_cast<unsigned>(spec.layoutB)) + ")");
  for (const auto& [v, name] : {std::pair<uint64_t, const char*>{spec.m, "M"}, {spec.n, "N"}, {spec.k, "K"}}) {
    if (v == 0) bad(spec, std::string(name) + " must be >= 1 (got 0)");
    if (v > std::numeric_limits<uint32_t>::max())
      bad(spec, std::string(name) + " = " + num(v) + " exceeds 2^32 - 1 (the dimensions of a Gemm step are 32-bit)");
  }
  const bool agGemm = spec.op == FusedOp::AllGatherGemm;
  if (spec.m < nRanks)
    bad(spec, "M = " + num(spec.m) + " cannot give each of the " + num(nRanks) + " ranks a row block of " +
                  (agGemm ? "A" : "C") + ": M must be at least the rank count");
  if (spec.n % kTmaElems != 0)
    bad(spec, "N = " + num(spec.n) +
                  " is not a multiple of 8: C's rows (ldc = " + (agGemm ? std::string("N / ranks") : std::string("N")) +
                  ") must be whole 16-byte units for the GPU engine's TMA (N % 8 = " + num(spec.n % kTmaElems) + ")");
  if (spec.k % kTmaElems != 0)
    bad(spec, "K = " + num(spec.k) +
                  " is not a multiple of 8: A's rows (lda = " + (agGemm ? std::string("K") : std::string("K / ranks")) +
                  ") must be whole 16-byte units for the GPU engine's TMA (K % 8 = " + num(spec.k % kTmaElems) + ")");
  // The split dimension goes out in whole units of 8, at least one per rank.
  const uint64_t split = agGemm ? spec.n : spec.k;
  const char* name = agGemm ? "N" : "K";
  if (split / kTmaElems < nRanks)
    bad(spec, std::string(name) + " = " + num(split) + " is split over the ranks in units of 8 (" +
                  num(split / kTmaElems) + " units for " + num(nRanks) + " ranks): " + name +
                  " must be at least 8 x ranks = " + num(kTmaElems * nRanks));
}

std::vector<FusedShard> fusedShards(const FusedSpec& spec, uint32_t nRanks) {
  validateFusedSpec(spec, nRanks);
  const bool agGemm = spec.op == FusedOp::AllGatherGemm;
  std::vector<FusedShard> shards(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) {
    FusedShard& sh = shards[r];
    const detail::Range rows = detail::splitRange(detail::Range{0, spec.m}, nRanks, r);
    sh.rowBegin = rows.begin;
    sh.rows = rows.size;
    const detail::Range units = detail::splitRange(detail::Range{0, (agGemm ? spec.n : spec.k) / kTmaElems}, nRanks, r);
    sh.colBegin = agGemm ? units.begin * kTmaElems : 0;
    sh.cols = agGemm ? units.size * kTmaElems : spec.n;
    sh.kBegin = agGemm ? 0 : units.begin * kTmaElems;
    sh.kLen = agGemm ? spec.k : units.size * kTmaElems;
  }
  return shards;
}

namespace detail {
const FusedDef& fusedDef(FusedOp op) {
  static const std::vector<FusedDef> all = {fusedGemmReduceScatter(), fusedAllGatherGemm(), fusedGemmAllReduce()};
  for (const FusedDef& d : all)
    if (d.op == op) return d;
  throw Error(ErrorCode::NotFound, "no generator for fused op value " + std::to_string(static_cast<unsigned>(op)));
}
}  // namespace detail

Schedule generate(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt) {
  const detail::FusedContext ctx = detail::makeFusedContext(spec, nodeOf, opt);
  detail::ScheduleBuilder b(ctx.gen);
  detail::fusedDef(spec.op).emit(b, ctx);
  Schedule s = b.finish();
  detail::applyLaneCtas(s, ctx);
  s.info = OpInfo{};
  s.info.op = toString(spec.op);
  s.info.algo = "tiles";
  s.info.dtype = spec.dtype;
  return s;
}

FusedEstimate fusedClosedForm(const FusedSpec& spec, const FusedOptions& opt, const Topology& topo, uint32_t nRanks,
                              const Profile& profile) {
  const detail::FusedContext ctx = detail::makeFusedContext(spec, topo.layout(nRanks), opt);
  // The rates its steps need, in the timeline's words (StepCosts).
  requirePositive("profile.gemmTflops", profile.gemmTflops, "a gemm");
  bool nvlink = false, network = false;
  for (uint32_t r = 0; r < ctx.p; ++r)
    for (const detail::FusedLanePlan& l : ctx.lanes[r]) {
      nvlink = nvlink || l.purpose == detail::FusedLane::SendNvlink;
      network = network || l.purpose == detail::FusedLane::SendNetwork;
    }
  if (nvlink) requirePositive("profile.nvlink.bwGBs", profile.nvlink.bwGBs, "an NVLink transfer");
  if (network) requirePositive("profile.network.bwGBs", profile.network.bwGBs, "a proxy put");
  if (ctx.p > 1 && spec.op != FusedOp::AllGatherGemm)
    requirePositive("profile.reduceGBs", profile.reduceGBs, "a reduce");
  return detail::fusedDef(spec.op).cost(ctx, profile);
}

double fusedFlops(const FusedSpec& spec) noexcept {
  return 2.0 * static_cast<double>(spec.m) * static_cast<double>(spec.n) * static_cast<double>(spec.k);
}

}  // namespace mk
