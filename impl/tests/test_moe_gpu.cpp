// moe-dispatch-gemm on the GPU engine (mk::generateMoeDispatchGemm on one node): the route, the notify, the gathers
// and puts sized by the counts the route wrote, and each receiver's grouped GEMM, in one resident kernel per rank.
// 1, 2 and 4 ranks sharing GPU 0 in one process (CommConfig::shareGpus); random, skewed and empty-expert routings;
// every output row compared with a double-precision reference, every row past its block's count left untouched; a
// bad expert id and an overflowing routing refused with mk::Error naming them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine_test_util.hpp"
#include "gpu_watchdog.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/communicator.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"

#if MK_TEST_MIN_GPUS < 2

namespace {

using mk::DType;
using mkt::Watchdog;

mk::CommConfig moeConfig(uint32_t ranks) {
  mk::CommConfig c;
  c.computeLanes = true;
  c.shareGpus = ranks > 1;
  c.pollBudgetMs = 5000;
  c.hostBudgetMs = 30000;
  return c;
}

/// Rounded to bf16 and back.
float bf(float v) {
  uint8_t tmp[2];
  mk::storeElement(DType::BFloat16, tmp, 0, v);
  return mk::loadElement(DType::BFloat16, tmp, 0);
}

struct MoeCase {
  uint32_t ranks = 2;
  mk::MoeDispatchGemmSpec spec;
  /// ids[r]: rank r's T x topk global expert ids.
  std::vector<std::vector<int32_t>> ids;
};

/// Distinct experts per token, uniform; `hot` > 0: that many first experts take most of the picks; experts
/// `cold`.. never picked.
std::vector<std::vector<int32_t>> routing(const MoeCase& c, uint64_t seed, uint32_t hot, uint32_t avoid) {
  const uint32_t G = c.ranks * c.spec.experts;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> ids(c.ranks);
  for (uint32_t r = 0; r < c.ranks; ++r)
    for (uint32_t t = 0; t < c.spec.tokens; ++t) {
      std::vector<int32_t> pool;
      for (uint32_t j = 0; j < G; ++j)
        if (j < G - avoid) pool.push_back(static_cast<int32_t>(j));
      std::shuffle(pool.begin(), pool.end(), rng);
      if (hot > 0) std::stable_partition(pool.begin(), pool.end(), [&](int32_t j) { return j < int32_t(hot); });
      for (uint32_t k = 0; k < c.spec.topk; ++k) ids[r].push_back(pool[k]);
    }
  return ids;
}

/// Run the case on `comms`; returns the mismatches against the reference.
uint64_t runMoe(std::vector<mk::Communicator>& comms, const MoeCase& c, uint64_t seed) {
  const mk::MoeDispatchGemmSpec& sp = c.spec;
  const mk::Schedule s = mk::generateMoeDispatchGemm(sp, std::vector<uint32_t>(c.ranks, 0));
  const uint32_t E = sp.experts, G = c.ranks * E, T = sp.tokens, H = sp.hidden, N = sp.outCols, cap = sp.capacityOr();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<std::vector<float>> x(c.ranks), w(c.ranks);
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> dIds, dX, dW, dOut;
  mkt::Streams streams(comms);
  const uint64_t outCount = uint64_t{G} * cap * N;
  for (uint32_t r = 0; r < c.ranks; ++r) {
    x[r].resize(uint64_t{T} * H);
    w[r].resize(uint64_t{E} * H * N);
    for (float& v : x[r]) v = bf(uni(rng));
    for (float& v : w[r]) v = bf(uni(rng));
    const int dev = comms[r].device();
    dIds.push_back(std::make_unique<mkt::DeviceBuffer>(dev, c.ids[r].size() * 4));
    dIds.back()->upload(c.ids[r].data(), c.ids[r].size() * 4);
    const auto xb = mkt::toBytes(DType::BFloat16, x[r]);
    dX.push_back(std::make_unique<mkt::DeviceBuffer>(dev, xb.size()));
    dX.back()->upload(xb.data(), xb.size());
    const auto wb = mkt::toBytes(DType::BFloat16, w[r]);
    dW.push_back(std::make_unique<mkt::DeviceBuffer>(dev, wb.size()));
    dW.back()->upload(wb.data(), wb.size());
    dOut.push_back(std::make_unique<mkt::DeviceBuffer>(dev, outCount * 4));
    dOut.back()->fill(0xFF);
  }
  Watchdog::progress("moe-dispatch-gemm " + std::to_string(c.ranks) + " ranks T " + std::to_string(T));
  for (uint32_t r = 0; r < c.ranks; ++r)
    comms[r].execute(s, {dIds[r]->get(), dX[r]->get(), dW[r]->get()}, {dOut[r]->get()}, streams.s[r]);
  for (auto& comm : comms) comm.synchronize();
  streams.sync(comms);
  const double gamma = 2.0 * H * std::ldexp(1.0, -24);
  uint64_t bad = 0;
  for (uint32_t d = 0; d < c.ranks; ++d) {
    std::vector<float> got(outCount);
    dOut[d]->download(got.data(), got.size() * 4);
    for (uint32_t src = 0; src < c.ranks; ++src)
      for (uint32_t e = 0; e < E; ++e) {
        const int32_t j = static_cast<int32_t>(d * E + e);
        std::vector<uint32_t> tokens;  // rank src's tokens naming j, ascending
        for (uint32_t t = 0; t < T; ++t)
          for (uint32_t k = 0; k < sp.topk; ++k)
            if (c.ids[src][uint64_t{t} * sp.topk + k] == j) tokens.push_back(t);
        const uint64_t block = (uint64_t{src} * E + e) * cap;
        for (uint32_t i = 0; i < cap; ++i)
          for (uint32_t col = 0; col < N; ++col) {
            const float v = got[(block + i) * N + col];
            bool ok;
            double want = 0, sumAbs = 0;
            if (i >= tokens.size()) {
              ok = std::isnan(v);  // never written
            } else {
              for (uint32_t h = 0; h < H; ++h) {
                const double p = double(x[src][uint64_t{tokens[i]} * H + h]) * w[d][(uint64_t{e} * H + h) * N + col];
                want += p;
                sumAbs += std::fabs(p);
              }
              ok = std::isfinite(v) && std::fabs(v - want) <= gamma * sumAbs + 1e-30;
            }
            if (!ok && ++bad <= 3)
              CHECK_MESSAGE(false, "rank " << d << " block (" << src << ", " << e << ") row " << i << " col " << col
                                           << ": " << v << " != " << want);
          }
      }
  }
  return bad;
}

}  // namespace

