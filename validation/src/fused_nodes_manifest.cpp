// mkernel — the manifest of fused operators measured across nodes (fused_nodes_manifest.hpp).
#include "mk/validation/fused_nodes_manifest.hpp"

#include <fnmatch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <set>

#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/io.hpp"
#include "mk/topology/topology.hpp"

namespace mk {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* const kFields[] = {"schema", "regime", "data", "topology", "calibration_base", "calibration", "gated"};

std::string fieldList() {
  std::string s;
  for (const char* f : kFields) s += (s.empty() ? "" : ", ") + std::string(f);
  return s;
}

/// The file names of the data directory's regular files that match one of `patterns` (each must match at least one).
std::vector<std::string> matching(const json& patterns, const std::string& field, const std::string& where,
                                  const std::vector<std::string>& names) {
  if (!patterns.is_array() || patterns.empty())
    throw Error(ErrorCode::ParseError, where + ": field '" + field +
                                           "' must be a non-empty array of file-name patterns (got " +
                                           describeJson(patterns) + ")");
  std::set<std::string> out;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    const std::string what = where + ": " + field + "[" + std::to_string(i) + "]";
    const std::string& p = json_get::text(patterns[i], what, 256);
    if (p.empty() || p.find('/') != std::string::npos)
      throw Error(
          ErrorCode::InvalidArgument,
          what + ": '" + p + "' is not a file-name pattern of the data directory (no '/', e.g. \"*-2x1-*.json\")");
    std::size_t hits = 0;
    for (const std::string& n : names)
      if (::fnmatch(p.c_str(), n.c_str(), FNM_PERIOD) == 0) {
        out.insert(n);
        ++hits;
      }
    if (hits == 0)
      throw Error(ErrorCode::InvalidArgument,
                  what + ": '" + p + "' matches no file of the data directory: fix the pattern or commit the data");
  }
  return {out.begin(), out.end()};
}

}  // namespace

FusedNodesManifest loadFusedNodesManifest(const std::string& path) {
  FusedNodesManifest m;
  m.path = path;
  const fs::path home = fs::path(path).parent_path();
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw Error(ErrorCode::InvalidArgument,
                path + ": is a directory: give a manifest file (" + kFusedNodesSchema +
                    ", e.g. validation/data/fused-validation/*.json), which names its measurement directory");
  if (!fs::is_regular_file(path, ec))
    throw Error(ErrorCode::InvalidArgument,
                path +
                    ": no such file: a fused-validation manifest names the calibration files, gated records and "
                    "topology of a measurement directory (validation/data/fused-validation/*.json)");
  const json root = parseJson(readFile(m.path), m.path);
  if (!root.is_object())
    throw Error(ErrorCode::ParseError, m.path + ": expected a JSON object (got " + describeJson(root) + ")");
  for (auto it = root.begin(); it != root.end(); ++it)
    if (std::find(std::begin(kFields), std::end(kFields), it.key()) == std::end(kFields))
      throw Error(ErrorCode::ParseError,
                  m.path + ": unknown field '" + excerpt(it.key()) + "' (expected " + fieldList() + ")");
  auto field = [&](const char* key) -> const json& {
    if (!root.contains(key)) throw Error(ErrorCode::ParseError, m.path + ": missing field '" + key + "'");
    return root.at(key);
  };
  const std::string& schema = json_get::text(field("schema"), m.path + ": field 'schema'", 128);
  if (!schemaMatches(schema, kFusedNodesSchema))
    throw Error(ErrorCode::ParseError,
                m.path + ": field 'schema' must be \"" + kFusedNodesSchema + "\" (got \"" + excerpt(schema) + "\")");
  m.regime = json_get::text(field("regime"), m.path + ": field 'regime'", 1024);
  const std::string& data = json_get::text(field("data"), m.path + ": field 'data'", 1024);
  m.dir = (home / data).lexically_normal().string();
  if (data.empty() || !fs::is_directory(m.dir, ec))
    throw Error(ErrorCode::InvalidArgument, m.path + ": field 'data': " + m.dir +
                                                " is not a directory (the measurement directory of the records, "
                                                "relative to the manifest)");
  const std::string& topology = json_get::text(field("topology"), m.path + ": field 'topology'", 1024);
  m.topology = (home / topology).lexically_normal().string();
  if (topology.empty() || !fs::is_regular_file(m.topology, ec))
    throw Error(ErrorCode::InvalidArgument, m.path + ": field 'topology': " + m.topology +
                                                " is not a file (a topology JSON, relative to the manifest)");
  m.base = json_get::text(field("calibration_base"), m.path + ": field 'calibration_base'", 128);
  const auto presets = topologyPresets();
  if (std::find(presets.begin(), presets.end(), m.base) == presets.end())
    throw Error(ErrorCode::InvalidArgument, m.path + ": field 'calibration_base': '" + excerpt(m.base) +
                                                "' is not a topology preset (the datasheet the calibration starts "
                                                "from, e.g. dgx-h100)");

  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(m.dir, ec))
    if (e.is_regular_file(ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  const auto calib = matching(field("calibration"), "calibration", m.path, names);
  const auto gated = matching(field("gated"), "gated", m.path, names);
  for (const std::string& n : gated)
    if (std::binary_search(calib.begin(), calib.end(), n))
      throw Error(ErrorCode::InvalidArgument, m.path + ": " + n +
                                                  " is both calibration and gated: the profile would be fitted on "
                                                  "the records it judges");
  for (const std::string& n : calib) m.calibration.push_back((fs::path(m.dir) / n).string());
  for (const std::string& n : gated) m.gated.push_back((fs::path(m.dir) / n).string());
  return m;
}

std::vector<std::string> findFusedNodesManifests(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) && e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace mk
