// The attention step kind (mk/schedule/attention.hpp): one block of queries against one block of keys and values,
// run by the CPU executor against a double reference (causal with offsets, GQA, a row that sees no key), merged by
// lse-merge exactly; its JSON and packed forms, the validator's refusals and its price.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

using namespace mk;

namespace {

enum Buf : uint16_t { kQ, kKv, kOut, kPart };

/// One rank, buffers q (dtype, B x ldq x Hq x D), kv (K then V, B x ldkv x Hkv x D each), out and part (float32,
/// B x ldo x Hq x (D + 1)); the shape `sh` is attentions[0], its vOffset set to K's size.
Schedule oneRank(AttentionShape sh, DType dtype = DType::BFloat16) {
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  const uint64_t kSize = uint64_t{sh.batch} * sh.ldkv * sh.kvHeads * sh.headDim;
  sh.vOffset = kSize;
  const uint64_t outSize = uint64_t{sh.batch} * sh.ldo * sh.qHeads * sh.outRow();
  s.buffers = {{"q", dtype, BufferKind::Input, {uint64_t{sh.batch} * sh.ldq * sh.qHeads * sh.headDim}},
               {"kv", dtype, BufferKind::Input, {2 * kSize}},
               {"out", DType::Float32, BufferKind::Output, {outSize}},
               {"part", DType::Float32, BufferKind::Scratch, {outSize}}};
  s.attentions = {sh};
  s.lanes.resize(1);
  s.lanes[0].push_back(Lane{LaneRole::Compute, 1, {}});
  return s;
}

Step attentionStep(uint32_t shape, BufRef dst, BufRef q, BufRef kv) {
  Step st;
  st.kind = StepKind::Attention;
  st.aux = shape;
  st.dst = dst;
  st.a = q;
  st.b = kv;
  return st;
}

/// Random q and kv in [-1, 1], rounded to the buffers' dtype.
void fillInputs(const Schedule& s, HostMemory& mem, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint16_t b : {kQ, kKv})
    for (uint64_t i = 0; i < s.buffers[b].count[0]; ++i)
      storeElement(s.buffers[b].dtype, mem.bytes[0][b].data(), i, u(rng));
}

float at(const Schedule& s, const HostMemory& mem, uint16_t b, uint64_t i) {
  return loadElement(s.buffers[b].dtype, mem.bytes[0][b].data(), i);
}

/// The reference of one output row (b, i, h): softmax over the keys j with kvPos + j <= qPos + i (all without a
/// mask) of scale x q.k, times V, in double; {0..., -inf} when it sees none.
std::vector<double> referenceRow(const Schedule& s, const HostMemory& mem, uint64_t b, uint64_t i, uint64_t h) {
  const AttentionShape& sh = s.attentions[0];
  const uint64_t d = sh.headDim, kvh = h / (sh.qHeads / sh.kvHeads);
  std::vector<double> row(d + 1, 0.0), w;
  double top = -std::numeric_limits<double>::infinity();
  for (uint64_t j = 0; j < sh.skv; ++j) {
    if (sh.causal && sh.kvPos + j > sh.qPos + i) continue;
    double dot = 0;
    for (uint64_t c = 0; c < d; ++c)
      dot += double{at(s, mem, kQ, ((b * sh.ldq + i) * sh.qHeads + h) * d + c)} *
             at(s, mem, kKv, ((b * sh.ldkv + j) * sh.kvHeads + kvh) * d + c);
    w.push_back(sh.scale * dot);
    top = std::max(top, w.back());
  }
  if (w.empty()) {
    row[d] = -std::numeric_limits<double>::infinity();
    return row;
  }
  double sum = 0;
  uint64_t n = 0;
  for (uint64_t j = 0; j < sh.skv; ++j) {
    if (sh.causal && sh.kvPos + j > sh.qPos + i) continue;
    const double e = std::exp(w[n++] - top);
    sum += e;
    for (uint64_t c = 0; c < d; ++c)
      row[c] += e * at(s, mem, kKv, sh.vOffset + ((b * sh.ldkv + j) * sh.kvHeads + kvh) * d + c);
  }
  for (uint64_t c = 0; c < d; ++c) row[c] /= sum;
  row[d] = top + std::log(sum);
  return row;
}

