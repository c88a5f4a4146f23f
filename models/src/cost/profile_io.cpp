// mkernel — hardware profile <-> JSON (profile_io.hpp has the format).
#include "mk/cost/profile_io.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/util/size.hpp"

namespace mk {

namespace {

using Json = nlohmann::json;

constexpr const char* kProfileSchema = "mkernel.profile.v1";

std::string join(const std::string& path, const char* key) {
  return path.empty() ? std::string(key) : path + "." + key;
}

[[noreturn]] void parseFail(const std::string& what) { throw Error(ErrorCode::ParseError, "profile: " + what); }

const Json& member(const Json& obj, const std::string& path, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) parseFail("missing field " + join(path, key));
  return *it;
}

/// A misspelt key ("bwGbs") must not silently leave a field at a default: reject unknown keys.
void onlyKeys(const Json& obj, const std::string& path, std::initializer_list<const char*> keys) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known = known || it.key() == k;
    if (known) continue;
    std::string list;
    for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
    parseFail("unknown field " + join(path, it.key().c_str()) + " (expected one of: " + list + ")");
  }
}

const Json& object(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  if (!j.is_object()) parseFail(join(path, key) + " must be an object (got " + j.type_name() + ")");
  return j;
}

/// What a parameter measures, and so its range (checked at the field by the json_get getters).
enum class Unit {
  Time,      ///< microseconds: [0, kMaxLatencyUs]
  Rate,      ///< GB/s or TFLOP/s: 0 (an engine that needs the rate rejects it with its own reason), or in
             ///< [kMinRate, kMaxRate]
  Bytes,     ///< a message size: [0, kMaxElements]
  Fraction,  ///< a ramp's or curve's share of the peak rate: [0, 1e3] (validateRamp judges the curve)
};

double checked(const Json& j, const std::string& name, Unit unit) {
  const std::string field = "profile: " + name;
  switch (unit) {
    case Unit::Time: return json_get::number(j, field, 0, kMaxLatencyUs);
    case Unit::Bytes: return json_get::number(j, field, 0, static_cast<double>(kMaxElements));
    case Unit::Fraction: return json_get::number(j, field, 0, 1e3);
    case Unit::Rate: break;
  }
  const double v = json_get::number(j, field, 0, kMaxRate);
  if (v > 0 && v < kMinRate)
    failField(field, "must be 0 or a rate in [" + formatNumber(kMinRate) + ", " + formatNumber(kMaxRate) + "]", j);
  return v;
}

/// A parameter: present and in its unit's range.
double parameter(const Json& obj, const std::string& path, const char* key, Unit unit) {
  return checked(member(obj, path, key), join(path, key), unit);
}

std::string text(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  return json_get::text(j, "profile: " + join(path, key));
}

/// An optional ramp `key` of `obj`: [{"bytes": B, "fraction": f}, ...], checked by validateRamp.
std::vector<RampPoint> ramp(const Json& obj, const std::string& path, const char* key, bool capped) {
  auto it = obj.find(key);
  if (it == obj.end()) return {};
  const std::string at = join(path, key);
  if (!it->is_array()) parseFail(at + " must be an array of {\"bytes\", \"fraction\"} (got " + it->type_name() + ")");
  std::vector<RampPoint> out;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const Json& p = (*it)[i];
    const std::string pi = at + "[" + std::to_string(i) + "]";
    if (!p.is_object()) parseFail(pi + " must be an object {\"bytes\", \"fraction\"} (got " + p.type_name() + ")");
    onlyKeys(p, pi, {"bytes", "fraction"});
    out.push_back(RampPoint{parameter(p, pi, "bytes", Unit::Bytes), parameter(p, pi, "fraction", Unit::Fraction)});
  }
  validateRamp(out, "profile: " + at, capped);
  return out;
}

Json rampJson(const std::vector<RampPoint>& r) {
  Json j = Json::array();
  for (const RampPoint& p : r) j.push_back(Json{{"bytes", p.bytes}, {"fraction", p.fraction}});
  return j;
}

/// A link: its ramp is capped (nvlink, network) or not (local: L2).
LinkCost linkCost(const Json& obj, const char* key, bool capped) {
  const Json& j = object(obj, "", key);
  onlyKeys(j, key, {"alphaUs", "bwGBs", "ramp"});
  return LinkCost{parameter(j, key, "alphaUs", Unit::Time), parameter(j, key, "bwGBs", Unit::Rate),
                  ramp(j, key, "ramp", capped)};
}

