// mkernel — workloads <-> JSON ("mkernel.workload.v1", docs/planner.md).
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../util/json_fields.hpp"
#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/io.hpp"
#include "mk/util/size.hpp"
#include "mk/workload/model_shape.hpp"
#include "mk/workload/workload.hpp"

namespace mk {

namespace {

using Json = nlohmann::json;
using detail::JsonFields;

constexpr const char* kWorkloadSchema = "mkernel.workload.v1";
constexpr const char* kDoc = "workload";

DType dtypeField(const JsonFields& f, const char* key) {
  const std::string s = f.text(key);
  const auto d = parseDType(s);
  if (!d || dtypeInfo(*d).integer)
    f.fail(f.name(key) + " must be bfloat16, float16 or float32 (got \"" + excerpt(s) + "\")");
  return *d;
}

/// `required`: the field must be there (a file without a preset); otherwise it overrides `v` when present.
template <typename T, typename Read>
void field(const JsonFields& f, const char* key, bool required, T& v, Read read) {
  if (required || f.has(key)) v = read(key);
}

/// The routing model of model.moe: "routing": "balanced" (imbalance 1), "imbalance" >= 1, "capacityFactor" > 0.
void readRouting(const JsonFields& moe, MoeSpec& spec) {
  if (moe.has("routing") && moe.text("routing") != "balanced")
    moe.fail(moe.name("routing") + " must be \"balanced\" (got \"" + excerpt(moe.text("routing")) +
             "\"); give an imbalance or a capacityFactor for other routing");
  if (moe.has("routing")) spec.imbalance = 1;
  if (moe.has("imbalance")) {
    spec.imbalance = moe.number("imbalance");
    if (!(spec.imbalance >= 1))
      moe.fail(moe.name("imbalance") + " must be >= 1: the busiest rank's tokens over the balanced share (got " +
               describeJson(moe.value("imbalance")) + ")");
  }
  if (moe.has("capacityFactor")) {
    spec.capacityFactor = moe.number("capacityFactor");
    if (!(spec.capacityFactor > 0))
      moe.fail(moe.name("capacityFactor") + " must be > 0 (got " + describeJson(moe.value("capacityFactor")) +
               "); leave it out for dropless routing");
  }
}

void readMoe(const JsonFields& f, ModelShape& m) {
  if (f.value("moe").is_null()) {
    m.moe.reset();  // a preset's experts removed
    return;
  }
  const JsonFields moe = f.object("moe");
  moe.onlyKeys({"experts", "topK", "ffn", "sharedExperts", "sharedFfn", "firstDenseLayers", "layerFreq", "routing",
                "imbalance", "capacityFactor"});
  MoeSpec spec = m.moe.value_or(MoeSpec{});
  const bool wholeMoe = !m.moe;
  auto c32 = [&](const char* k) { return moe.count32(k); };
  auto c64 = [&](const char* k) { return moe.count64(k); };
  field(moe, "experts", wholeMoe, spec.experts, c32);
  field(moe, "topK", wholeMoe, spec.topK, c32);
  field(moe, "ffn", false, spec.ffn, c64);
  field(moe, "sharedExperts", false, spec.sharedExperts, c32);
  field(moe, "sharedFfn", false, spec.sharedFfn, c64);
  field(moe, "firstDenseLayers", false, spec.firstDenseLayers, c32);
  field(moe, "layerFreq", false, spec.layerFreq, c32);
  readRouting(moe, spec);
  m.moe = spec;
}

void readMla(const JsonFields& f, ModelShape& m) {
  if (f.value("mla").is_null()) {
    m.mla.reset();
    return;
  }
  const JsonFields mla = f.object("mla");
  mla.onlyKeys({"qLoraRank", "kvLoraRank", "qkNopeHeadDim", "qkRopeHeadDim", "vHeadDim"});
  MlaSpec spec = m.mla.value_or(MlaSpec{});
  const bool whole = !m.mla;
  auto c64 = [&](const char* k) { return mla.count64(k); };
  field(mla, "qLoraRank", false, spec.qLoraRank, c64);
  field(mla, "kvLoraRank", whole, spec.kvLoraRank, c64);
  field(mla, "qkNopeHeadDim", whole, spec.qkNopeHeadDim, c64);
  field(mla, "qkRopeHeadDim", whole, spec.qkRopeHeadDim, c64);
  field(mla, "vHeadDim", whole, spec.vHeadDim, c64);
  m.mla = spec;
}

/// "slidingWindowPattern": n (every n-th layer has full attention, the others a window) or a list of "sliding" /
/// "full" repeated over the layers.
std::vector<uint8_t> slidingPatternField(const JsonFields& f, const char* key) {
  const Json& j = f.value(key);
  std::vector<uint8_t> out;
  if (j.is_array()) {
    for (const Json& e : j) {
      if (!e.is_string() || (e.get<std::string>() != "sliding" && e.get<std::string>() != "full"))
        f.fail(f.name(key) + " entries must be \"sliding\" or \"full\" (got " + describeJson(e) + ")");
      out.push_back(e.get<std::string>() == "sliding" ? 1 : 0);
    }
    if (out.empty()) f.fail(f.name(key) + " must not be empty (omit it: every layer is windowed)");
    return out;
  }
  if (!j.is_number_unsigned() || j.get<uint64_t>() < 1 || j.get<uint64_t>() > 1000000)
    f.fail(f.name(key) + " must be n >= 1 (every n-th layer has full attention) or a list of \"sliding\" / " +
           "\"full\" (got " + describeJson(j) + ")");
  out.assign(j.get<uint64_t>(), 1);
  out.back() = 0;
  return out;
}

void readModel(const JsonFields& f, bool whole, ModelShape& m) {
  f.onlyKeys({"layers", "hidden", "ffn", "heads", "kvHeads", "vocab", "gatedMlp", "activation", "moe", "headDim",
              "tiedEmbeddings", "vocabPadMultiple", "mla", "slidingWindow", "slidingWindowPattern"});
  auto c32 = [&](const char* k) { return f.count32(k); };
  auto c64 = [&](const char* k) { return f.count64(k); };
  auto flag = [&](const char* k) { return f.boolean(k); };
  field(f, "layers", whole, m.layers, c32);
  field(f, "hidden", whole, m.hidden, c64);
  field(f, "ffn", whole, m.ffn, c64);
  field(f, "heads", whole, m.heads, c32);
  field(f, "kvHeads", whole, m.kvHeads, c32);
  field(f, "vocab", whole, m.vocab, c64);
  if (f.has("gatedMlp") && f.has("activation"))
    f.fail(f.name("gatedMlp") + " and " + f.name("activation") + " both given: keep \"activation\" only");
  // The earlier field: true was SwiGLU, false GELU.
  if (f.has("gatedMlp")) m.activation = f.boolean("gatedMlp") ? Activation::SwiGlu : Activation::Gelu;
  field(f, "activation", false, m.activation, [&](const char* k) {
    const std::string s = f.text(k);
    const auto a = parseActivation(s);
    if (!a)
      f.fail(f.name(k) + " must be \"swiglu\", \"geglu\", \"gelu\" or \"squared-relu\" (got \"" + excerpt(s) + "\")");
    return *a;
  });
  field(f, "headDim", false, m.explicitHeadDim, c64);
  field(f, "tiedEmbeddings", false, m.tiedEmbeddings, flag);
  field(f, "vocabPadMultiple", false, m.vocabPadMultiple, c32);
  field(f, "slidingWindow", false, m.slidingWindow, c64);
  field(f, "slidingWindowPattern", false, m.slidingPattern, [&](const char* k) { return slidingPatternField(f, k); });
  if (f.has("moe")) readMoe(f, m);
  if (f.has("mla")) readMla(f, m);
}

/// training.recomputeModules, a list of module names; "selective" without it is Megatron-LM's default, core_attn.
void readRecomputeModules(const JsonFields& f, TrainingSpec& t) {
  if (t.recompute != Recompute::Selective) {
    if (f.has("recomputeModules"))
      f.fail(f.name("recomputeModules") + " needs \"recompute\": \"selective\" (got \"" + toString(t.recompute) +
             "\")");
    t.recomputeModules = {};
    return;
  }
  if (!f.has("recomputeModules")) {
    if (!t.recomputeModules.any()) t.recomputeModules.coreAttn = true;
    return;
  }
  const Json& list = f.value("recomputeModules");
  RecomputeModules m;
  if (!list.is_array() || list.empty())
    f.fail(f.name("recomputeModules") + " must be a non-empty list of module names (got " + describeJson(list) + ")");
  for (const Json& e : list)
    if (!e.is_string() || !setRecomputeModule(m, e.get<std::string>()))
      f.fail(f.name("recomputeModules") + " entries must be \"core_attn\", \"mlp\", \"moe_act\" or \"norms\" (got " +
             describeJson(e) + ")");
  t.recomputeModules = m;
}

void readTraining(const JsonFields& f, bool whole, TrainingSpec& t) {
  f.onlyKeys({"seq", "microBatch", "globalBatch", "dtype", "recompute", "recomputeModules", "gradAccumFusion"});
  field(f, "seq", whole, t.seq, [&](const char* k) { return f.count64(k); });
  field(f, "microBatch", whole, t.microBatch, [&](const char* k) { return f.count32(k); });
  field(f, "globalBatch", whole, t.globalBatch, [&](const char* k) { return f.count64(k); });
  if (f.has("dtype")) {
    // "fp8" is a recipe, not one element type: FP8 GEMMs over bf16 weights and activations.
    const std::string s = f.text("dtype");
    t.fp8 = s == "fp8";
    if (t.fp8) {
      t.dtype = DType::BFloat16;
    } else {
      const auto d = parseDType(s);
      if (!d || dtypeInfo(*d).integer)  // int32 is routing data, never a model's element type
        f.fail(f.name("dtype") + " must be bfloat16, float16, float32 or fp8 (got \"" + excerpt(s) + "\")");
      t.dtype = *d;
    }
  }
  field(f, "recompute", false, t.recompute, [&](const char* k) {
    const std::string s = f.text(k);
    if (s == "none") return Recompute::None;
    if (s == "full") return Recompute::Full;
    if (s == "selective") return Recompute::Selective;
    f.fail(f.name(k) + " must be \"none\", \"full\" or \"selective\" (got \"" + excerpt(s) + "\")");
  });
  readRecomputeModules(f, t);
  field(f, "gradAccumFusion", false, t.gradAccumFusion, [&](const char* k) { return f.boolean(k); });
}

void readLayout(const JsonFields& f, ParallelLayout& l) {
  // clang-format off
  f.onlyKeys({"tp", "pp", "dp", "cp", "cpCommType", "cpA2aSize", "ep", "etp", "sp", "ppSchedule", "virtualStages",
              "zero", "bucketMiB", "gradDtype", "overlapGradReduce", "overlapParamGather", "tpCommOverlap",
              "overlapPpComm", "overlapMoeA2a", "overlapSms"});
  // clang-format on
  auto c32 = [&](const char* k) { return f.count32(k); };
  auto flag = [&](const char* k) { return f.boolean(k); };
  field(f, "tp", false, l.tp, c32);
  field(f, "pp", false, l.pp, c32);
  if (f.has("dp")) {
    const Json& j = f.value("dp");
    if (j.is_string()) {
      if (j.get<std::string>() != "auto")
        f.fail(f.name("dp") + " must be a positive integer or \"auto\" (got " + describeJson(j) + ")");
      l.dp.reset();
    } else {
      l.dp = f.count32("dp");
    }
  }
  field(f, "cp", false, l.cp, c32);
  field(f, "cpCommType", false, l.cpCommType, [&](const char* k) {
    const std::string s = f.text(k);
    for (CpCommType c : {CpCommType::P2p, CpCommType::AllGather, CpCommType::A2a, CpCommType::A2aP2p})
      if (s == toString(c)) return c;
    f.fail(f.name(k) + " must be \"p2p\", \"all-gather\", \"a2a\" or \"a2a+p2p\" (got \"" + excerpt(s) + "\")");
  });
  field(f, "cpA2aSize", false, l.cpA2aSize, c32);
  field(f, "ep", false, l.ep, c32);
  field(f, "etp", false, l.etp, c32);
  field(f, "sp", false, l.sp, flag);
  field(f, "ppSchedule", false, l.schedule, [&](const char* k) {
    const std::string s = f.text(k);
    if (s == "1f1b") return PipelineSchedule::OneFOneB;
    if (s == "interleaved") return PipelineSchedule::Interleaved;
    if (s == "gpipe") return PipelineSchedule::GPipe;
    f.fail(f.name(k) + " must be \"1f1b\", \"interleaved\" or \"gpipe\" (got \"" + excerpt(s) + "\")");
  });
  field(f, "virtualStages", false, l.virtualStages, c32);
  field(f, "zero", false, l.zero, c32);
  if (f.has("bucketMiB")) {
    // The bound is checked on the MiB as given: 1e-9 MiB rounds to 0 bytes, which once meant "the default".
    const double mib = f.number("bucketMiB");
    if (!(mib * 1048576.0 >= static_cast<double>(kMinBucketBytes)) || mib > 1e6)
      f.fail(f.name("bucketMiB") + " must be in [" + formatNumber(kMinBucketBytes / 1048576.0) +
             ", 1e6] MiB, i.e. at least 4 KiB (got " + describeJson(f.value("bucketMiB")) + ")");
    l.bucketBytes = static_cast<uint64_t>(std::llround(mib * 1048576.0));
  }
  field(f, "gradDtype", false, l.gradDtype, [&](const char* k) { return dtypeField(f, k); });
  field(f, "overlapGradReduce", false, l.overlapGradReduce, flag);
  field(f, "overlapParamGather", false, l.overlapParamGather, flag);
  field(f, "tpCommOverlap", false, l.tpCommOverlap, flag);
  field(f, "overlapPpComm", false, l.overlapPpComm, flag);
  field(f, "overlapMoeA2a", false, l.overlapMoeA2a, flag);
  field(f, "overlapSms", false, l.overlapSms, c32);
}

Json parseText(const std::string& text, const std::string& where) {
  return parseJson(text, where, kMaxConfigJsonBytes);
}

}  // namespace

std::string workloadToJson(const Workload& w, int indent) {
  const ModelShape& m = w.model;
  Json model = {{"layers", m.layers},
                {"hidden", m.hidden},
                {"ffn", m.ffn},
                {"heads", m.heads},
                {"kvHeads", m.kvHeads},
                {"vocab", m.vocab},
                {"vocabPadMultiple", m.vocabPadMultiple},
                {"tiedEmbeddings", m.tiedEmbeddings},
                {"activation", toString(m.activation)},
                {"slidingWindow", m.slidingWindow}};
  if (m.mla) {
    model["mla"] = {{"qLoraRank", m.mla->qLoraRank},
                    {"kvLoraRank", m.mla->kvLoraRank},
                    {"qkNopeHeadDim", m.mla->qkNopeHeadDim},
                    {"qkRopeHeadDim", m.mla->qkRopeHeadDim},
                    {"vHeadDim", m.mla->vHeadDim}};
  }
  if (m.explicitHeadDim) model["headDim"] = m.explicitHeadDim;  // absent: hidden / heads, as the model's edits say
  if (!m.slidingPattern.empty()) {
    Json pattern = Json::array();
    for (uint8_t windowed : m.slidingPattern) pattern.push_back(windowed ? "sliding" : "full");
    model["slidingWindowPattern"] = pattern;
  }
  if (m.moe)
    model["moe"] = {{"experts", m.moe->experts},
                    {"topK", m.moe->topK},
                    {"ffn", m.moe->ffn},
                    {"sharedExperts", m.moe->sharedExperts},
                    {"sharedFfn", m.moe->sharedFfn},
                    {"firstDenseLayers", m.moe->firstDenseLayers},
                    {"layerFreq", m.moe->layerFreq}};
  if (m.moe && (m.moe->imbalance != 1 || m.moe->capacityFactor != 0)) {  // written when set, as the layout's cp
    model["moe"]["imbalance"] = m.moe->imbalance;
    model["moe"]["capacityFactor"] = m.moe->capacityFactor;
  }
  const TrainingSpec& t = w.training;
  const ParallelLayout& l = w.layout;
  Json layout = {{"tp", l.tp},
                 {"pp", l.pp},
                 {"ep", l.ep},
                 {"sp", l.sp},
                 {"ppSchedule", toString(l.schedule)},
                 {"virtualStages", l.virtualStages},
                 {"zero", l.zero},
                 {"bucketMiB", static_cast<double>(l.bucketBytes) / 1048576.0},
                 {"gradDtype", toString(l.gradDtype)},
                 {"overlapGradReduce", l.overlapGradReduce},
                 {"overlapParamGather", l.overlapParamGather}};
  layout["dp"] = l.dp ? Json(*l.dp) : Json("auto");
  // Written only when set, so that the files of layouts without them read as before.
  if (l.cp != 1 || l.cpCommType != CpCommType::P2p) {
    layout["cp"] = l.cp;
    layout["cpCommType"] = toString(l.cpCommType);
  }
  if (l.cpA2aSize != 0) layout["cpA2aSize"] = l.cpA2aSize;
  if (l.etp != 1) layout["etp"] = l.etp;
  const ParallelLayout defaults;
  if (l.tpCommOverlap != defaults.tpCommOverlap) layout["tpCommOverlap"] = l.tpCommOverlap;
  if (l.overlapPpComm != defaults.overlapPpComm) layout["overlapPpComm"] = l.overlapPpComm;
  if (l.overlapMoeA2a != defaults.overlapMoeA2a) layout["overlapMoeA2a"] = l.overlapMoeA2a;
  if (l.overlapSms != defaults.overlapSms) layout["overlapSms"] = l.overlapSms;
  Json j = {{"schema", kWorkloadSchema},
            {"name", w.name},
            {"model", model},
            {"training",
             {{"seq", t.seq},
              {"microBatch", t.microBatch},
              {"globalBatch", t.globalBatch},
              {"dtype", t.fp8 ? "fp8" : toString(t.dtype)},
              {"recompute", toString(t.recompute)},
              {"gradAccumFusion", t.gradAccumFusion}}},
            {"layout", layout}};
  if (t.recompute == Recompute::Selective) j["training"]["recomputeModules"] = recomputeModuleNames(t.recomputeModules);
  return j.dump(indent);
}

Workload workloadFromJson(const std::string& text) {
  const Json j = parseText(text, kDoc);
  const JsonFields root(j, kDoc);
  root.onlyKeys({"schema", "name", "preset", "model", "training", "layout"});
  if (root.has("schema") && !schemaMatches(root.text("schema"), kWorkloadSchema))
    root.fail(std::string("schema must be \"") + kWorkloadSchema + "\" (got \"" + root.text("schema") + "\")");
  Workload w;
  const bool fromPreset = root.has("preset");
  if (fromPreset) {
    w = workloadPreset(root.text("preset"));
  } else if (!root.has("schema")) {
    root.fail(std::string("missing field schema (\"") + kWorkloadSchema + "\"), or use {\"preset\": ...}");
  }
  if (root.has("name")) w.name = root.text("name");
  if (fromPreset || root.has("model")) {
    if (root.has("model")) readModel(root.object("model"), !fromPreset, w.model);
  } else {
    root.fail("missing field model");
  }
  if (root.has("training")) {
    readTraining(root.object("training"), !fromPreset, w.training);
  } else if (!fromPreset) {
    root.fail("missing field training");
  }
  if (root.has("layout")) readLayout(root.object("layout"), w.layout);
  validateWorkload(w);
  return w;
}

void applyLayoutJson(Workload& w, const std::string& text, const std::string& where) {
  const Json j = parseText(text, where);
  try {
    readLayout(JsonFields(j, where, "layout"), w.layout);
    validateWorkload(w);
  } catch (const Error& e) {
    throw Error(e.code(), e.code() == ErrorCode::ParseError ? e.message() : where + ": " + e.message());
  }
}

Workload loadWorkload(const std::string& presetOrPath) {
  for (const auto& p : workloadPresets())
    if (p == presetOrPath) return workloadPreset(p);
  std::error_code ec;
  if (presetOrPath.empty() || !std::filesystem::is_regular_file(presetOrPath, ec)) {
    std::string list;
    for (const auto& p : workloadPresets()) list += (list.empty() ? "" : ", ") + p;
    throw Error(ErrorCode::NotFound,
                "unknown workload '" + presetOrPath + "': not a preset (" + list + ") and no such file");
  }
  Workload w;
  try {
    w = workloadFromJson(readFile(presetOrPath));
  } catch (const Error& e) {
    throw Error(e.code(), presetOrPath + ": " + e.message());
  }
  if (w.name.empty()) w.name = std::filesystem::path(presetOrPath).stem().string();
  return w;
}

}  // namespace mk
