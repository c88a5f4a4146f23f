// Runtime extents (extent.hpp): a fused dispatch + expert GEMM whose token counts are known only at run time, run
// by the CPU executor against an FP32 reference; the JSON and packed forms, the validator, the cost attributes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

using namespace mk;

namespace {

/// A mixture-of-experts layer's dispatch fused with its expert GEMM, sized for `bound` tokens per (source rank,
/// expert): R ranks, E experts each, tokens of `hidden` features, expert weights W_e [hidden x n].
///  * x (Input, bf16): on rank r, one block of bound x hidden per global expert j = d * E + e, the tokens r routes
///    to expert e of rank d (rows beyond the runtime count are padding);
///  * w (Input, bf16): on rank r, its E weights stacked [E][hidden][n];
///  * recv (Scratch, bf16): on rank d, one block per (source s, expert e) at (s * E + e) x bound x hidden;
///  * out (Output, f32): on rank d, the expert outputs per (s, e) at (s * E + e) x bound x n.
/// Extents: "to<j>" (bound `bound`) is what the executing rank sends to expert j; "from<s>.<e>" what it receives
/// from rank s for its expert e. The sender's puts name "to<j>", the receiver's GEMM shapes "from<s>.<e>".
/// Lanes per rank: a comm lane (one put per (d, e) with d != r, a copy for d == r, each signalling flag s of the
/// receiver once per expert) and a compute lane (per source s: wait for its E blocks, then one grouped GEMM over
/// the E experts).
struct MoeDispatchGemm {
  uint32_t R = 3, E = 2, bound = 4, hidden = 24, n = 8;
  Schedule s;
  uint16_t x = 0, w = 1, recv = 2, out = 3;

  MoeDispatchGemm() {
    s.nRanks = R;
    s.nodeOf.assign(R, 0);
    s.nFlags = R;
    const uint64_t block = uint64_t{bound} * hidden;
    s.buffers = {{"x", DType::BFloat16, BufferKind::Input, std::vector<uint64_t>(R, uint64_t{R} * E * block)},
                 {"w", DType::BFloat16, BufferKind::Input, std::vector<uint64_t>(R, uint64_t{E} * hidden * n)},
                 {"recv", DType::BFloat16, BufferKind::Scratch, std::vector<uint64_t>(R, uint64_t{R} * E * block)},
                 {"out", DType::Float32, BufferKind::Output, std::vector<uint64_t>(R, uint64_t{R} * E * bound * n)}};
    for (uint32_t j = 0; j < R * E; ++j) s.extents.push_back({"to" + std::to_string(j), bound, bound / 2.0});
    for (uint32_t src = 0; src < R; ++src)
      for (uint32_t e = 0; e < E; ++e)
        s.extents.push_back({"from" + std::to_string(src) + "." + std::to_string(e), bound, bound / 2.0});
    for (uint32_t src = 0; src < R; ++src)
      for (uint32_t e = 0; e < E; ++e) s.gemms.push_back(GemmShape{bound, n, hidden, hidden, n, n, fromExtent(src, e)});
    s.lanes.resize(R);
    for (uint32_t r = 0; r < R; ++r) {
      Lane comm;
      comm.role = LaneRole::Intra;
      for (uint32_t d = 0; d < R; ++d)
        for (uint32_t e = 0; e < E; ++e) {
          const uint32_t j = d * E + e;
          Step st;
          st.kind = d == r ? StepKind::Copy : StepKind::Put;
          st.count = block;
          st.extent = j;  // "to<j>"
          st.dst = bufRef(d, recv, (uint64_t{r} * E + e) * block);
          st.a = bufRef(r, x, uint64_t{j} * block);
          if (d != r) {
            st.flags = kStepSignal;
            st.flag = FlagRef{d, r};
            st.value = 1;
          }
          comm.steps.push_back(st);
        }
      Step self;
      self.kind = StepKind::Signal;
      self.flag = FlagRef{r, r};
      self.value = E;
      comm.steps.push_back(self);
      Lane compute;
      compute.role = LaneRole::Compute;
      for (uint32_t src = 0; src < R; ++src) {
        Step wait;
        wait.kind = StepKind::Wait;
        wait.flag = FlagRef{r, src};
        wait.value = E;
        compute.steps.push_back(wait);
        Step g;
        g.kind = StepKind::GroupedGemm;
        g.count = E;
        g.aux = src * E;
        g.dst = bufRef(r, out, uint64_t{src} * E * bound * n);
        g.a = bufRef(r, recv, uint64_t{src} * E * block);
        g.b = bufRef(r, w, 0);
        compute.steps.push_back(g);
      }
      s.lanes[r] = {comm, compute};
    }
    fillCostAttributes(s);
  }

