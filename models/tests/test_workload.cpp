// Tests of workloads: presets, checks naming the field, JSON round trip and overrides, resolving a layout.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

Workload withLayout(const std::string& preset, const std::function<void(Workload&)>& edit) {
  Workload w = workloadPreset(preset);
  edit(w);
  return w;
}

}  // namespace

TEST_CASE("workload: every preset is valid, sourced and has the public config's shape") {
  CHECK(workloadPresets() == std::vector<std::string>{"llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x22b"});
  for (const auto& name : workloadPresets()) {
    const Workload w = workloadPreset(name);
    CHECK(w.name == name);
    CHECK(workloadPresetSource(name).find("huggingface.co/") != std::string::npos);
    CHECK_NOTHROW(validateWorkload(w));
  }
  const Workload l70 = workloadPreset("llama3-70b");
  CHECK(l70.model.layers == 80);
  CHECK(l70.model.hidden == 8192);
  CHECK(l70.model.ffn == 28672);
  CHECK(l70.model.heads == 64);
  CHECK(l70.model.kvHeads == 8);
  CHECK(l70.model.vocab == 128256);
  const Workload mx = workloadPreset("mixtral-8x22b");
  REQUIRE(mx.model.moe);
  CHECK(mx.model.moe->experts == 8);
  CHECK(mx.model.moe->topK == 2);
  CHECK(mx.model.layers == 56);
  expectError([] { workloadPreset("llama2"); }, ErrorCode::NotFound, {"llama2", "llama3-8b", "mixtral-8x22b"});
}

TEST_CASE("workload: inconsistent shapes and layouts are refused, naming the field") {
  auto check = [](const std::function<void(Workload&)>& edit, const std::vector<std::string>& parts) {
    expectError([&] { validateWorkload(withLayout("llama3-70b", edit)); }, ErrorCode::InvalidArgument, parts);
  };
  check([](Workload& w) { w.layout.tp = 3; }, {"layout.tp 3", "model.heads 64"});
  check([](Workload& w) { w.layout.tp = 0; }, {"layout.tp must be >= 1"});
  check([](Workload& w) { w.model.kvHeads = 5; }, {"model.kvHeads 5", "model.heads 64"});
  check([](Workload& w) { w.model.hidden = 8190; }, {"model.heads 64 does not divide model.hidden 8190"});
  check([](Workload& w) { w.layout.ep = 2; }, {"layout.ep 2", "model.moe"});
  check([](Workload& w) { w.layout.zero = 4; }, {"layout.zero must be 0, 1, 2 or 3"});
  check([](Workload& w) { w.layout.zero = 3; }, {"layout.zero 3", "layout.pp 4"});
  check([](Workload& w) { w.layout.virtualStages = 2; }, {"layout.virtualStages must be 1", "interleaved"});
  check([](Workload& w) { w.layout.pp = 81; }, {"layout.pp 81 exceeds model.layers 80"});
  check([](Workload& w) { w.training.microBatch = 3; }, {"training.microBatch 3", "training.globalBatch 512"});
  check([](Workload& w) { w.training.dtype = DType::Float32; }, {"training.dtype must be bfloat16 or float16"});
  check(
      [](Workload& w) {
        w.layout.dp = 3;
        w.layout.ep = 1;
        w.model.moe = MoeSpec{4, 1, 0};
        w.layout.ep = 2;
      },
      {"layout.ep 2 does not divide layout.dp 3"});
  expectError([] { validateWorkload(withLayout("mixtral-8x22b", [](Workload& w) { w.layout.sp = false; })); },
              ErrorCode::InvalidArgument, {"layout.sp must be true", "mixture-of-experts"});
  expectError([] { validateWorkload(withLayout("mixtral-8x22b", [](Workload& w) { w.layout.ep = 3; })); },
              ErrorCode::InvalidArgument, {"layout.ep 3 does not divide model.moe.experts 8"});
}

TEST_CASE("workload: JSON round trip, preset overrides, and parse errors naming the field") {
  for (const auto& name : workloadPresets()) {
    const Workload a = workloadPreset(name);
    const Workload b = workloadFromJson(workloadToJson(a));
    CHECK(workloadToJson(a) == workloadToJson(b));
  }
  const Workload o = workloadFromJson(
      R"({"preset": "llama3-70b", "name": "mine", "training": {"seq": 4096}, "layout": {"tp": 4, "dp": 16}})");
  CHECK(o.name == "mine");
  CHECK(o.training.seq == 4096);
  CHECK(o.training.globalBatch == 512);  // kept from the preset
  CHECK(o.layout.tp == 4);
  REQUIRE(o.layout.dp);
  CHECK(*o.layout.dp == 16);
  CHECK(o.model.hidden == 8192);

  auto bad = [](const std::string& text, ErrorCode code, const std::vector<std::string>& parts) {
    expectError([&] { workloadFromJson(text); }, code, parts);
  };
  bad("{", ErrorCode::ParseError, {"workload: not valid JSON"});
  bad(R"({"preset": "llama3-70b", "layout": {"tpp": 4}})", ErrorCode::ParseError, {"unknown field layout.tpp"});
  bad(R"({"preset": "llama3-70b", "layout": {"tp": -1}})", ErrorCode::ParseError,
      {"layout.tp must be a whole number in [0, 4294967295] (got number -1)"});
  bad(R"({"preset": "llama3-70b", "layout": {"dp": "many"}})", ErrorCode::ParseError,
      {"layout.dp must be a positive integer or \"auto\""});
  bad(R"({"preset": "llama3-70b", "layout": {"ppSchedule": "zb"}})", ErrorCode::ParseError, {"layout.ppSchedule"});
  bad(R"({"preset": "llama3-70b", "training": {"dtype": "int8"}})", ErrorCode::ParseError, {"training.dtype"});
  bad(R"({"preset": "llama3-70b", "layout": {"tp": 5}})", ErrorCode::InvalidArgument, {"layout.tp 5"});
  bad(R"({"preset": "gpt5"})", ErrorCode::NotFound, {"unknown workload preset 'gpt5'"});
  bad(R"({"schema": "mkernel.workload.v1", "training": {"seq": 1, "microBatch": 1, "globalBatch": 1}})",
      ErrorCode::ParseError, {"missing field model"});
  bad(R"({"schema": "mkernel.workload.v1", "model": {"layers": 2, "hidden": 64, "ffn": 128, "heads": 4,
         "kvHeads": 4}, "training": {"seq": 1, "microBatch": 1, "globalBatch": 1}})",
      ErrorCode::ParseError, {"missing field model.vocab"});
  bad(R"({"model": {}})", ErrorCode::ParseError, {"missing field schema"});
}

