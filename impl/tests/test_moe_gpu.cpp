// moe-dispatch-gemm and moe-ffn on the GPU engine (mk::generateMoeDispatchGemm / generateMoeFfn on one node): the
// route, the notify, the gathers and puts sized by the counts the route wrote, each receiver's grouped GEMMs (SwiGLU
// in the first of moe-ffn's) and moe-ffn's combine, in one resident kernel per rank.
// 1, 2 and 4 ranks (moe-ffn: 1 and 2) sharing GPU 0 in one process (CommConfig::shareGpus); random, skewed and
// empty-expert routings; every output row compared with a double-precision reference, every row past its block's count
// left untouched; a bad expert id and an overflowing routing refused with mk::Error naming them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "compute_lane_test_util.hpp"
#include "engine_test_util.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/communicator.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/grouped_gemm.hpp"

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
      // Never fewer than topk experts to pick from (distinct per token).
      const uint32_t named = std::max(G - std::min(avoid, G), c.spec.topk);
      for (uint32_t j = 0; j < named; ++j) pool.push_back(static_cast<int32_t>(j));
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

/// The moe-ffn cases' shape on R ranks: 2 experts each, top-2, 130 tokens of 136 features (k off the tile sizes).
MoeCase ffnCase(uint32_t R) {
  MoeCase c;
  c.ranks = R;
  c.spec.experts = 2;
  c.spec.topk = 2;
  c.spec.tokens = 130;
  c.spec.hidden = 136;
  c.spec.computeCtas = 8;
  return c;
}

mk::MoeFfnSpec ffnSpec(const MoeCase& c, uint32_t ffn) {
  mk::MoeFfnSpec fs;
  fs.experts = c.spec.experts;
  fs.topk = c.spec.topk;
  fs.tokens = c.spec.tokens;
  fs.hidden = c.spec.hidden;
  fs.ffn = ffn;
  fs.computeCtas = c.spec.computeCtas;
  return fs;
}

/// moe-ffn's layered baseline on `comms` (communication-only): per rank the dispatch op into its counts and blocks,
/// grouped GEMM 1 (SwiGLU) and 2 over every (source, expert) block at those counts, then the combine op into y.
/// `bufs` per rank: ids, x, w1, weights, w2, y (runFfn's).
void runLayered(std::vector<mk::Communicator>& comms, const mk::MoeFfnSpec& fs, const std::vector<uint32_t>& nodeOf,
                std::vector<std::unique_ptr<mkt::DeviceBuffer>>& bufs, mkt::Streams& streams) {
  const mk::MoeFfnLayered lay = mk::generateMoeFfnLayered(fs, nodeOf);
  const auto R = static_cast<uint32_t>(nodeOf.size());
  const uint32_t E = fs.experts, G = R * E, H = fs.hidden, F = fs.ffn, C = fs.capacityOr();
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> counts, recv, h, o;
  std::vector<mk::GroupedGemmPlan> plans;
  mk::GroupedGemmConfig cfg;
  cfg.ctas = 16;  // beside the communication-only resident kernels
  for (uint32_t r = 0; r < R; ++r) {
    const int dev = comms[r].device();
    counts.push_back(std::make_unique<mkt::DeviceBuffer>(dev, uint64_t{G} * 4));
    recv.push_back(std::make_unique<mkt::DeviceBuffer>(dev, uint64_t{G} * C * H * 2));
    h.push_back(std::make_unique<mkt::DeviceBuffer>(dev, uint64_t{G} * C * F * 2));
    o.push_back(std::make_unique<mkt::DeviceBuffer>(dev, uint64_t{G} * C * H * 4));
    auto* b = &bufs[6 * r];
    std::vector<const void*> b1(G), b2(G);
    for (uint32_t g = 0; g < G; ++g) {
      b1[g] = b[2]->get() + uint64_t{g % E} * H * 2 * F * 2;
      b2[g] = b[4]->get() + uint64_t{g % E} * F * H * 2;
    }
    mk::GroupedGemmProblem p;
    p.groups = G;
    p.maxRows = C;
    p.rowCounts = reinterpret_cast<const int32_t*>(counts.back()->get());
    p.n = 2 * F;
    p.k = H;
    p.a = recv.back()->get();
    p.lda = H;
    p.b = b1.data();
    p.ldb = 2 * F;
    p.c = h.back()->get();
    p.ldc = F;
    p.swiglu = true;
    plans.emplace_back(p, cfg);
    p.n = H;
    p.k = F;
    p.a = h.back()->get();
    p.lda = F;
    p.b = b2.data();
    p.ldb = H;
    p.c = o.back()->get();
    p.ldc = H;
    p.outDType = DType::Float32;
    p.swiglu = false;
    plans.emplace_back(p, cfg);
  }
  for (uint32_t r = 0; r < R; ++r) {
    auto* b = &bufs[6 * r];
    comms[r].execute(lay.dispatch, {b[0]->get(), b[1]->get()}, {counts[r]->get(), recv[r]->get()}, streams.s[r]);
  }
  for (uint32_t r = 0; r < R; ++r) {
    plans[2 * r].run(streams.s[r]);
    plans[2 * r + 1].run(streams.s[r]);
  }
  for (uint32_t r = 0; r < R; ++r) {
    auto* b = &bufs[6 * r];
    comms[r].execute(lay.combine, {b[0]->get(), counts[r]->get(), b[3]->get(), o[r]->get()}, {b[5]->get()},
                     streams.s[r]);
  }
  for (auto& comm : comms) comm.synchronize();
  streams.sync(comms);
}

