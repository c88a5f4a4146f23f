// Tests of the element table's FP8 conversions (numeric.hpp) and of the lse-merge row operator on the CPU
// executor, against a softmax over the concatenated keys.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/schedule/validate.hpp"

namespace {

using namespace mk;

struct Fp8 {
  DType type;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
};
const Fp8 kFp8[] = {{DType::Float8E4M3, floatToE4m3, e4m3ToFloat}, {DType::Float8E5M2, floatToE5m2, e5m2ToFloat}};

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// The nearest finite code to `x` by brute force over all 256 codes, ties to the even code: an independent check
/// of the bit arithmetic. Past the largest finite value by half an ulp or more: overflow (nullopt).
std::optional<uint8_t> nearestCode(const Fp8& f, double x) {
  std::optional<uint8_t> best;
  double bestErr = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = f.decode(static_cast<uint8_t>(c));
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
    const double err = std::fabs(static_cast<double>(v) - x);
    if (!best || err < bestErr || (err == bestErr && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      bestErr = err;
    }
  }
  const DTypeInfo& info = dtypeInfo(f.type);
  const double halfUlpAtMax = std::ldexp(
      1.0, static_cast<int>(std::floor(std::log2(info.maxFinite))) - static_cast<int>(info.mantissaBits) - 1);
  // At max + half an ulp the tie goes to the even neighbour: e4m3's max (mantissa 110) is even, e5m2's is not.
  const double limit = info.maxFinite + halfUlpAtMax;
  if (std::fabs(x) > limit || (std::fabs(x) == limit && (*best & 1) == 1)) return std::nullopt;
  return best;
}

}  // namespace

TEST_CASE("numeric: every FP8 bit pattern round-trips through float, NaN included") {
  for (const Fp8& f : kFp8) {
    CAPTURE(toString(f.type));
    for (int c = 0; c < 256; ++c) {
      CAPTURE(c);
      const auto code = static_cast<uint8_t>(c);
      CHECK(f.encode(f.decode(code)) == code);
    }
  }
}

TEST_CASE("numeric: FP8 decodes known values per the OCP FP8 spec") {
  // e4m3: bias 7, max 448 (S.1111.110), no inf, S.1111.111 the only NaN, smallest subnormal 2^-9.
  CHECK(e4m3ToFloat(0x38) == 1.0f);
  CHECK(e4m3ToFloat(0x7e) == 448.0f);
  CHECK(e4m3ToFloat(0xfe) == -448.0f);
  CHECK(e4m3ToFloat(0x01) == std::ldexp(1.0f, -9));
  CHECK(e4m3ToFloat(0x08) == std::ldexp(1.0f, -6));
  CHECK(std::isnan(e4m3ToFloat(0x7f)));
  CHECK(std::isnan(e4m3ToFloat(0xff)));
  CHECK(e4m3ToFloat(0x78) == 256.0f);  // S.1111.000 is a number in e4m3
  // e5m2: bias 15, IEEE-like: max 57344, inf at S.11111.00, smallest subnormal 2^-16.
  CHECK(e5m2ToFloat(0x3c) == 1.0f);
  CHECK(e5m2ToFloat(0x7b) == 57344.0f);
  CHECK(e5m2ToFloat(0x7c) == std::numeric_limits<float>::infinity());
  CHECK(e5m2ToFloat(0xfc) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(e5m2ToFloat(0x7d)));
  CHECK(e5m2ToFloat(0x01) == std::ldexp(1.0f, -16));
  for (const Fp8& f : kFp8) CHECK(static_cast<double>(f.decode(f.encode(1e9f))) != dtypeInfo(f.type).maxFinite);
}

TEST_CASE("numeric: FP8 narrowing is nearest-even everywhere, overflow is NaN for e4m3 and inf for e5m2") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(floatToE4m3(464.0f) == 0x7e);  // max + half an ulp: a tie, to the even 448
  CHECK(floatToE4m3(464.1f) == 0x7f);  // past it: NaN (no inf in e4m3)
  CHECK(floatToE4m3(inf) == 0x7f);
  CHECK(floatToE4m3(-inf) == 0xff);
  CHECK(floatToE5m2(61440.0f) == 0x7c);  // max + half an ulp: a tie, to the even code, which is inf
  CHECK(floatToE5m2(61439.0f) == 0x7b);
  CHECK(floatToE4m3(std::ldexp(1.0f, -10)) == 0x00);   // half the smallest subnormal: tie to zero
  CHECK(floatToE4m3(std::ldexp(1.5f, -10)) == 0x01);   // above it: the smallest subnormal
  CHECK(floatToE4m3(-std::ldexp(1.0f, -30)) == 0x80);  // underflow keeps the sign
  CHECK(floatToE5m2(std::numeric_limits<float>::quiet_NaN()) == 0x7e);
  // Every midpoint between neighbouring codes, nudged down, exact, and nudged up, plus random floats: the
  // conversion agrees with the brute-force nearest code.
  std::mt19937_64 rng(11);
  for (const Fp8& f : kFp8) {
    CAPTURE(toString(f.type));
    std::vector<float> probes;
    for (int c = 0; c < 255; ++c) {
      const float lo = f.decode(static_cast<uint8_t>(c)), hi = f.decode(static_cast<uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi) || std::signbit(lo) != std::signbit(hi)) continue;
      const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
      probes.insert(probes.end(), {std::nextafter(mid, -inf), mid, std::nextafter(mid, inf)});
    }
    for (int k = 0; k < 2000; ++k)
      probes.push_back(std::ldexp(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng),
                                  std::uniform_int_distribution<int>(-20, 17)(rng)));
    for (float x : probes) {
      CAPTURE(x);
      const uint8_t got = f.encode(x);
      const std::optional<uint8_t> want = nearestCode(f, x);
      if (want)
        CHECK(got == *want);
      else
        CHECK_FALSE(std::isfinite(f.decode(got)));
    }
  }
}