Json linkCostJson(const LinkCost& c) {
  Json j{{"alphaUs", c.alphaUs}, {"bwGBs", c.bwGBs}};
  // Written only when set, so that a profile without one reads back the same.
  if (!c.ramp.empty()) j["ramp"] = rampJson(c.ramp);
  return j;
}

ProtocolCost protocolCost(const Json& obj, const std::string& path, const char* key) {
  const std::string at = join(path, key);
  const Json& j = object(obj, path, key);
  onlyKeys(j, at, {"latencyUs", "bwFraction"});
  ProtocolCost c{parameter(j, at, "latencyUs", Unit::Time), parameter(j, at, "bwFraction", Unit::Fraction)};
  if (!(c.bwFraction > 0) || c.bwFraction > 1) {
    std::ostringstream os;
    os << "profile: " << at << ".bwFraction must be in (0, 1] (got " << c.bwFraction << ")";
    throw Error(ErrorCode::InvalidArgument, os.str());
  }
  return c;
}

Json protocolJson(const ProtocolCost& c) { return Json{{"latencyUs", c.latencyUs}, {"bwFraction", c.bwFraction}}; }

/// "protocols" and "nccl": optional (profiles written before the layered baseline keep the documented defaults).
void readLayered(const Json& j, Profile& p) {
  if (j.contains("protocols")) {
    const Json& pj = object(j, "", "protocols");
    onlyKeys(pj, "protocols", {"simple", "ll", "ll128"});
    if (pj.contains("simple")) p.simple = protocolCost(pj, "protocols", "simple");
    if (pj.contains("ll")) p.ll = protocolCost(pj, "protocols", "ll");
    if (pj.contains("ll128")) p.ll128 = protocolCost(pj, "protocols", "ll128");
  }
  if (j.contains("nccl")) {
    const Json& nj = object(j, "", "nccl");
    onlyKeys(nj, "nccl", {"hostOpUs", "groupGpuUs", "launchUs", "baseUs"});
    // "launchUs": the name of hostOpUs in profiles written before NCCL's host path was split into its two terms.
    if (nj.contains("launchUs") && nj.contains("hostOpUs"))
      throw Error(ErrorCode::InvalidArgument,
                  "profile: nccl.launchUs and nccl.hostOpUs are the same parameter (launchUs is its old name): "
                  "keep nccl.hostOpUs only");
    for (const char* key : {"hostOpUs", "launchUs"})
      if (nj.contains(key)) p.nccl.hostOpUs = parameter(nj, "nccl", key, Unit::Time);
    if (nj.contains("groupGpuUs")) p.nccl.groupGpuUs = parameter(nj, "nccl", "groupGpuUs", Unit::Time);
    if (nj.contains("baseUs")) {
      const Json& bj = object(nj, "nccl", "baseUs");
      onlyKeys(bj, "nccl.baseUs", {"ll", "ll128", "simple"});
      if (bj.contains("ll")) p.nccl.baseLlUs = parameter(bj, "nccl.baseUs", "ll", Unit::Time);
      if (bj.contains("ll128")) p.nccl.baseLl128Us = parameter(bj, "nccl.baseUs", "ll128", Unit::Time);
      if (bj.contains("simple")) p.nccl.baseSimpleUs = parameter(bj, "nccl.baseUs", "simple", Unit::Time);
    }
  }
}

Json transportJson(const TransportModel& t) {
  Json curve = Json::array();
  for (const EfficiencyPoint& e : t.efficiency) curve.push_back({{"bytes", e.bytes}, {"fraction", e.fraction}});
  return Json{{"kind", t.kind},
              {"overheadUs", t.overheadUs},
              {"latencyUs", t.latencyUs},
              {"efficiency", curve},
              {"inFlight", t.inFlight}};
}