AttentionShape shape(uint32_t B, uint32_t hq, uint32_t hkv, uint32_t d, uint32_t sq, uint32_t skv) {
  AttentionShape sh;
  sh.batch = B;
  sh.qHeads = hq;
  sh.kvHeads = hkv;
  sh.headDim = d;
  sh.sq = sh.ldq = sh.ldo = sq;
  sh.skv = sh.ldkv = skv;
  sh.scale = defaultAttentionScale(d);
  return sh;
}

}  // namespace

TEST_CASE("attention: one step matches a double reference, causal with offsets, GQA, strided batches") {
  AttentionShape sh = shape(2, 4, 2, 6, 5, 7);
  sh.ldq = 6;  // Q, K/V and out blocks are slices of longer sequences
  sh.ldkv = 9;
  sh.ldo = 8;
  sh.causal = true;
  sh.qPos = 3;  // rows 0 and 1 (positions 3, 4) see no key, row 2 sees key 0 (position 5), row 4 sees three
  sh.kvPos = 5;
  Schedule s = oneRank(sh);
  s.lanes[0][0].steps.push_back(attentionStep(0, bufRef(0, kOut, 0), bufRef(0, kQ, 0), bufRef(0, kKv, 0)));
  fillCostAttributes(s);
  validate(s);
  HostMemory mem = HostMemory::allocate(s);
  fillInputs(s, mem, 1);
  const float sentinel = 7.0f;  // rows between the batches' blocks stay untouched
  for (uint64_t k = 0; k < s.buffers[kOut].count[0]; ++k)
    storeElement(DType::Float32, mem.bytes[0][kOut].data(), k, sentinel);
  execute(s, mem);
  const AttentionShape& shp = s.attentions[0];
  uint64_t masked = 0;
  for (uint64_t b = 0; b < shp.batch; ++b)
    for (uint64_t i = 0; i < shp.ldo; ++i)
      for (uint64_t h = 0; h < shp.qHeads; ++h) {
        const uint64_t o = ((b * shp.ldo + i) * shp.qHeads + h) * shp.outRow();
        if (i >= shp.sq) {
          CHECK(at(s, mem, kOut, o) == sentinel);
          continue;
        }
        const std::vector<double> ref = referenceRow(s, mem, b, i, h);
        if (std::isinf(ref[shp.headDim])) {
          ++masked;
          CHECK(at(s, mem, kOut, o + shp.headDim) == -std::numeric_limits<float>::infinity());
          for (uint64_t c = 0; c < shp.headDim; ++c) CHECK(at(s, mem, kOut, o + c) == 0.0f);
          continue;
        }
        for (uint64_t c = 0; c <= shp.headDim; ++c)
          CHECK(at(s, mem, kOut, o + c) == doctest::Approx(ref[c]).epsilon(1e-5));
      }
  CHECK(masked == 2 * 2 * 4);  // rows 0 and 1 of both batches, every head
}

TEST_CASE("attention: an lse-merge of two key blocks equals the step over the whole block, a masked half included") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    AttentionShape whole = shape(1, 3, 1, 8, 6, 10);  // MQA: three query heads on one KV head
    whole.causal = causal;
    whole.qPos = 4;  // causal: rows 0 .. 0 see nothing of the second half (keys 5 ..), all see some of the first
    Schedule s = oneRank(whole, DType::Float32);
    AttentionShape firstHalf = s.attentions[0], secondHalf = s.attentions[0];
    firstHalf.skv = secondHalf.skv = 5;
    secondHalf.kvPos = 5;
    s.attentions.push_back(firstHalf);
    s.attentions.push_back(secondHalf);
    const uint64_t rows = uint64_t{whole.sq} * whole.qHeads, kvRow = uint64_t{whole.kvHeads} * whole.headDim;
    auto& steps = s.lanes[0][0].steps;
    steps.push_back(attentionStep(1, bufRef(0, kOut, 0), bufRef(0, kQ, 0), bufRef(0, kKv, 0)));
    steps.push_back(attentionStep(2, bufRef(0, kPart, 0), bufRef(0, kQ, 0), bufRef(0, kKv, 5 * kvRow)));
    Step merge;
    merge.kind = StepKind::Reduce;
    merge.op = RedOp::LseMerge;
    merge.aux = whole.headDim;
    merge.count = rows * (whole.headDim + 1);
    merge.dst = merge.a = bufRef(0, kOut, 0);
    merge.b = bufRef(0, kPart, 0);
    steps.push_back(merge);
    // The whole block into part's second half would overlap nothing: run it as a separate schedule instead.
    Schedule ref = oneRank(whole, DType::Float32);
    ref.lanes[0][0].steps.push_back(attentionStep(0, bufRef(0, kOut, 0), bufRef(0, kQ, 0), bufRef(0, kKv, 0)));
    for (Schedule* x : {&s, &ref}) {
      fillCostAttributes(*x);
      validate(*x);
    }
    HostMemory a = HostMemory::allocate(s), b = HostMemory::allocate(ref);
    fillInputs(s, a, 2);
    fillInputs(ref, b, 2);
    execute(s, a);
    execute(ref, b);
    uint64_t maskedHalves = 0;
    for (uint64_t k = 0; k < s.buffers[kOut].count[0]; ++k) {
      CHECK(at(s, a, kOut, k) == doctest::Approx(at(ref, b, kOut, k)).epsilon(1e-5));
      if (k % (whole.headDim + 1) == whole.headDim && std::isinf(at(s, a, kPart, k))) ++maskedHalves;
    }
    CHECK(maskedHalves == (causal ? whole.qHeads : 0));  // row 0 (position 4) sees no key of the second half
  }
}