  uint32_t fromExtent(uint32_t src, uint32_t e) const { return R * E + src * E + e; }

  /// The values of a routing: tokens[s][j] = tokens rank s sends to global expert j.
  ExtentValues valuesOf(const std::vector<std::vector<uint64_t>>& tokens) const {
    ExtentValues v(R, std::vector<uint64_t>(s.extents.size(), 0));
    for (uint32_t r = 0; r < R; ++r)
      for (uint32_t j = 0; j < R * E; ++j) {
        v[r][j] = tokens[r][j];                         // what r sends
        v[j / E][fromExtent(r, j % E)] = tokens[r][j];  // what rank j / E receives from r for its expert j % E
      }
    return v;
  }
};

/// Random bf16 inputs, the run, and the element-wise check of every output element against an FP32 reference:
/// rows of a (source, expert) block below its token count hold the expert's product, the others stay zero.
void runAndCheck(const MoeDispatchGemm& f, const std::vector<std::vector<uint64_t>>& tokens, uint32_t seed) {
  HostMemory mem = HostMemory::allocate(f.s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (uint32_t r = 0; r < f.R; ++r)
    for (uint16_t b : {f.x, f.w}) {
      uint16_t* p = mem.as<uint16_t>(r, b);
      for (uint64_t i = 0; i < f.s.buffers[b].count[r]; ++i) p[i] = floatToBf16(dist(rng));
    }
  ExecOptions opt;
  opt.extents = f.valuesOf(tokens);
  execute(f.s, mem, opt);
  const uint64_t block = uint64_t{f.bound} * f.hidden;
  uint64_t checked = 0;
  for (uint32_t d = 0; d < f.R; ++d)
    for (uint32_t src = 0; src < f.R; ++src)
      for (uint32_t e = 0; e < f.E; ++e) {
        const uint64_t rows = tokens[src][d * f.E + e];
        const uint16_t* xs = mem.as<uint16_t>(src, f.x) + uint64_t{d * f.E + e} * block;
        const uint16_t* we = mem.as<uint16_t>(d, f.w) + uint64_t{e} * f.hidden * f.n;
        const float* o = mem.as<float>(d, f.out) + (uint64_t{src} * f.E + e) * f.bound * f.n;
        for (uint32_t t = 0; t < f.bound; ++t)
          for (uint32_t c = 0; c < f.n; ++c) {
            double want = 0, mag = 0;
            if (t < rows)
              for (uint32_t k = 0; k < f.hidden; ++k) {
                const double p = double(bf16ToFloat(xs[t * f.hidden + k])) * bf16ToFloat(we[k * f.n + c]);
                want += p;
                mag += std::fabs(p);
              }
            INFO("rank " << d << " from " << src << " expert " << e << " row " << t << " col " << c);
            CHECK(std::fabs(o[t * f.n + c] - want) <= 1e-5 * mag + 1e-6);
            ++checked;
          }
      }
  CHECK(checked == uint64_t{f.R} * f.R * f.E * f.bound * f.n);
}

}  // namespace

TEST_CASE("extents: a fused dispatch + expert GEMM runs the routing given at run time") {
  const MoeDispatchGemm f;
  REQUIRE(validate(f.s).empty());
  std::mt19937 rng(20261206);
  std::uniform_int_distribution<uint64_t> tok(0, f.bound);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<std::vector<uint64_t>> tokens(f.R, std::vector<uint64_t>(f.R * f.E));
    for (auto& row : tokens)
      for (auto& t : row) t = tok(rng);
    tokens[trial % f.R][0] = 0;              // an expert that receives nothing from this rank
    tokens[(trial + 1) % f.R][1] = f.bound;  // a full block
    runAndCheck(f, tokens, 7 + trial);
  }
  // Skewed: every token of every rank to expert 0 of rank 0, nothing anywhere else.
  std::vector<std::vector<uint64_t>> skew(f.R, std::vector<uint64_t>(f.R * f.E, 0));
  for (auto& row : skew) row[0] = f.bound;
  runAndCheck(f, skew, 99);
}