/// "transport": {kind, overheadUs, latencyUs, efficiency: [{bytes, fraction}], inFlight}; the range rules are
/// validateTransport's (exit 2 naming the field).
TransportModel transport(const Json& obj) {
  const Json& j = object(obj, "", "transport");
  onlyKeys(j, "transport", {"kind", "overheadUs", "latencyUs", "efficiency", "inFlight"});
  TransportModel t;
  t.kind = text(j, "transport", "kind");
  t.overheadUs = parameter(j, "transport", "overheadUs", Unit::Time);
  t.latencyUs = parameter(j, "transport", "latencyUs", Unit::Time);
  // A whole number of messages; validateTransport says why 0 is refused.
  t.inFlight = json_get::u32(member(j, "transport", "inFlight"), std::string("profile: transport.inFlight"));
  const Json& curve = member(j, "transport", "efficiency");
  if (!curve.is_array())
    parseFail(std::string("transport.efficiency must be an array (got ") + curve.type_name() + ")");
  for (std::size_t i = 0; i < curve.size(); ++i) {
    const std::string path = "transport.efficiency[" + std::to_string(i) + "]";
    if (!curve[i].is_object())
      parseFail(path + " must be an object {bytes, fraction} (got " + curve[i].type_name() + ")");
    onlyKeys(curve[i], path, {"bytes", "fraction"});
    t.efficiency.push_back(
        {parameter(curve[i], path, "bytes", Unit::Bytes), parameter(curve[i], path, "fraction", Unit::Fraction)});
  }
  try {
    validateTransport(t, "transport");
  } catch (const Error& e) {
    throw Error(e.code(), "profile: " + e.message());
  }
  return t;
}

/// The rates of the efficiency form and the datasheet rate each is a fraction of (defaultProfile).
struct RateField {
  const char* link;        ///< the link object holding it ("nvlink"), or nullptr for a top-level field
  const char* absolute;    ///< "bwGBs" (in the link) or the top-level name ("reduceGBs")
  const char* efficiency;  ///< "efficiency" (in the link) or the top-level name ("reduceEfficiency")
  double Profile::*top;    ///< the top-level member, or nullptr
  LinkCost Profile::*linkMember;
  bool optional = false;  ///< added after the first profiles: a profile may leave it out (the reader's default)
};

const RateField kRateFields[] = {
    {"nvlink", "bwGBs", "efficiency", nullptr, &Profile::nvlink},
    {"network", "bwGBs", "efficiency", nullptr, &Profile::network},
    {"local", "bwGBs", "efficiency", nullptr, &Profile::local},
    {nullptr, "reduceGBs", "reduceEfficiency", &Profile::reduceGBs, nullptr},
    {nullptr, "gemmTflops", "gemmEfficiency", &Profile::gemmTflops, nullptr},
    {nullptr, "attentionTflops", "attentionEfficiency", &Profile::attentionTflops, nullptr, true},
};

double datasheetRate(const Profile& d, const RateField& f) { return f.top ? d.*(f.top) : (d.*(f.linkMember)).bwGBs; }

/// The machine named by the efficiency form's "machine": a preset (its datasheet is what the fractions are of).
Topology machineOf(const Json& j) {
  const std::string name = text(j, "", "machine");
  const auto presets = topologyPresets();
  if (std::find(presets.begin(), presets.end(), name) == presets.end()) {
    std::string list;
    for (const auto& n : presets) list += (list.empty() ? "" : ", ") + n;
    parseFail("machine must name the preset the profile was measured on (" + list + "; got \"" + excerpt(name) +
              "\"): its datasheet rates are what the efficiencies are fractions of");
  }
  return topologyPreset(name, 1);
}

/// The efficiency form ("machine" + fractions of its datasheet rates) turned into the absolute form, which the
/// reader then checks field by field.
Json absoluteForm(const Json& j) {
  const Profile d = defaultProfile(machineOf(j));
  Json a = j;
  a.erase("machine");
  for (const RateField& f : kRateFields) {
    Json& holder = f.link ? a[f.link] : a;
    const std::string path = f.link ? std::string(f.link) + "." + f.efficiency : std::string(f.efficiency);
    if (f.link && !holder.is_object()) continue;  // the reader names the missing or mistyped object
    if (f.optional && !holder.contains(f.efficiency) && !holder.contains(f.absolute)) continue;
    if (holder.contains(f.absolute))
      parseFail(std::string(f.link ? std::string(f.link) + "." : "") + f.absolute +
                ": a profile with \"machine\" gives " + path + " (a fraction of the datasheet rate) instead");
    const double e = checked(member(holder, f.link ? f.link : "", f.efficiency), path, Unit::Fraction);
    holder.erase(f.efficiency);
    holder[f.absolute] = e * datasheetRate(d, f);
  }
  return a;
}

}  // namespace