/// How runFfn runs moe-ffn: execute() of the generated schedule, Communicator::moeFfn, or the layered baseline
/// (mk::generateMoeFfnLayered's dispatch op, the standalone grouped GEMM engine twice, its combine op).
enum class FfnPath { Execute, Call, Layered };

const char* toString(FfnPath p) {
  return p == FfnPath::Execute ? "execute" : p == FfnPath::Call ? "moeFfn" : "layered";
}

/// Run moe-ffn (spec.outCols = 2F) on `comms` with router weights in [0, 1) by `path`; returns the mismatches of y
/// against a double reference (h kept in double: the bound covers h's bf16 rounding, the fp32 sums and the SwiGLU).
uint64_t runFfn(std::vector<mk::Communicator>& comms, const MoeCase& c, uint32_t ffn, uint64_t seed, FfnPath path) {
  const mk::MoeFfnSpec fs = ffnSpec(c, ffn);
  const std::vector<uint32_t> nodeOf(c.ranks, 0);
  const mk::Schedule s = path == FfnPath::Execute ? mk::generateMoeFfn(fs, nodeOf) : mk::Schedule{};
  const uint32_t E = fs.experts, T = fs.tokens, H = fs.hidden, F = ffn, K = fs.topk;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f), unit(0.f, 1.f);
  std::vector<std::vector<float>> x(c.ranks), w1(c.ranks), w2(c.ranks), rw(c.ranks);
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> bufs;  // per rank: ids, x, w1, weights, w2, y
  mkt::Streams streams(comms);
  for (uint32_t r = 0; r < c.ranks; ++r) {
    x[r].resize(uint64_t{T} * H);
    w1[r].resize(uint64_t{E} * H * 2 * F);
    w2[r].resize(uint64_t{E} * F * H);
    rw[r].resize(uint64_t{T} * K);
    for (float& v : x[r]) v = bf(uni(rng));
    for (float& v : w1[r]) v = bf(uni(rng) * 0.25f);
    for (float& v : w2[r]) v = bf(uni(rng) * 0.25f);
    for (float& v : rw[r]) v = unit(rng);
    const int dev = comms[r].device();
    auto up = [&](const void* p, size_t n) {
      bufs.push_back(std::make_unique<mkt::DeviceBuffer>(dev, n));
      bufs.back()->upload(p, n);
    };
    up(c.ids[r].data(), c.ids[r].size() * 4);
    const auto xb = mkt::toBytes(DType::BFloat16, x[r]), w1b = mkt::toBytes(DType::BFloat16, w1[r]),
               w2b = mkt::toBytes(DType::BFloat16, w2[r]);
    up(xb.data(), xb.size());
    up(w1b.data(), w1b.size());
    up(rw[r].data(), rw[r].size() * 4);
    up(w2b.data(), w2b.size());
    bufs.push_back(std::make_unique<mkt::DeviceBuffer>(dev, uint64_t{T} * H * 4));
    bufs.back()->fill(0xFF);
  }
  Watchdog::progress("moe-ffn " + std::to_string(c.ranks) + " ranks T " + std::to_string(T));
  for (uint32_t r = 0; r < c.ranks; ++r) {
    auto* b = &bufs[6 * r];
    if (path == FfnPath::Call)
      comms[r].moeFfn(fs, reinterpret_cast<const int32_t*>(b[0]->get()), reinterpret_cast<const float*>(b[3]->get()),
                      b[1]->get(), b[2]->get(), b[4]->get(), reinterpret_cast<float*>(b[5]->get()), streams.s[r]);
    else if (path == FfnPath::Execute)
      comms[r].execute(s, {b[0]->get(), b[1]->get(), b[2]->get(), b[3]->get(), b[4]->get()}, {b[5]->get()},
                       streams.s[r]);
  }
  if (path == FfnPath::Layered) runLayered(comms, fs, nodeOf, bufs, streams);
  for (auto& comm : comms) comm.synchronize();
  streams.sync(comms);
  const double gH = 2.0 * H * std::ldexp(1.0, -24), gF = 2.0 * F * std::ldexp(1.0, -24);
  uint64_t bad = 0;
  std::vector<double> hrow(F), hErr(F);
  for (uint32_t src = 0; src < c.ranks; ++src) {
    std::vector<float> got(uint64_t{T} * H);
    bufs[6 * src + 5]->download(got.data(), got.size() * 4);
    for (uint32_t t = 0; t < T; ++t) {
      std::vector<double> want(H, 0.0), tol(H, 1e-5);
      for (uint32_t k = 0; k < K; ++k) {
        const uint32_t j = static_cast<uint32_t>(c.ids[src][uint64_t{t} * K + k]);
        const uint32_t d = j / E, e = j % E;
        const double w = rw[src][uint64_t{t} * K + k];
        for (uint32_t f = 0; f < F; ++f) {
          double g = 0, u = 0, sg = 0, su = 0;
          for (uint32_t hh = 0; hh < H; ++hh) {
            const double xv = x[src][uint64_t{t} * H + hh];
            const double pg = xv * w1[d][(uint64_t{e} * H + hh) * 2 * F + 2 * f];
            const double pu = xv * w1[d][(uint64_t{e} * H + hh) * 2 * F + 2 * f + 1];
            g += pg;
            u += pu;
            sg += std::fabs(pg);
            su += std::fabs(pu);
          }
          const double silu = g / (1.0 + std::exp(-g));
          hrow[f] = silu * u;
          hErr[f] = std::ldexp(std::fabs(hrow[f]), -7) + 1.1 * std::fabs(u) * gH * sg + std::fabs(silu) * gH * su;
        }
        for (uint32_t col = 0; col < H; ++col) {
          double o = 0, err = 0, sAbs = 0;
          for (uint32_t f = 0; f < F; ++f) {
            const double w2v = w2[d][(uint64_t{e} * F + f) * H + col];
            o += hrow[f] * w2v;
            sAbs += std::fabs(hrow[f] * w2v);
            err += hErr[f] * std::fabs(w2v);
          }
          want[col] += w * o;
          tol[col] += w * (err + gF * sAbs) + std::ldexp(std::fabs(w * o), -22);
        }
      }
      for (uint32_t col = 0; col < H; ++col) {
        const float v = got[uint64_t{t} * H + col];
        if (!(std::isfinite(v) && std::fabs(v - want[col]) <= tol[col]) && ++bad <= 3)
          CHECK_MESSAGE(false, "rank " << src << " token " << t << " col " << col << ": " << v << " != " << want[col]
                                       << " (tolerance " << tol[col] << ")");
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
      for (uint32_t t = 0; t < 64; ++t) c.ids[1][t * 2] = 3;  // 64 tokens or more for expert 3, capacity 40
    else
      c.ids[1][17] = 4;  // G = 4
    const auto named3 = std::count(c.ids[1].begin(), c.ids[1].end(), 3);
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
      CHECK(msg.find("routes " + std::to_string(named3) + " tokens to expert 3, above the capacity 40") !=
            std::string::npos);
    else
      CHECK(msg.find("id 17 names expert 4, outside [0, 4)") != std::string::npos);
  }
}

TEST_CASE("moe gpu: moe-ffn (dispatch, SwiGLU, second GEMM, combine) on 1 and 2 ranks of one GPU") {
  Watchdog dog("moe gpu: moe-ffn", 240);
  // 4 ranks on one GPU hung on an H100 (docs/results.md, "MoE on the GPU engine"): not run until that is understood.
  for (const uint32_t R : {1u, 2u}) {
    CAPTURE(R);
    auto comms = mk::Communicator::createLocal(std::vector<int>(R, 0), moeConfig(R));
    MoeCase c = ffnCase(R);
    // The generated schedule through execute(), then Communicator::moeFfn (its own cached schedule) twice: uniform,
    // skewed with an expert never named, uniform again on the cached program.
    uint32_t run = 0;
    for (const auto& [hot, avoid, path] : {std::tuple<uint32_t, uint32_t, FfnPath>{0, 0, FfnPath::Execute},
                                           {1, 1, FfnPath::Call},
                                           {0, 0, FfnPath::Call}}) {
      c.ids = routing(c, 4100 + R + run, hot, avoid);
      CAPTURE(hot);
      CAPTURE(std::string(toString(path)));
      CHECK(runFfn(comms, c, 72, 4200 + R + run, path) == 0);
      ++run;
    }
  }
}

TEST_CASE("moe gpu: the layered moe-ffn (dispatch op, standalone grouped GEMMs, combine op) matches the reference") {
  // A communication-only communicator (the GEMM kernels need the other SMs): its resident kernel runs the route,
  // gathers and puts of the dispatch and the return and combine step of the second op.
  Watchdog dog("moe gpu: layered moe-ffn", 180);
  for (const uint32_t R : {1u, 2u}) {
    CAPTURE(R);
    mk::CommConfig cfg = moeConfig(R);
    cfg.computeLanes = false;
    cfg.workerCtas = 8;
    auto comms = mk::Communicator::createLocal(std::vector<int>(R, 0), cfg);
    MoeCase c = ffnCase(R);
    for (const auto& [hot, avoid] : {std::pair<uint32_t, uint32_t>{0, 0}, {1, 1}}) {
      c.ids = routing(c, 4300 + R + hot, hot, avoid);
      CAPTURE(hot);
      CHECK(runFfn(comms, c, 72, 4400 + R + hot, FfnPath::Layered) == 0);
    }
  }
}

TEST_CASE("moe gpu: moeFfn refuses a bad spec, a communicator without compute lanes and bad pointers") {
  Watchdog dog("moe gpu: moeFfn refusals", 120);
  MoeCase c;
  c.spec.experts = 2;
  c.spec.topk = 2;
  c.spec.tokens = 16;
  c.spec.hidden = 64;
  const mk::MoeFfnSpec fs = ffnSpec(c, 32);
  mkt::DeviceBuffer buf(0, 1 << 20);
  auto* base = static_cast<char*>(buf.get());
  const auto* ids = reinterpret_cast<const int32_t*>(base);
  const auto* weights = reinterpret_cast<const float*>(base + 4096);
  const void* x = base + 8192;
  float* y = reinterpret_cast<float*>(base + 65536);
  auto refusal = [&](mk::Communicator& comm, const mk::MoeFfnSpec& spec, const void* xp, const void* w1) {
    try {
      comm.moeFfn(spec, ids, weights, xp, w1, base + 32768, y, nullptr);
    } catch (const mk::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {
    auto comms = mk::Communicator::createLocal({0, 0}, moeConfig(2));
    mk::MoeFfnSpec bad = fs;
    bad.topk = 5;  // 4 experts in all
    std::string msg = refusal(comms[0], bad, x, base + 16384);
    CAPTURE(msg);
    CHECK(msg.find("invalid-argument") == 0);
    CHECK(msg.find("topk") != std::string::npos);
    msg = refusal(comms[0], fs, nullptr, base + 16384);
    CHECK(msg.find("moeFfn: x is null") != std::string::npos);
    msg = refusal(comms[0], fs, x, base + 16386);
    CHECK(msg.find("moeFfn: w1") != std::string::npos);
    CHECK(msg.find("not aligned") != std::string::npos);
    std::vector<int32_t> host(16);
    msg = refusal(comms[0], fs, host.data(), base + 16384);
    CHECK(msg.find("must be device memory of GPU 0") != std::string::npos);
  }
  {
    mk::CommConfig cfg = moeConfig(2);
    cfg.computeLanes = false;
    auto comms = mk::Communicator::createLocal({0, 0}, cfg);
    const std::string msg = refusal(comms[0], fs, x, base + 16384);
    CAPTURE(msg);
    CHECK(msg.find("unsupported") == 0);
    CHECK(msg.find("CommConfig::computeLanes = true") != std::string::npos);
  }
}

#endif  // MK_TEST_MIN_GPUS < 2