TEST_CASE("extents: without values every extent runs at its bound") {
  const MoeDispatchGemm f;
  HostMemory mem = HostMemory::allocate(f.s);
  for (uint32_t r = 0; r < f.R; ++r) {
    uint16_t* p = mem.as<uint16_t>(r, f.x);
    for (uint64_t i = 0; i < f.s.buffers[f.x].count[r]; ++i) p[i] = floatToBf16(1.0f);
    uint16_t* q = mem.as<uint16_t>(r, f.w);
    for (uint64_t i = 0; i < f.s.buffers[f.w].count[r]; ++i) q[i] = floatToBf16(0.5f);
  }
  execute(f.s, mem);
  for (uint32_t r = 0; r < f.R; ++r) {
    const float* o = mem.as<float>(r, f.out);
    for (uint64_t i = 0; i < f.s.buffers[f.out].count[r]; ++i) REQUIRE(o[i] == doctest::Approx(0.5 * f.hidden));
  }
}

TEST_CASE("extents: values that do not fit the schedule are refused before anything runs") {
  const MoeDispatchGemm f;
  HostMemory mem = HostMemory::allocate(f.s);
  ExecOptions opt;
  opt.extents.assign(f.R, std::vector<uint64_t>(f.s.extents.size(), 1));
  opt.extents[2][3] = f.bound + 1;
  test::expectError([&] { execute(f.s, mem, opt); }, ErrorCode::InvalidArgument,
                    "extent 'to3' of rank 2 is 5, above its bound 4");
  opt.extents.pop_back();
  test::expectError([&] { execute(f.s, mem, opt); }, ErrorCode::InvalidArgument,
                    "given for 2 ranks; the schedule has 3");
  opt.extents.assign(f.R, std::vector<uint64_t>(2, 0));
  test::expectError([&] { execute(f.s, mem, opt); }, ErrorCode::InvalidArgument, "rank 0 is given 2 extent values");
  for (uint32_t r = 0; r < f.R; ++r)
    for (uint64_t i = 0; i < f.s.buffers[f.out].count[r]; ++i) REQUIRE(mem.as<float>(r, f.out)[i] == 0.0f);
}

TEST_CASE("extents: JSON and the packed form keep them, and the run after a round trip is the same") {
  const MoeDispatchGemm f;
  const std::string text = scheduleToJson(f.s, 2);
  CHECK(text.find("\"extents\"") != std::string::npos);
  CHECK(text.find("\"extent\": \"to3\"") != std::string::npos);
  CHECK(text.find("\"extent\": \"from1.0\"") != std::string::npos);
  const Schedule back = scheduleFromJson(text);
  CHECK(scheduleToJson(back, 2) == text);
  REQUIRE(back.extents.size() == f.s.extents.size());
  CHECK(back.extents[4].expected == f.s.extents[4].expected);
  CHECK(back.gemms[3].extent == f.s.gemms[3].extent);
  const Schedule unpacked = unpack(pack(f.s));
  REQUIRE(unpacked.extents.size() == f.s.extents.size());
  CHECK(unpacked.extents[1].bound == f.bound);
  CHECK(unpacked.lanes[1][0].steps[2].extent == f.s.lanes[1][0].steps[2].extent);
  CHECK(unpacked.gemms[5].extent == f.s.gemms[5].extent);
  CHECK(pack(unpacked) == pack(f.s));
  // A schedule without extents writes no "extents" member: static schedules read and write as before.
  Schedule plain = f.s;
  plain.extents.clear();
  for (auto& g : plain.gemms) g.extent = kNoExtent;
  for (auto& lanes : plain.lanes)
    for (auto& lane : lanes)
      for (auto& st : lane.steps) st.extent = kNoExtent;
  CHECK(scheduleToJson(plain).find("extent") == std::string::npos);
}

TEST_CASE("extents: the readers refuse bad extents, naming the field") {
  const MoeDispatchGemm f;
  const std::string text = scheduleToJson(f.s);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    return t;
  };
  test::expectError([&] { scheduleFromJson(with("\"extent\":\"to3\"", "\"extent\":\"nope\"")); }, ErrorCode::ParseError,
                    "unknown extent 'nope'");
  test::expectError([&] { scheduleFromJson(with("\"bound\":4,\"expected\":2", "\"bound\":4,\"expected\":5")); },
                    ErrorCode::ParseError, "extents[0].expected");
  test::expectError([&] { scheduleFromJson(with("\"bound\":4,", "\"bound\":0,")); }, ErrorCode::ParseError,
                    "extents[0].bound");
  test::expectError([&] { scheduleFromJson(with("{\"name\":\"to1\"", "{\"name\":\"to0\"")); }, ErrorCode::ParseError,
                    "duplicate extent name 'to0'");
  // A packed image of the version before extents is refused with what to do.
  std::vector<uint8_t> image = pack(f.s);
  image[4] = 1;
  test::expectError([&] { unpack(image); }, ErrorCode::ParseError, "pack the schedule again");
}

