// mkernel — kernel records read against the census's contract (kernel_records.hpp).
#include "mk/validation/kernel_records.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "mk/error.hpp"

namespace mk {

namespace {

using Json = nlohmann::json;

const char* const kDtypes[] = {"bfloat16", "float16", "float32", "float8_e4m3"};

std::string joined(const std::vector<const char*>& v) {
  std::string s;
  for (const char* x : v) s += (s.empty() ? "" : ", ") + std::string(x);
  return s;
}

}  // namespace

const std::vector<const char*>& kernelShapeFields(KernelClass cls) {
  static const std::vector<const char*> gemm{"m", "n", "k", "batch"},
      attention{"batch", "seq", "heads", "kv_heads", "head_dim", "causal"}, tokensHidden{"tokens", "hidden"},
      rotary{"tokens", "heads", "head_dim"}, loss{"tokens", "vocab"}, embedding{"tokens", "hidden", "vocab"},
      params{"params"}, elements{"elements"}, router{"tokens", "experts", "topk"}, permute{"tokens", "hidden", "topk"};
  switch (cls) {
    case KernelClass::Gemm: return gemm;
    case KernelClass::Attention: return attention;
    case KernelClass::Norm:
    case KernelClass::Activation:
    case KernelClass::Residual: return tokensHidden;
    case KernelClass::Rotary: return rotary;
    case KernelClass::Loss: return loss;
    case KernelClass::Embedding: return embedding;
    case KernelClass::Optimizer:
    case KernelClass::GradNorm: return params;
    case KernelClass::Cast: return elements;
    case KernelClass::Router: return router;
    case KernelClass::Permute: return permute;
  }
  return gemm;
}

std::vector<KernelRecord> kernelRecords(const MeasurementFile& file, const std::string& name) {
  std::vector<KernelRecord> out;
  std::string gpu;
  if (auto it = file.system.find("gpu"); it != file.system.end()) {
    try {
      const Json g = Json::parse(it->second);
      if (g.is_string()) gpu = g.get<std::string>();
    } catch (const Json::exception&) {
    }
  }
  for (std::size_t i = 0; i < file.records.size(); ++i) {
    const MeasurementRecord& r = file.records[i];
    if (r.op != "kernel") continue;
    const std::string at = name + ": records[" + std::to_string(i) + "].";
    auto fail = [&](const std::string& field, const std::string& why) {
      throw Error(ErrorCode::InvalidArgument, at + field + ": " + why);
    };
    auto json = [&](const char* field) -> Json {
      auto e = r.extra.find(field);
      if (e == r.extra.end()) return Json();
      try {
        return Json::parse(e->second);
      } catch (const Json::exception&) {
        return Json();
      }
    };
    auto text = [&](const char* field) -> std::string {
      const Json v = json(field);
      if (!v.is_string() || v.get<std::string>().empty()) fail(field, "missing (a kernel record needs a string)");
      return v.get<std::string>();
    };
    KernelRecord k;
    const std::string cls = text("class");
    bool known = false;
    std::string classes;
    for (int c = 0; c < kKernelClasses; ++c) {
      const auto kc = static_cast<KernelClass>(c);
      classes += (classes.empty() ? "" : ", ") + std::string(toString(kc));
      if (cls == toString(kc)) {
        k.cls = kc;
        known = true;
      }
    }
    if (!known) fail("class", "'" + cls + "' is not a class of the kernel census (" + classes + ")");
    k.kernel = text("kernel");
    const std::string pass = text("pass");
    if (pass == "forward")
      k.pass = Pass::Forward;
    else if (pass == "backward")
      k.pass = Pass::Backward;
    else if (pass == "step")
      k.pass = Pass::Step;
    else
      fail("pass", "'" + pass + "' is not forward, backward or step");
    bool dtypeKnown = false;
    for (const char* d : kDtypes) dtypeKnown = dtypeKnown || r.dtype == d;
    if (!dtypeKnown)
      fail("dtype", "'" + r.dtype + "' is not a dtype of the kernel census (bfloat16, float16, float32, float8_e4m3)");
    k.dtype = r.dtype;
    const auto& fields = kernelShapeFields(k.cls);
    for (const char* f : fields) {
      const Json v = json(f);
      const std::string need = " (a " + cls + " record needs " + joined(fields) + ")";
      if (v.is_null()) fail(f, "missing" + need);
      if (std::string(f) == "causal") {
        if (!v.is_boolean()) fail(f, "must be true or false" + need);
        k.shape += std::string(k.shape.empty() ? "" : " ") + f + "=" + (v.get<bool>() ? "1" : "0");
        continue;
      }
      if (!v.is_number_unsigned() || v.get<uint64_t>() == 0) fail(f, "must be an integer > 0 (got " + v.dump() + ")");
      const uint64_t x = v.get<uint64_t>();
      k.shape += std::string(k.shape.empty() ? "" : " ") + f + "=" + std::to_string(x);
      if (k.cls == KernelClass::Gemm) {
        const std::string s = f;
        (s == "m" ? k.m : s == "n" ? k.n : s == "k" ? k.k : k.batch) = x;
      }
      if (std::string(f) == "vocab") k.vocab = x;
      if (std::string(f) == "tokens") k.tokens = x;
    }
    const Json flops = json("flops");
    if (!flops.is_number() || !std::isfinite(flops.get<double>()) || flops.get<double>() < 0)
      fail("flops",
           "must be a finite number >= 0 (got " + (flops.is_null() ? std::string("nothing") : flops.dump()) + ")");
    k.flops = flops.get<double>();
    if (k.cls == KernelClass::Gemm) {
      const Json acc = json("accumulate");
      if (!acc.is_null() && !(acc.is_string() && acc.get<std::string>() == "float32"))
        fail("accumulate",
             "must be \"float32\" (a GEMM adding into an fp32 output) when present (got " + acc.dump() + ")");
      k.accumulateFp32 = !acc.is_null();
    }
    if (r.bytes == 0) fail("bytes", "must be > 0: a kernel moves its operands");
    k.bytes = static_cast<double>(r.bytes);
    k.timeUs = r.timeUs;
    k.gpu = gpu;
    k.file = name;
    k.index = i;
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace mk