TEST_CASE("numeric: loadElement and storeElement move FP8 elements one byte each") {
  std::vector<uint8_t> buf(4, 0);
  storeElement(DType::Float8E4M3, buf.data(), 1, 3.3f);  // 3.25 and 3.5 are its neighbours
  CHECK(buf[0] == 0);
  CHECK(buf[2] == 0);
  CHECK(loadElement(DType::Float8E4M3, buf.data(), 1) == 3.25f);
  storeElement(DType::Float8E5M2, buf.data(), 3, -3.3f);  // neighbours 3 and 3.5
  CHECK(loadElement(DType::Float8E5M2, buf.data(), 3) == -3.5f);
  CHECK(bitsOf(loadElement(DType::Float8E5M2, buf.data(), 0)) == 0);
}

// ---- lse-merge ---------------------------------------------------------------------------------------------

namespace {

/// Attention of one query row over `keys`: scores s_j and value rows v_j (width d). Returns the softmax-weighted
/// value row followed by log(sum_j exp(s_j)), in double: the reference the merge of partials must reproduce.
std::vector<double> attend(const std::vector<double>& scores, const std::vector<std::vector<double>>& values,
                           std::size_t begin, std::size_t end, uint32_t d) {
  double hi = -std::numeric_limits<double>::infinity();
  for (std::size_t j = begin; j < end; ++j) hi = std::max(hi, scores[j]);
  double sum = 0;
  std::vector<double> out(d + 1, 0.0);
  for (std::size_t j = begin; j < end; ++j) {
    const double w = std::exp(scores[j] - hi);
    sum += w;
    for (uint32_t c = 0; c < d; ++c) out[c] += w * values[j][c];
  }
  for (uint32_t c = 0; c < d; ++c) out[c] /= sum;
  out[d] = hi + std::log(sum);
  return out;
}

Schedule mergeSchedule(uint64_t rows, uint32_t width, DType dt) {
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.info.op = "custom";
  s.lanes.resize(1);
  const uint64_t n = rows * (width + 1);
  for (const char* name : {"p1", "p2", "out"}) s.buffers.push_back(BufferDecl{name, dt, BufferKind::InOut, {n}});
  Step st;
  st.kind = StepKind::Reduce;
  st.op = RedOp::LseMerge;
  st.aux = width;
  st.count = n;
  st.dst.buffer = 2;
  st.a.buffer = 0;
  st.b.buffer = 1;
  s.lanes[0].push_back(Lane{LaneRole::Compute, 1, {st}});
  return s;
}

}  // namespace

TEST_CASE("executor: lse-merge of two partial attentions equals the softmax over all keys") {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 3.0);
  const uint64_t rows = 7;
  const uint32_t width = 5;
  const std::size_t keys = 13, split = 6;  // partial 1: keys [0, 6), partial 2: [6, 13)
  const Schedule s = mergeSchedule(rows, width, DType::Float32);
  HostMemory mem = HostMemory::allocate(s);
  std::vector<std::vector<double>> want(rows);
  for (uint64_t r = 0; r < rows; ++r) {
    std::vector<double> scores(keys);
    std::vector<std::vector<double>> values(keys, std::vector<double>(width));
    for (std::size_t j = 0; j < keys; ++j) {
      scores[j] = normal(rng) + (r == 3 && j < split ? 40.0 : 0.0);  // row 3: partial 1 dominates
      for (double& v : values[j]) v = normal(rng);
    }
    const std::vector<double> p1 = attend(scores, values, 0, split, width);
    const std::vector<double> p2 = attend(scores, values, split, keys, width);
    want[r] = attend(scores, values, 0, keys, width);
    for (uint32_t c = 0; c <= width; ++c) {
      storeElement(DType::Float32, mem.bytes[0][0].data(), r * (width + 1) + c, static_cast<float>(p1[c]));
      storeElement(DType::Float32, mem.bytes[0][1].data(), r * (width + 1) + c, static_cast<float>(p2[c]));
    }
  }
  execute(s, mem);
  for (uint64_t r = 0; r < rows; ++r)
    for (uint32_t c = 0; c <= width; ++c) {
      CAPTURE(r);
      CAPTURE(c);
      const double got = loadElement(DType::Float32, mem.bytes[0][2].data(), r * (width + 1) + c);
      // A few float roundings of values of magnitude ~10: 1e-5 relative plus 1e-5 absolute.
      CHECK(std::fabs(got - want[r][c]) <= 1e-5 * std::fabs(want[r][c]) + 1e-5);
    }
}