TEST_CASE("extents: the validator checks indices, kinds and multiples of the bound") {
  MoeDispatchGemm f;
  Schedule s = f.s;
  s.lanes[0][0].steps[0].count += 1;  // no longer a multiple of the bound
  test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule,
                    "count 97 is not a multiple of the bound 4 of extent 'to0'");
  s = f.s;
  s.lanes[1][0].steps[1].extent = 99;
  test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule, "extent index 99 out of range (12 extents)");
  s = f.s;
  s.lanes[0][1].steps[0].extent = 0;  // a wait
  test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule, "a wait step takes no runtime extent");
  s = f.s;
  s.gemms[2].m = 6;
  test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule,
                    "gemms[2]: m 6 is not a multiple of the bound 4 of extent 'from1.0'");
  s = f.s;
  s.extents[1].expected = 9;
  test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule,
                    "extents[1] 'to1': expected must be in [0, bound 4]");
}

TEST_CASE("extents: the cost attributes price the expected value, or the values given") {
  MoeDispatchGemm f;
  const Step& put = f.s.lanes[0][0].steps[2];  // rank 0 -> rank 1 expert 0: "to2"
  REQUIRE(put.kind == StepKind::Put);
  const uint64_t full = uint64_t{f.bound} * f.hidden * 2;
  CHECK(put.bytes == full / 2);  // expected = bound / 2
  const Step& gg = f.s.lanes[1][1].steps[1];
  REQUIRE(gg.kind == StepKind::GroupedGemm);
  CHECK(gg.flops == doctest::Approx(2.0 * f.E * (f.bound / 2) * f.n * f.hidden));
  std::vector<std::vector<uint64_t>> tokens(f.R, std::vector<uint64_t>(f.R * f.E, 1));
  tokens[0][2] = 3;
  tokens[0][3] = 0;
  Schedule given = f.s;
  fillCostAttributes(given, f.valuesOf(tokens));
  CHECK(given.lanes[0][0].steps[2].bytes == 3 * f.hidden * 2);
  CHECK(given.lanes[0][0].steps[3].bytes == 0);
  // Rank 1's GEMM over what rank 0 sent it: experts 0 and 1 got 3 and 0 rows.
  CHECK(given.lanes[1][1].steps[1].flops == doctest::Approx(2.0 * 3 * f.n * f.hidden));
  test::expectError([&] { fillCostAttributes(given, ExtentValues(1)); }, ErrorCode::InvalidArgument,
                    "given for 1 ranks");
}

TEST_CASE("extents: values read from JSON by extent name, for every rank or one per rank") {
  const MoeDispatchGemm f;
  std::string text = "{\"schema\": \"mkernel.extents.v1\", \"values\": {";
  for (std::size_t e = 0; e < f.s.extents.size(); ++e)
    text += (e ? ", \"" : "\"") + f.s.extents[e].name + (e == 3 ? "\": [0, 1, 4]" : "\": 2");
  text += "}}";
  const ExtentValues v = extentValuesFromJson(f.s, text, "r.json");
  REQUIRE(v.size() == f.R);
  CHECK(v[0][0] == 2);
  CHECK(v[2][11] == 2);
  CHECK(v[0][3] == 0);
  CHECK(v[1][3] == 1);
  CHECK(v[2][3] == 4);
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  test::expectError([&] { extentValuesFromJson(f.s, edited("[0, 1, 4]", "[0, 1, 5]"), "r.json"); },
                    ErrorCode::ParseError, "r.json: values.to3[2]");
  test::expectError([&] { extentValuesFromJson(f.s, edited("[0, 1, 4]", "[0, 1]"), "r.json"); }, ErrorCode::ParseError,
                    "values.to3 has 2 values, expected one per rank (3)");
  test::expectError([&] { extentValuesFromJson(f.s, edited("\"to0\"", "\"nope\""), "r.json"); }, ErrorCode::ParseError,
                    "the schedule declares no extent 'nope'");
  test::expectError([&] { extentValuesFromJson(f.s, edited("\"to0\": 2, ", ""), "r.json"); }, ErrorCode::ParseError,
                    "values has no entry for extent 'to0'");
  test::expectError([&] { extentValuesFromJson(f.s, edited("v1", "v9"), "r.json"); }, ErrorCode::ParseError,
                    "schema must be");
}
