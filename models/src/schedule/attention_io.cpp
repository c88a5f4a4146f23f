// mkernel — the JSON form of attention shapes (attention_io.hpp; the shape itself is attention.hpp).
#include "attention_io.hpp"

#include <limits>
#include <string>
#include <utility>

namespace mk {

void readAttentionShapes(const io_read::json& v, const io_read::Path& p, std::vector<AttentionShape>& out) {
  using namespace io_read;
  expectArray(v, p);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const Path pi = p[i];
    const json& o = v[i];
    expectObject(o, pi);
    checkKeys(o, pi,
              {"batch", "qHeads", "kvHeads", "headDim", "sq", "skv", "ldq", "ldkv", "ldo", "causal", "scale", "vOffset",
               "qPos", "kvPos", "doOffset", "rowsAt", "dqAt"});
    AttentionShape sh;
    for (const auto& [key, field] : {std::pair<const char*, uint32_t*>{"batch", &sh.batch},
                                     {"qHeads", &sh.qHeads},
                                     {"kvHeads", &sh.kvHeads},
                                     {"headDim", &sh.headDim},
                                     {"sq", &sh.sq},
                                     {"skv", &sh.skv}})
      *field = asU32(member(o, key, pi), pi[key]);
    // Leading dimensions default to the block (a whole sequence), positions to 0, the scale to 1 / sqrt(D).
    sh.ldq = sh.ldo = sh.sq;
    sh.ldkv = sh.skv;
    for (const auto& [key, field] :
         {std::pair<const char*, uint32_t*>{"ldq", &sh.ldq}, {"ldkv", &sh.ldkv}, {"ldo", &sh.ldo}})
      if (const json* x = optionalMember(o, key)) *field = asU32(*x, pi[key]);
    if (const json* x = optionalMember(o, "causal")) sh.causal = asBool(*x, pi["causal"]);
    sh.scale = defaultAttentionScale(sh.headDim);
    if (const json* x = optionalMember(o, "scale"))
      sh.scale = static_cast<float>(
          json_get::number(*x, pi["scale"], 0.0, static_cast<double>(std::numeric_limits<float>::max()), true));
    sh.vOffset = asU64(member(o, "vOffset", pi), pi["vOffset"]);
    if (const json* x = optionalMember(o, "qPos")) sh.qPos = asU64(*x, pi["qPos"]);
    if (const json* x = optionalMember(o, "kvPos")) sh.kvPos = asU64(*x, pi["kvPos"]);
    for (const auto& [key, field] :
         {std::pair<const char*, uint64_t*>{"doOffset", &sh.doOffset}, {"rowsAt", &sh.rowsAt}, {"dqAt", &sh.dqAt}})
      if (const json* x = optionalMember(o, key)) *field = asU64(*x, pi[key]);
    out.push_back(sh);
  }
}

void writeAttentionShapes(io_write::Writer& w, const std::vector<AttentionShape>& shapes) {
  if (shapes.empty()) return;
  std::string& o = w.out();
  w.key("attentions");
  o += '[';
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const AttentionShape& sh = shapes[i];
    if (i) o += ',';
    w.newline(2);
    o += '{';
    const std::pair<const char*, uint64_t> sizes[] = {
        {"batch", sh.batch}, {"qHeads", sh.qHeads},   {"kvHeads", sh.kvHeads}, {"headDim", sh.headDim},
        {"sq", sh.sq},       {"skv", sh.skv},         {"ldq", sh.ldq},         {"ldkv", sh.ldkv},
        {"ldo", sh.ldo},     {"vOffset", sh.vOffset}, {"qPos", sh.qPos},       {"kvPos", sh.kvPos}};
    for (std::size_t k = 0; k < std::size(sizes); ++k) {
      if (k) w.comma();
      w.key(sizes[k].first);
      w.u64(sizes[k].second);
    }
    // attention-grad's offsets, written only when set so that forward shapes read as before
    for (const auto& [key, v] :
         {std::pair<const char*, uint64_t>{"doOffset", sh.doOffset}, {"rowsAt", sh.rowsAt}, {"dqAt", sh.dqAt}})
      if (v != 0) {
        w.comma();
        w.key(key);
        w.u64(v);
      }
    w.comma();
    w.key("causal");
    o += sh.causal ? "true" : "false";
    w.comma();
    w.key("scale");
    w.num(static_cast<double>(sh.scale));
    o += '}';
  }
  w.newline(1);
  o += "],";
  w.newline(1);
}

}  // namespace mk