std::string profileToEfficiencyJson(const Profile& p, const ProfileProvenance& provenance, const Topology& machine,
                                    int indent) {
  const Profile d = defaultProfile(machine);
  Json j = Json::parse(profileToJson(p, provenance, -1));
  j["machine"] = machine.name;
  for (const RateField& f : kRateFields) {
    Json& holder = f.link ? j[f.link] : j;
    const double rate = holder[f.absolute].get<double>();
    const double base = datasheetRate(d, f);
    holder.erase(f.absolute);
    holder[f.efficiency] = base > 0 ? rate / base : 0.0;
  }
  return j.dump(indent);
}

std::string profileToJson(const Profile& p, const ProfileProvenance& prov, int indent) {
  Json j;
  j["schema"] = kProfileSchema;
  j["source"] = p.source;
  if (!prov.system.empty() || !prov.date.empty() || !prov.commit.empty() || !prov.tool.empty() ||
      !prov.measurements.empty()) {
    j["provenance"] = {{"system", prov.system},
                       {"date", prov.date},
                       {"commit", prov.commit},
                       {"tool", prov.tool},
                       {"measurements", prov.measurements}};
  }
  j["nvlink"] = linkCostJson(p.nvlink);
  j["network"] = linkCostJson(p.network);
  j["local"] = linkCostJson(p.local);
  j["reduceGBs"] = p.reduceGBs;
  if (!p.reduceRamp.empty()) j["reduceRamp"] = rampJson(p.reduceRamp);
  j["flagUs"] = p.flagUs;
  j["localFlagUs"] = p.localFlagUs;
  j["dispatchUs"] = p.dispatchUs;
  j["peerUserUs"] = p.peerUserUs;
  j["putIssueUs"] = p.putIssueUs;
  j["userPutUs"] = p.userPutUs;
  j["waitUs"] = p.waitUs;
  j["proxyUs"] = p.proxyUs;
  j["proxyPostUs"] = p.proxyPostUs;
  j["transport"] = transportJson(p.transport);
  j["gemmTflops"] = p.gemmTflops;
  j["attentionTflops"] = p.attentionTflops;
  // Written only when set, so that a profile that does not distinguish them reads back the same.
  if (p.sms > 0) j["sms"] = p.sms;
  if (p.ctaGBs > 0) j["ctaGBs"] = p.ctaGBs;
  j["protocols"] = {{"simple", protocolJson(p.simple)}, {"ll", protocolJson(p.ll)}, {"ll128", protocolJson(p.ll128)}};
  j["nccl"] = {{"hostOpUs", p.nccl.hostOpUs},
               {"groupGpuUs", p.nccl.groupGpuUs},
               {"baseUs", {{"ll", p.nccl.baseLlUs}, {"ll128", p.nccl.baseLl128Us}, {"simple", p.nccl.baseSimpleUs}}}};
  return j.dump(indent);
}

