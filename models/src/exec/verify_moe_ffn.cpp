// mkernel — moe-ffn on the CPU executor against a double reference of the whole layer (verify_moe.hpp has the
// tolerance and where it comes from).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify_moe.hpp"
#include "verify_moe_common.hpp"

namespace mk {

namespace {

constexpr const char* kWho = "verifyMoeFfn";

/// One expert's output row for one token, in double, and its error bound (verify_moe.hpp).
struct ExpertRow {
  std::vector<double> value, err;
};

ExpertRow expertRow(const uint16_t* x, const uint16_t* w1, const uint16_t* w2, uint32_t H, uint32_t F) {
  const double u32 = std::ldexp(1.0, -24);
  std::vector<double> h(F), eh(F);
  for (uint32_t f = 0; f < F; ++f) {
    double gate = 0, up = 0, magG = 0, magU = 0;
    for (uint32_t k = 0; k < H; ++k) {
      const double xv = bf16ToFloat(x[k]);
      const double g = xv * bf16ToFloat(w1[uint64_t{k} * 2 * F + 2 * f]);
      const double u = xv * bf16ToFloat(w1[uint64_t{k} * 2 * F + 2 * f + 1]);
      gate += g;
      up += u;
      magG += std::fabs(g);
      magU += std::fabs(u);
    }
    const double silu = gate / (1.0 + std::exp(-gate));
    const double exact = silu * up;
    h[f] = detail::roundOnce(DType::BFloat16, exact);
    // The engine's pre-rounding drift: fp32 accumulation of each dot, moved through silu(gate) x up (|silu'| <=
    // 1.1), and the float evaluation of the epilogue.
    const double drift = 1.1 * std::fabs(up) * (H + 1) * u32 * magG + std::fabs(silu) * (H + 1) * u32 * magU +
                         8 * u32 * std::fabs(exact);
    // Rounding is monotonic: the engine's h lies between the roundings of exact -+ drift, so h differs from the
    // reference only where that interval straddles a rounding boundary (then by that step, usually 0).
    eh[f] = std::max(std::fabs(detail::roundOnce(DType::BFloat16, exact + 1.01 * drift) - h[f]),
                     std::fabs(detail::roundOnce(DType::BFloat16, exact - 1.01 * drift) - h[f]));
  }
  ExpertRow row{std::vector<double>(H, 0.0), std::vector<double>(H, 0.0)};
  for (uint32_t c = 0; c < H; ++c) {
    double mag = 0, spread = 0;
    for (uint32_t f = 0; f < F; ++f) {
      const double w = bf16ToFloat(w2[uint64_t{f} * H + c]);
      row.value[c] += h[f] * w;
      mag += (std::fabs(h[f]) + eh[f]) * std::fabs(w);
      spread += eh[f] * std::fabs(w);
    }
    row.err[c] = spread + (F + 1) * u32 * mag;
  }
  return row;
}

}  // namespace

VerifyResult verifyMoeFfn(const Schedule& s, const MoeFfnSpec& spec, uint64_t seed, MoeRouting routing,
                          const MoeIds& given, ExecStats* stats) {
  const uint32_t R = s.nRanks;
  validateMoeFfnSpec(spec, R);
  const uint32_t E = spec.experts, K = spec.topk, T = spec.tokens, H = spec.hidden, F = spec.ffn;
  const uint64_t slots = uint64_t{T} * K;
  const uint16_t idsBuf = detail::requireBuffer(s, kWho, "ids", DType::Int32, slots);
  const uint16_t xBuf = detail::requireBuffer(s, kWho, "x", DType::BFloat16, uint64_t{T} * H);
  const uint16_t w1Buf = detail::requireBuffer(s, kWho, "w1", DType::BFloat16, uint64_t{E} * H * 2 * F);
  const uint16_t w2Buf = detail::requireBuffer(s, kWho, "w2", DType::BFloat16, uint64_t{E} * F * H);
  const uint16_t weightsBuf = detail::requireBuffer(s, kWho, "weights", DType::Float32, slots);
  const uint16_t yBuf = detail::requireBuffer(s, kWho, "y", DType::Float32, uint64_t{T} * H);
  const MoeIds ids = detail::moeIdsFor(s, spec.dispatch(), seed, routing, given, kWho);

  HostMemory mem = HostMemory::allocate(s);
  std::mt19937_64 rng(seed ^ 0xD1B54A32D192ED03ull);
  detail::fillMoeInputs(mem, s, ids, idsBuf, {xBuf, w1Buf, w2Buf}, rng);
  for (uint32_t r = 0; r < R; ++r) {  // router weights in [0, 1), then the sentinel
    float* w = mem.as<float>(r, weightsBuf);
    for (uint64_t i = 0; i < slots; ++i) w[i] = std::fabs(detail::inputValue(InputKind::Uniform, rng(), 0));
    uint32_t* y = mem.as<uint32_t>(r, yBuf);
    std::fill(y, y + s.buffers[yBuf].count[r], detail::kMoeSentinel);
  }
  const ExecStats moved = execute(s, mem);
  if (stats) *stats = moved;

  VerifyResult res;
  res.ok = true;
  const double u32 = std::ldexp(1.0, -24);
  std::vector<double> want(H), err(H);
  for (uint32_t r = 0; r < R; ++r) {
    const float* y = mem.as<float>(r, yBuf);
    const float* weights = mem.as<float>(r, weightsBuf);
    for (uint32_t t = 0; t < T; ++t) {
      std::fill(want.begin(), want.end(), 0.0);
      std::fill(err.begin(), err.end(), 0.0);
      for (uint32_t k = 0; k < K; ++k) {
        const auto j = static_cast<uint32_t>(ids[r][uint64_t{t} * K + k]);
        const uint32_t d = j / E, e = j % E;
        const ExpertRow row =
            expertRow(mem.as<uint16_t>(r, xBuf) + uint64_t{t} * H, mem.as<uint16_t>(d, w1Buf) + uint64_t{e} * H * 2 * F,
                      mem.as<uint16_t>(d, w2Buf) + uint64_t{e} * F * H, H, F);
        const double wk = weights[uint64_t{t} * K + k];
        for (uint32_t c = 0; c < H; ++c) {
          want[c] += wk * row.value[c];
          // the row rounded to float32 in "o", and once more inside the partial sum of its node (across nodes the
          // node's relay rounds the weighted sum of its rows for the token to float32: at most u32 x the sum of their
          // magnitudes)
          err[c] += std::fabs(wk) * (row.err[c] + 2 * u32 * std::fabs(row.value[c]));
        }
      }
      for (uint32_t c = 0; c < H; ++c) {
        const uint64_t at = uint64_t{t} * H + c;
        auto where = [&] {
          return "rank " + std::to_string(r) + " y[" + std::to_string(at) + "] (token " + std::to_string(t) +
                 ", feature " + std::to_string(c) + ")";
        };
        detail::checkElement(res, y[at], want[c],
                             err[c] + 2 * u32 * std::fabs(want[c]) + detail::subnormalHalfStep(DType::Float32), where);
      }
    }
  }
  if (res.ok) res.detail = "OK";
  return res;
}

}  // namespace mk
