// mkernel — what a shard hands the merge, and the merge's checks (shard.hpp).
#include <nlohmann/json.hpp>

#include "mk/error.hpp"
#include "mk/plan/plan_output.hpp"
#include "mk/plan/shard.hpp"
#include "mk/schedule/io.hpp"

namespace mk::plan {

namespace {

using Json = nlohmann::json;

[[noreturn]] void bad(const std::string& msg) { throw Error(ErrorCode::InvalidArgument, msg); }

// Every field of a price, so that the merge's plan is the single process's to the bit (nlohmann writes a double
// in the fewest digits that read back as the same double).
Json priceJson(const CommPrice& p) {
  Json links = Json::array();
  for (const auto& l : p.busiest)
    links.push_back({l.name, l.bandwidthGBs, l.bytes, l.avgGBs, l.peakGBs, l.utilization});
  return {{"us", p.us},
          {"op", p.op},
          {"algo", p.algo},
          {"auto", p.chosenByAuto},
          {"source", toString(p.source)},
          {"note", p.note},
          {"domain", toString(p.domain)},
          {"group", {p.groupSize, p.groupNodes, p.concurrent}},
          {"bytes", p.bytes},
          {"closed_form_us", p.closedFormUs ? Json(*p.closedFormUs) : Json(nullptr)},
          {"busiest", links},
          {"bound", boundText(p)},
          {"steps", p.steps},
          {"wall_s", p.wallS}};
}

/// A shard's price; `path` names its file in the one line that refuses a name no table spells.
CommPrice priceFrom(const Json& j, const std::string& path) {
  CommPrice p;
  auto named = [&](const char* field, auto parse, const char* expected) {
    const std::string text = j.at(field).get<std::string>();
    const auto value = parse(text);
    if (!value)
      bad(path + ": a shard price's \"" + field + "\" is '" + text + "', not " + expected +
          ": give the plan.json files mk-plan --shard of this build wrote");
    return *value;
  };
  p.us = j.at("us").get<double>();
  p.op = j.at("op").get<std::string>();
  p.algo = j.at("algo").get<std::string>();
  p.chosenByAuto = j.at("auto").get<bool>();
  p.source = named("source", parsePriceSource, "simgrid, simgrid-fast, closed-form or none");
  p.note = j.at("note").get<std::string>();
  p.domain = named("domain", parseCommDomain, "nvlink or network");
  p.groupSize = j.at("group").at(0).get<uint32_t>();
  p.groupNodes = j.at("group").at(1).get<uint32_t>();
  p.concurrent = j.at("group").at(2).get<uint32_t>();
  p.bytes = j.at("bytes").get<uint64_t>();
  if (!j.at("closed_form_us").is_null()) p.closedFormUs = j.at("closed_form_us").get<double>();
  for (const Json& l : j.at("busiest"))
    p.busiest.push_back({l.at(0).get<std::string>(), l.at(1).get<double>(), l.at(2).get<double>(),
                         l.at(3).get<double>(), l.at(4).get<double>(), l.at(5).get<double>()});
  p.bound = named(
      "bound", [&](const std::string& text) { return parseBoundText(text, p); },
      "what mk-plan writes of its busiest links");
  p.steps = j.at("steps").get<uint64_t>();
  p.wallS = j.at("wall_s").get<double>();
  return p;
}

std::string shardName(const ShardSpec& s) { return std::to_string(s.index) + "/" + std::to_string(s.count); }

}  // namespace

std::string addShardSection(const std::string& planJson, const ShardFile& f) {
  Json j = Json::parse(planJson);
  Json prices = Json::object();
  for (const auto& [key, p] : f.prices) prices[key] = priceJson(p);
  j["shard"] = {{"index", f.shard.index},
                {"count", f.shard.count},
                {"args", f.args},
                {"inputs_digest", f.digest},
                {"prices", prices}};
  return j.dump(1);
}

ShardFile readShardFile(const std::string& path) {
  ShardFile f;
  f.path = path;
  Json j;
  try {
    j = Json::parse(readFile(path));
  } catch (const Json::exception& e) {
    bad(path + ": not JSON (" + e.what() + "): give the plan.json files mk-plan --shard wrote");
  }
  if (!j.is_object() || j.value("schema", "") != kPlanSchema)
    bad(path + ": not a plan.json (schema " + std::string(kPlanSchema) + "): give the files mk-plan --shard wrote");
  if (!j.contains("shard"))
    bad(path + ": a whole plan, not a shard (no \"shard\" section): it was written without --shard");
  try {
    const Json& s = j.at("shard");
    const long long index = s.at("index").get<long long>(), count = s.at("count").get<long long>();
    if (count < 2 || index < 0 || index >= count)
      bad(path + ": shard index " + std::to_string(index) + " of " + std::to_string(count) + " is outside 0.." +
          std::to_string(count - 1));
    f.shard = {static_cast<uint32_t>(index), static_cast<uint32_t>(count)};
    f.args = s.at("args").get<std::vector<std::string>>();
    f.digest = s.at("inputs_digest").get<std::string>();
    for (const auto& [key, p] : s.at("prices").items()) f.prices[key] = priceFrom(p, path);
  } catch (const Json::exception& e) {
    bad(path + ": a malformed \"shard\" section (" + e.what() + ")");
  }
  return f;
}

std::map<std::string, CommPrice> mergeShardPrices(const std::vector<ShardFile>& shards, const std::string& digest) {
  if (shards.empty()) bad("mk-plan merge: no shard given (mk-plan merge a.json b.json ... --json plan.json)");
  const ShardFile& first = shards.front();
  std::vector<const ShardFile*> byIndex(first.shard.count, nullptr);
  std::map<std::string, CommPrice> prices;
  for (const ShardFile& f : shards) {
    if (f.digest != first.digest)
      bad(f.path + ": planned from other inputs than " + first.path + " (inputs digest " + f.digest + ", not " +
          first.digest +
          "): merge the shards of one command line, with the same workload, cluster, profile and measurements");
    if (f.shard.count != first.shard.count)
      bad(f.path + ": shard " + shardName(f.shard) + ", but " + first.path + " is of " +
          std::to_string(first.shard.count) + " shards");
    if (const ShardFile* other = byIndex[f.shard.index])
      bad(f.path + ": shard " + shardName(f.shard) + " is given twice (also " + other->path + ")");
    byIndex[f.shard.index] = &f;
    prices.insert(f.prices.begin(), f.prices.end());  // one key, one simulation: the shards agree on it
  }
  if (first.digest != digest)
    bad(first.path + ": what it was planned from has changed since (inputs digest " + first.digest + ", now " + digest +
        "): a file of the workload, cluster, profile or measurements differs; plan the shards again");
  for (uint32_t i = 0; i < byIndex.size(); ++i)
    if (!byIndex[i])
      bad("shard " + std::to_string(i) + "/" + std::to_string(first.shard.count) + " is missing (its plan.json, " +
          "written by mk-plan --shard " + std::to_string(i) + "/" + std::to_string(first.shard.count) +
          "): merge every shard of the run");
  return prices;
}

}  // namespace mk::plan
