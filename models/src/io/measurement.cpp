#include "mk/io/measurement.hpp"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <utility>

#include "mk/algorithms/algorithms.hpp"
#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk {
namespace {

using nlohmann::json;

constexpr const char* kMeasurementSchema = "mkernel.measurement.v1";

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::ParseError, where + ": " + what);
}

const json& need(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(where + "." + key, "missing (required by mkernel.measurement.v1)");
  return *it;
}

std::string needString(const json& obj, const char* key, const std::string& where, bool allowEmpty = false) {
  const std::string& v = json_get::text(need(obj, key, where), where + "." + key);
  if (!allowEmpty && v.empty()) fail(where + "." + key, "must not be empty");
  return v;
}

/// Measured times: (0, one hour] in microseconds.
constexpr double kMaxTimeUs = 3.6e9;

double needNumber(const json& obj, const char* key, const std::string& where, double max, bool allowZero) {
  return json_get::number(need(obj, key, where), where + "." + key, 0, max, !allowZero);
}

uint64_t needUnsigned(const json& obj, const char* key, const std::string& where, bool allowZero,
                      uint64_t max = std::numeric_limits<uint32_t>::max()) {
  return json_get::unsignedInt(need(obj, key, where), where + "." + key, max, allowZero ? 0 : 1);
}

}  // namespace

MeasurementFile parseMeasurementFile(const std::string& jsonText, const std::string& name) {
  const json root = parseJson(jsonText, name, kMaxConfigJsonBytes);
  if (!root.is_object()) fail(name, "top level must be an object");
  MeasurementFile f;
  f.schema = needString(root, "schema", name);
  if (!schemaMatches(f.schema, kMeasurementSchema))
    fail(name + ".schema", std::string("must be \"") + kMeasurementSchema + "\" or \"" + kMeasurementSchema +
                               ".<minor>\" (got \"" + excerpt(f.schema) +
                               "\"): this mkernel reads major version 1 of measurement files");
  const json& sys = need(root, "system", name);
  if (!sys.is_object()) fail(name + ".system", "must be an object");
  for (const char* k : {"gpu", "gpus"}) need(sys, k, name + ".system");
  for (auto it = sys.begin(); it != sys.end(); ++it) f.system[it.key()] = it->dump();
  const json& run = need(root, "run", name);
  if (!run.is_object()) fail(name + ".run", "must be an object");
  f.date = needString(run, "date", name + ".run");
  f.commit = needString(run, "commit", name + ".run");
  f.command = needString(run, "command", name + ".run");
  const json& recs = need(root, "records", name);
  if (!recs.is_array() || recs.empty()) fail(name + ".records", "must be a non-empty array");
  static const char* const kKnown[] = {"op",      "impl",      "algo",      "dtype", "ranks", "bytes",
                                       "time_us", "algbw_gbs", "busbw_gbs", "iters", "stat"};
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const std::string where = name + ".records[" + std::to_string(i) + "]";
    const json& r = recs[i];
    if (!r.is_object()) fail(where, "must be an object");
    MeasurementRecord m;
    m.op = needString(r, "op", where);
    m.impl = needString(r, "impl", where);
    m.algo = r.contains("algo") ? needString(r, "algo", where, true) : "";
    m.dtype = needString(r, "dtype", where);
    m.ranks = static_cast<uint32_t>(needUnsigned(r, "ranks", where, false));
    m.bytes = needUnsigned(r, "bytes", where, true, kMaxElements);
    m.timeUs = needNumber(r, "time_us", where, kMaxTimeUs, false);
    m.algbwGBs = r.contains("algbw_gbs") ? needNumber(r, "algbw_gbs", where, kMaxRate, true) : 0;
    m.busbwGBs = r.contains("busbw_gbs") ? needNumber(r, "busbw_gbs", where, kMaxRate, true) : 0;
    m.iters = needUnsigned(r, "iters", where, false);
    m.stat = needString(r, "stat", where);
    for (auto it = r.begin(); it != r.end(); ++it) {
      bool known = false;
      for (const char* k : kKnown) known = known || it.key() == k;
      if (!known) m.extra[it.key()] = it->dump();
    }
    // What a generator is asked for when the record is replayed: never more than the command line may ask.
    if (r.contains("chunks")) needUnsigned(r, "chunks", where, false, kMaxChunks);
    if (r.contains("channels")) needUnsigned(r, "channels", where, false, kMaxChannels);
    // Fused operators (GEMM + collective): the shape and the SMs, and for our engine the split that ran.
    if (m.op == "gemm-rs" || m.op == "ag-gemm" || m.op == "gemm-ar") {
      for (const char* k : {"m", "n", "k", "sms"}) needUnsigned(r, k, where, false);
      if (m.impl == "mkernel") {
        needUnsigned(r, "tile_rows", where, false);
        needUnsigned(r, "compute_ctas", where, false);
        needUnsigned(r, "comm_ctas", where, true);  // one rank: no communication lane
      }
    }
    f.records.push_back(std::move(m));
  }
  return f;
}

MeasurementFile loadMeasurementFile(const std::string& path) { return parseMeasurementFile(readFile(path), path); }

std::vector<MeasurementFile> loadMeasurementFiles(const std::vector<std::string>& paths) {
  std::vector<std::pair<std::pair<dev_t, ino_t>, const std::string*>> seen;
  for (const std::string& path : paths) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;  // loading it names the problem
    for (const auto& [id, first] : seen)
      if (id == std::make_pair(st.st_dev, st.st_ino))
        throw Error(ErrorCode::InvalidArgument,
                    "'" + *first + "' and '" + path +
                        "' are the same measurement file: give each file once (its records would count twice)");
    seen.push_back({{st.st_dev, st.st_ino}, &path});
  }
  std::vector<MeasurementFile> files;
  files.reserve(paths.size());
  for (const std::string& path : paths) files.push_back(loadMeasurementFile(path));
  return files;
}

std::string measurementFileToJson(const MeasurementFile& f) {
  json root;
  root["schema"] = f.schema;
  json sys = json::object();
  for (const auto& [k, v] : f.system) sys[k] = json::parse(v);
  root["system"] = sys;
  root["run"] = {{"date", f.date}, {"commit", f.commit}, {"command", f.command}};
  json recs = json::array();
  for (const auto& m : f.records) {
    json r = {{"op", m.op},          {"impl", m.impl},          {"algo", m.algo},
              {"dtype", m.dtype},    {"ranks", m.ranks},        {"bytes", m.bytes},
              {"time_us", m.timeUs}, {"algbw_gbs", m.algbwGBs}, {"busbw_gbs", m.busbwGBs},
              {"iters", m.iters},    {"stat", m.stat}};
    for (const auto& [k, v] : m.extra) r[k] = json::parse(v);
    recs.push_back(std::move(r));
  }
  root["records"] = recs;
  return root.dump(1) + "\n";
}

void saveMeasurementFile(const MeasurementFile& f, const std::string& path) {
  writeFileAtomic(path, measurementFileToJson(f));
}

}  // namespace mk