Profile profileFromJson(const std::string& input, ProfileProvenance* provenance) {
  const Json doc = parseJson(input, "profile", kMaxConfigJsonBytes);
  if (!doc.is_object()) parseFail(std::string("the document must be a JSON object (got ") + doc.type_name() + ")");
  const Json j = doc.contains("machine") ? absoluteForm(doc) : doc;
  const std::string schema = text(j, "", "schema");
  if (!schemaMatches(schema, kProfileSchema))
    parseFail("schema must be \"" + std::string(kProfileSchema) + "\" (got \"" + excerpt(schema) + "\")");
  onlyKeys(j, "", {"schema",     "source",          "provenance", "nvlink",      "network",     "local",
                   "reduceGBs",  "reduceRamp",      "flagUs",     "localFlagUs", "dispatchUs",  "peerUserUs",
                   "putIssueUs", "userPutUs",       "waitUs",     "proxyUs",     "proxyPostUs", "transport",
                   "gemmTflops", "attentionTflops", "sms",        "ctaGBs",      "protocols",   "nccl"});
  Profile p;
  p.source = text(j, "", "source");
  p.nvlink = linkCost(j, "nvlink", true);
  p.network = linkCost(j, "network", true);
  p.local = linkCost(j, "local", false);
  p.reduceGBs = parameter(j, "", "reduceGBs", Unit::Rate);
  p.reduceRamp = ramp(j, "", "reduceRamp", false);
  p.flagUs = parameter(j, "", "flagUs", Unit::Time);
  // Added after the first profiles were written: a profile without it prices a lane-to-lane signal like a
  // cross-GPU one (what every engine did before the field existed).
  p.localFlagUs = j.contains("localFlagUs") ? parameter(j, "", "localFlagUs", Unit::Time) : p.flagUs;
  p.dispatchUs = parameter(j, "", "dispatchUs", Unit::Time);
  // Added later too: a profile without it charges no op the peer-user-buffer term (as before it existed).
  p.peerUserUs = j.contains("peerUserUs") ? parameter(j, "", "peerUserUs", Unit::Time) : 0.0;
  p.putIssueUs = j.contains("putIssueUs") ? parameter(j, "", "putIssueUs", Unit::Time) : 0.0;
  p.userPutUs = j.contains("userPutUs") ? parameter(j, "", "userPutUs", Unit::Time) : 0.0;
  // Added with the Wait's lane time: a profile without it lets a met Wait cost nothing (as before it existed).
  p.waitUs = j.contains("waitUs") ? parameter(j, "", "waitUs", Unit::Time) : 0.0;
  p.proxyUs = parameter(j, "", "proxyUs", Unit::Time);
  // Added with the overlapped ProxyPut latency: a profile without it keeps the whole proxyUs serial.
  p.proxyPostUs = j.contains("proxyPostUs") ? parameter(j, "", "proxyPostUs", Unit::Time) : 0.0;
  if (j.contains("transport")) {
    p.transport = transport(j);
  } else {
    // Added with the transport model: a profile without it moves every message at the full network rate
    // with any number in flight (what every engine did before the field existed).
    p.transport.efficiency.clear();
    p.transport.inFlight = std::numeric_limits<uint32_t>::max();
  }
  p.gemmTflops = parameter(j, "", "gemmTflops", Unit::Rate);
  // Added with the calibrated attention rate: a profile without it prices attention at the GEMM rate (what every
  // engine did before the field existed), so the committed profiles keep their predictions.
  p.attentionTflops = j.contains("attentionTflops") ? parameter(j, "", "attentionTflops", Unit::Rate) : p.gemmTflops;
  // Added with the fused operators: a profile without them does not model a rank's CTA split (rule 2b).
  p.ctaGBs = j.contains("ctaGBs") ? parameter(j, "", "ctaGBs", Unit::Rate) : 0.0;
  if (j.contains("sms")) p.sms = json_get::u32(j["sms"], std::string("profile: sms"), 1u << 20);
  readLayered(j, p);

  ProfileProvenance prov;
  if (j.contains("provenance")) {
    const Json& pj = object(j, "", "provenance");
    onlyKeys(pj, "provenance", {"system", "date", "commit", "tool", "measurements"});
    // Provenance fields are individually optional: a hand-written profile may only know its system.
    if (pj.contains("system")) prov.system = text(pj, "provenance", "system");
    if (pj.contains("date")) prov.date = text(pj, "provenance", "date");
    if (pj.contains("commit")) prov.commit = text(pj, "provenance", "commit");
    if (pj.contains("tool")) prov.tool = text(pj, "provenance", "tool");
    if (pj.contains("measurements")) {
      const Json& m = pj["measurements"];
      if (!m.is_array()) parseFail(std::string("provenance.measurements must be an array (got ") + m.type_name() + ")");
      for (std::size_t i = 0; i < m.size(); ++i) {
        prov.measurements.push_back(
            json_get::text(m[i], "profile: provenance.measurements[" + std::to_string(i) + "]"));
      }
    }
  }
  if (doc.contains("machine")) {
    const std::string machine = doc["machine"].get<std::string>();
    if (!prov.system.empty() && prov.system != machine)
      parseFail("provenance.system (\"" + excerpt(prov.system) + "\") must be the machine (\"" + machine + "\")");
    prov.system = machine;
  }
  if (provenance != nullptr) *provenance = std::move(prov);
  return p;
}

Profile loadProfile(const std::string& path, ProfileProvenance* provenance) {
  const std::string content = readFile(path);
  try {
    return profileFromJson(content, provenance);
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.message());
  }
}

void saveProfile(const Profile& p, const std::string& path, const ProfileProvenance& provenance) {
  writeFileAtomic(path, profileToJson(p, provenance) + "\n");
}

}  // namespace mk