TEST_CASE("executor: lse-merge with an empty partial keeps the other, and in place it aliases dst and a") {
  const float inf = std::numeric_limits<float>::infinity();
  Schedule s = mergeSchedule(2, 2, DType::Float32);
  s.lanes[0][0].steps[0].dst.buffer = 0;  // out = p1, exactly aliased
  HostMemory mem = HostMemory::allocate(s);
  const std::vector<float> p1 = {1.0f, 2.0f, 0.5f, 0.0f, 0.0f, -inf};
  const std::vector<float> p2 = {7.0f, 8.0f, -inf, 3.0f, 4.0f, 1.25f};
  for (std::size_t i = 0; i < p1.size(); ++i) {
    storeElement(DType::Float32, mem.bytes[0][0].data(), i, p1[i]);
    storeElement(DType::Float32, mem.bytes[0][1].data(), i, p2[i]);
  }
  execute(s, mem);
  const std::vector<float> want = {1.0f, 2.0f, 0.5f, 3.0f, 4.0f, 1.25f};
  for (std::size_t i = 0; i < want.size(); ++i)
    CHECK(loadElement(DType::Float32, mem.bytes[0][0].data(), i) == want[i]);
  CHECK(lseMergeWeights(-inf, -inf).lse == -inf);
  CHECK(lseMergeWeights(-inf, -inf).w1 == 0.0f);
  CHECK(std::isnan(lseMergeWeights(std::nanf(""), 1.0f).lse));
}

TEST_CASE("schedule: lse-merge's row width survives JSON and the packed form, and a bad width is refused") {
  const Schedule s = mergeSchedule(3, 4, DType::BFloat16);
  const std::string text = scheduleToJson(s);
  CHECK(text.find("\"row\":4") != std::string::npos);
  CHECK(scheduleFromJson(text).lanes[0][0].steps[0].aux == 4);
  const std::vector<uint8_t> image = pack(s);
  const Schedule back = unpack(image.data(), image.size());
  CHECK(back.lanes[0][0].steps[0].op == RedOp::LseMerge);
  CHECK(back.lanes[0][0].steps[0].aux == 4);
  CHECK(validateAll(s).empty());
  Schedule bad = s;
  bad.lanes[0][0].steps[0].aux = 3;  // 15 elements are not rows of 3 + 1
  const std::vector<ValidationIssue> issues = validateAll(bad);
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].message.find("lse-merge reads rows of row = 3 values") != std::string::npos);
  std::string sum = text;
  sum.replace(sum.find("lse-merge"), 9, "sum");
  CHECK_THROWS_WITH_AS(scheduleFromJson(sum), doctest::Contains("a row width is given but op is sum"), Error);
}

TEST_CASE("schedule: a collective refuses lse-merge and generates FP8 schedules that run on the CPU") {
  CollectiveSpec spec{CollOp::AllReduce, Algorithm::Ring, DType::Float32, RedOp::LseMerge, 64, 0};
  CHECK_THROWS_WITH_AS(generate(spec, {0, 0}),
                       doctest::Contains("redop lse-merge is not a collective's operator (expected sum, max, min)"),
                       Error);
  spec.redop = RedOp::Max;
  spec.dtype = DType::Float8E5M2;
  const Schedule s = generate(spec, {0, 0});
  CHECK(s.buffers[0].dtype == DType::Float8E5M2);
  HostMemory mem = HostMemory::allocate(s);
  CHECK(mem.bytes[0][0].size() == 64);  // one byte per element
  for (uint32_t r = 0; r < 2; ++r)
    for (uint64_t i = 0; i < 64; ++i) storeElement(DType::Float8E5M2, mem.bytes[r][0].data(), i, r == 0 ? 1.5f : -2.0f);
  execute(s, mem);
  for (uint32_t r = 0; r < 2; ++r) CHECK(loadElement(DType::Float8E5M2, mem.bytes[r][1].data(), 63) == 1.5f);
}