TEST_CASE("workload: resolving a layout for a GPU count, with the field that does not fit named") {
  const Workload w = workloadPreset("llama3-70b");  // tp 8, pp 4, dp auto, global 512, micro 1
  const ResolvedLayout r = resolveLayout(w, 256);
  CHECK(r.dp == 8);
  CHECK(r.microBatches == 64);
  CHECK(r.stageLayers == std::vector<uint32_t>{20, 20, 20, 20});
  expectError([&] { resolveLayout(w, 48); }, ErrorCode::InvalidArgument,
              {"layout.tp x layout.pp = 32 does not divide 48 GPUs"});
  expectError([&] { resolveLayout(w, 32 * 1024); }, ErrorCode::InvalidArgument,
              {"training.globalBatch 512 is not a multiple of dp x microBatch = 1024"});
  Workload fixed = w;
  fixed.layout.dp = 4;
  CHECK(resolveLayout(fixed, 128).dp == 4);
  expectError([&] { resolveLayout(fixed, 256); }, ErrorCode::InvalidArgument,
              {"layout.dp 4 gives 128 GPUs", "not 256"});
  const ResolvedLayout big = resolveLayout(workloadPreset("llama3-405b"), 128 * 16);
  REQUIRE(big.stageLayers.size() == 16);
  CHECK(big.stageLayers.front() == 8);  // 126 = 14 x 8 + 2 x 7: the first stages take the extra layers
  CHECK(big.stageLayers.back() == 7);
  uint32_t sum = 0;
  for (uint32_t l : big.stageLayers) sum += l;
  CHECK(sum == 126);
}

TEST_CASE("workload: sizes whose products overflow 64 bits are refused naming the factors, never wrapped") {
  auto check = [](const std::function<void(Workload&)>& edit, const std::vector<std::string>& parts) {
    expectError([&] { validateWorkload(withLayout("llama3-8b", edit)); }, ErrorCode::InvalidArgument, parts);
  };
  // A hidden size of 2^62: tokens x hidden wrapped to 0 and surfaced as "count must be > 0 (got 0)".
  check([](Workload& w) { w.model.hidden = uint64_t{1} << 62; },
        {"training.microBatch x training.seq x model.hidden x bytes per element", "4611686018427387904",
         "overflows 64 bits"});
  // 2^30 sequences of 2^40 tokens: the tokens of a step wrapped to 64 and gave a wrong throughput with exit 0.
  check(
      [](Workload& w) {
        w.training.seq = uint64_t{1} << 40;
        w.training.globalBatch = uint64_t{1} << 30;
      },
      {"training.globalBatch x training.seq = 1073741824 x 1099511627776 overflows 64 bits"});
  check(
      [](Workload& w) {
        w.model.ffn = uint64_t{1} << 61;
        w.layout.tp = 1;
      },
      {"parameters", "overflows 64 bits"});
  // An expert model: the routed rows count topK copies of each token.
  expectError(
      [] { validateWorkload(withLayout("mixtral-8x22b", [](Workload& w) { w.model.hidden = uint64_t{3} << 58; })); },
      ErrorCode::InvalidArgument, {"model.hidden x model.moe.topK x bytes per element", "overflows 64 bits"});
}

TEST_CASE("workload: a gradient bucket outside [4 KiB, 1e6 MiB] is an error, never silently the default") {
  // 1e-9 MiB rounds to 0 bytes, which used to mean "the default 25 MiB".
  expectError([] { workloadFromJson(R"({"preset": "llama3-8b", "layout": {"bucketMiB": 1e-9}})"); },
              ErrorCode::ParseError, {"layout.bucketMiB must be in [0.00390625, 1e6] MiB", "1e-09"});
  expectError([] { workloadFromJson(R"({"preset": "llama3-8b", "layout": {"bucketMiB": 0.001}})"); },
              ErrorCode::ParseError, {"layout.bucketMiB"});
  CHECK(workloadFromJson(R"({"preset": "llama3-8b", "layout": {"bucketMiB": 0.00390625}})").layout.bucketBytes == 4096);
  CHECK(workloadPreset("llama3-8b").layout.bucketBytes == kDefaultBucketBytes);
  // A bucket of 0 bytes set in code (or by --bucket 0) is refused too: 0 no longer stands for the default.
  expectError([] { validateWorkload(withLayout("llama3-8b", [](Workload& w) { w.layout.bucketBytes = 0; })); },
              ErrorCode::InvalidArgument, {"layout.bucketMiB (--bucket) must be in [4 KiB, 1e6 MiB] (got 0 bytes)"});
}