TEST_CASE("attention: JSON and the packed form keep the shapes and steps, and run the same") {
  AttentionShape sh = shape(2, 4, 2, 6, 5, 7);
  sh.ldkv = 9;
  sh.causal = true;
  sh.scale = 0.3f;
  sh.qPos = 11;
  sh.kvPos = 8;
  Schedule s = oneRank(sh);
  s.lanes[0][0].steps.push_back(attentionStep(0, bufRef(0, kOut, 0), bufRef(0, kQ, 0), bufRef(0, kKv, 0)));
  fillCostAttributes(s);
  const std::string text = scheduleToJson(s, 2);
  CHECK(text.find("\"kind\": \"attention\", \"attention\": 0") != std::string::npos);
  CHECK(text.find("\"qPos\": 11, \"kvPos\": 8, \"causal\": true") != std::string::npos);
  const Schedule back = scheduleFromJson(text);
  CHECK(scheduleToJson(back, 2) == text);
  CHECK(back.attentions[0].scale == 0.3f);
  const Schedule unpacked = unpack(pack(s));
  CHECK(pack(unpacked) == pack(s));
  CHECK(unpacked.attentions[0].vOffset == s.attentions[0].vOffset);
  CHECK(unpacked.lanes[0][0].steps[0].flops == s.lanes[0][0].steps[0].flops);
  HostMemory a = HostMemory::allocate(s);
  fillInputs(s, a, 3);
  HostMemory b = a, c = a;
  execute(s, a);
  execute(back, b);
  execute(unpacked, c);
  CHECK(a.bytes == b.bytes);
  CHECK(a.bytes == c.bytes);
  // Defaults: leading dimensions of a whole block, positions 0, scale 1 / sqrt(headDim).
  const Schedule minimal = scheduleFromJson(
      R"({"schema":"mkernel.schedule.v1","nRanks":1,"nodeOf":[0],"buffers":[],"attentions":[{"batch":1,"qHeads":2,)"
      R"("kvHeads":1,"headDim":16,"sq":3,"skv":4,"vOffset":64}],"ranks":[{"lanes":[]}]})");
  CHECK(minimal.attentions[0].ldq == 3);
  CHECK(minimal.attentions[0].ldkv == 4);
  CHECK(minimal.attentions[0].ldo == 3);
  CHECK(minimal.attentions[0].scale == 0.25f);
  CHECK_FALSE(minimal.attentions[0].causal);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = scheduleToJson(s);
    const auto where = t.find(from);
    REQUIRE(where != std::string::npos);
    t.replace(where, from.size(), to);
    return t;
  };
  test::expectError([&] { scheduleFromJson(with("\"headDim\":6,", "")); }, ErrorCode::ParseError,
                    "attentions[0].headDim: required field is missing");
  test::expectError([&] { scheduleFromJson(with("\"scale\":", "\"scale\":-")); }, ErrorCode::ParseError,
                    "attentions[0].scale");
  test::expectError([&] { scheduleFromJson(with("\"causal\":true", "\"causal\":true,\"window\":3")); },
                    ErrorCode::ParseError, "unknown field 'window'");
  // A packed step naming a shape past the table is refused when unpacked.
  Schedule past = s;
  past.lanes[0][0].steps[0].aux = 1;
  test::expectError([&] { unpack(pack(past)); }, ErrorCode::ParseError,
                    "attention index 1 out of range (nAttentions 1)");
}