TEST_CASE("moe gpu: moe-dispatch-gemm on 1, 2 and 4 ranks of one GPU matches the reference, routing changed per op") {
  Watchdog dog("moe gpu: moe-dispatch-gemm", 180);
  for (const uint32_t R : {1u, 2u, 4u}) {
    CAPTURE(R);
    auto comms = mk::Communicator::createLocal(std::vector<int>(R, 0), moeConfig(R));
    MoeCase c;
    c.ranks = R;
    c.spec.experts = 2;
    c.spec.topk = 2;
    c.spec.tokens = 200;
    c.spec.hidden = 264;  // k not a multiple of 64
    c.spec.outCols = 136;
    c.spec.computeCtas = 8;
    uint64_t seed = 3900 + R;
    // Uniform; skewed onto expert 0 and 1; the last expert never named (an empty block). Same program each time.
    for (const auto& [hot, avoid] : {std::pair<uint32_t, uint32_t>{0, 0}, {2, 0}, {0, 1}}) {
      c.ids = routing(c, seed, hot, avoid);
      CAPTURE(hot);
      CAPTURE(avoid);
      CHECK(runMoe(comms, c, seed++) == 0);
    }
  }
}

TEST_CASE("moe gpu: an expert id out of range and a routing over the capacity fail the op with mk::Error") {
  Watchdog dog("moe gpu: bad routings", 120);
  for (const bool overflow : {false, true}) {
    auto comms = mk::Communicator::createLocal({0, 0}, moeConfig(2));
    MoeCase c;
    c.spec.experts = 2;
    c.spec.topk = 2;
    c.spec.tokens = 64;
    c.spec.hidden = 64;
    c.spec.outCols = 64;
    c.spec.capacity = 40;
    c.ids = routing(c, 77, 0, 0);
    if (overflow)
      for (uint32_t t = 0; t < 64; ++t) c.ids[1][t * 2] = 3;  // 64 tokens for expert 3, capacity 40
    else
      c.ids[1][17] = 4;  // G = 4
    std::string msg;
    try {
      runMoe(comms, c, 78);
    } catch (const mk::Error& e) {
      msg = e.what();
    }
    CAPTURE(msg);
    CHECK(msg.find("invalid-argument") == 0);
    CHECK(msg.find("(route)") != std::string::npos);
    if (overflow)
      CHECK(msg.find("routes 64 tokens to expert 3, above the capacity 40") != std::string::npos);
    else
      CHECK(msg.find("id 17 names expert 4, outside [0, 4)") != std::string::npos);
  }
}

#endif  // MK_TEST_MIN_GPUS < 2