TEST_CASE("attention: the validator refuses bad shapes, dtypes, ranges and overlaps, naming them") {
  auto refused = [&](auto edit, const std::string& part) {
    Schedule s = oneRank(shape(2, 4, 2, 6, 5, 7));
    s.lanes[0][0].steps.push_back(attentionStep(0, bufRef(0, kOut, 0), bufRef(0, kQ, 0), bufRef(0, kKv, 0)));
    edit(s);
    CAPTURE(part);
    test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule, part.c_str());
  };
  refused([](Schedule& s) { s.attentions[0].kvHeads = 3; }, "attentions[0]: qHeads 4 is not a multiple of kvHeads 3");
  refused([](Schedule& s) { s.attentions[0].sq = 0; }, "attentions[0]: batch, qHeads, kvHeads, headDim, sq, skv");
  refused([](Schedule& s) { s.attentions[0].ldkv = 6; }, "attentions[0]: ldkv 6 < skv 7");
  refused([](Schedule& s) { s.attentions[0].scale = std::numeric_limits<float>::infinity(); },
          "attentions[0]: scale must be finite and > 0");
  refused([](Schedule& s) { s.attentions[0].vOffset = 5; }, "attentions[0]: vOffset 5 < the 168 elements of K");
  refused([](Schedule& s) { s.lanes[0][0].steps[0].aux = 1; }, "attention index 1 out of range (1 shapes)");
  refused([](Schedule& s) { s.buffers[kOut].dtype = DType::BFloat16; },
          "out (dst) 'out' is bfloat16, expected float32");
  refused([](Schedule& s) { s.buffers[kKv].dtype = DType::Float32; },
          "Q and K/V must share one dtype of float32, bfloat16, float16");
  refused([](Schedule& s) { s.lanes[0][0].steps[0].b.offset = 1; }, "K/V (b)");
  refused([](Schedule& s) { s.lanes[0][0].steps[0].dst.offset = 1; }, "out (dst)");
  refused(
      [](Schedule& s) {
        s.buffers[kQ].dtype = s.buffers[kKv].dtype = DType::Float32;
        s.buffers[kQ].count[0] += 1000;
        s.lanes[0][0].steps[0].dst = bufRef(0, kQ, 100);
      },
      "overlaps Q (a)");
  // Two lanes writing one out block without a flag between them race.
  refused(
      [](Schedule& s) {
        s.lanes[0].push_back(s.lanes[0][0]);
        fillCostAttributes(s);
      },
      "race on rank 0 buffer 'out'");
}

TEST_CASE("attention: its price counts the unmasked pairs exactly, on the tensor cores, and the GPU refuses it") {
  for (bool causal : {false, true})
    for (uint64_t qPos : {0u, 3u, 9u, 20u})
      for (uint64_t kvPos : {0u, 4u, 13u}) {
        AttentionShape sh = shape(2, 6, 2, 24, 7, 9);
        sh.causal = causal;
        sh.qPos = qPos;
        sh.kvPos = kvPos;
        uint64_t pairs = 0;
        for (uint64_t i = 0; i < sh.sq; ++i)
          for (uint64_t j = 0; j < sh.skv; ++j) pairs += sh.sees(i, j) ? 1 : 0;
        CAPTURE(causal);
        CAPTURE(qPos);
        CAPTURE(kvPos);
        CHECK(attentionPairs(sh) == pairs);
        Schedule s = oneRank(sh);
        s.lanes[0][0].steps.push_back(attentionStep(0, bufRef(0, kOut, 0), bufRef(0, kQ, 0), bufRef(0, kKv, 0)));
        fillCostAttributes(s);
        const Step& st = s.lanes[0][0].steps[0];
        CHECK(st.flops == 4.0 * 2 * 6 * 24 * static_cast<double>(pairs));
        CHECK(st.bytes == (2 * 7 * 6 + 2 * 2 * 9 * 2) * 24 * 2 + 2 * 7 * 6 * 25 * 4);
        CHECK(stepResource(s, st, 0, 0, 0) == StepResource::Tensor);
      }
  CHECK(kindInfo(StepKind::Attention).gpu);  // the compute lane runs it (impl/src/lowering/attention_step.cpp)
  CHECK(kindInfo(StepKind::Attention).extent == StepExtent::Attention);
}
