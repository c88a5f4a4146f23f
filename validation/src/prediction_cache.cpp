// mkernel — simulated totals kept on disk between runs (prediction_cache.hpp).
#include "mk/validation/prediction_cache.hpp"

#include <sys/stat.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/sim/replay.hpp"
#include "mk/validation/parallel.hpp"

namespace mk {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSchema = "mkernel.prediction-cache.v1";
constexpr std::size_t kKeepFiles = 16;
constexpr std::size_t kMaxEntries = 200000;  ///< a file past this starts over (a few MiB of JSON)

/// FNV-1a, 64 bits, continued from `h`.
uint64_t fnv1a(const void* data, std::size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

/// What the simulator is: this executable's path, size and modification time, and the SimGrid library. Empty when
/// the executable cannot be found (the cache is then off).
std::string executableId() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  struct stat st {};
  if (ec || ::stat(exe.c_str(), &st) != 0) return "";
  return exe.string() + "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + "|" + sim::engineVersion();
}

std::map<std::string, double> readEntries(const std::string& file, const std::string& id) {
  std::map<std::string, double> out;
  std::ifstream in(file);
  if (!in) return out;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("schema", "") != kSchema || j.value("executable", "") != id) return out;
    for (const auto& [k, v] : j.at("entries").items())
      if (v.is_number()) out.emplace(k, v.get<double>());
  } catch (const std::exception&) {
    out.clear();  // a torn or foreign file: an empty cache
  }
  return out;
}

/// Keep the `keep` most recently written cache files of `dir`.
void prune(const std::string& dir, std::size_t keep) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("predictions-", 0) != 0 || e.path().extension() != ".json") continue;
    std::error_code tec;
    const auto t = fs::last_write_time(e.path(), tec);
    if (!tec) files.emplace_back(t, e.path());
  }
  if (files.size() <= keep) return;
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = keep; i < files.size(); ++i) fs::remove(files[i].second, ec);
}

}  // namespace

PredictionCache::PredictionCache(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  id_ = executableId();
  if (id_.empty()) return;
  file_ = (fs::path(dir_) / ("predictions-" + hex(fnv1a(id_.data(), id_.size())) + ".json")).string();
  entries_ = readEntries(file_, id_);
}

std::string PredictionCache::defaultDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/') return std::string(x) + "/mkernel";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h == '/') return std::string(h) + "/.cache/mkernel";
  return "";
}

std::string PredictionCache::key(const Schedule& s, const Topology& topo, const Profile& profile) {
  const std::vector<uint8_t> packed = pack(s);
  const std::string t = topologyToJson(topo, -1);
  const std::string p = profileToJson(profile, {}, -1);
  uint64_t h = fnv1a(packed.data(), packed.size());
  h = fnv1a(t.data(), t.size(), h);
  h = fnv1a(p.data(), p.size(), h);
  // A second, differently seeded pass and the lengths: two unrelated inputs sharing a key is then out of reach.
  uint64_t g = fnv1a(p.data(), p.size(), 0x9e3779b97f4a7c15ull);
  g = fnv1a(t.data(), t.size(), g);
  g = fnv1a(packed.data(), packed.size(), g);
  return hex(h) + hex(g) + "-" + std::to_string(packed.size()) + "-" + std::to_string(t.size() + p.size());
}

std::optional<double> PredictionCache::find(const std::string& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void PredictionCache::put(const std::string& key, double totalUs) {
  if (!enabled()) return;
  entries_[key] = totalUs;
  added_[key] = totalUs;
}

bool PredictionCache::save() {
  if (!enabled() || added_.empty()) return true;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  std::map<std::string, double> merged = readEntries(file_, id_);
  if (merged.size() + added_.size() > kMaxEntries) merged.clear();
  for (const auto& [k, v] : added_) merged[k] = v;
  nlohmann::json j;
  j["schema"] = kSchema;
  j["executable"] = id_;
  j["entries"] = merged;
  try {
    writeFileAtomic(file_, j.dump() + "\n");
  } catch (const std::exception&) {
    return false;  // a read-only or full disk costs the next run its speed, never this run its result
  }
  added_.clear();
  entries_ = std::move(merged);
  prune(dir_, kKeepFiles);
  return true;
}

std::vector<double> predictTotals(const std::vector<TotalJob>& work, unsigned jobs, PredictionCache* cache,
                                  const std::function<std::string(std::size_t)>& where, std::size_t* fromCache) {
  std::vector<double> totals(work.size(), 0.0);
  std::vector<std::string> keys(work.size());
  std::vector<std::size_t> todo;
  for (std::size_t k = 0; k < work.size(); ++k) {
    if (cache != nullptr && cache->enabled()) {
      keys[k] = PredictionCache::key(*work[k].schedule, *work[k].topo, *work[k].profile);
      if (const auto hit = cache->find(keys[k])) {
        totals[k] = *hit;
        continue;
      }
    }
    todo.push_back(k);
  }
  if (fromCache != nullptr) *fromCache = work.size() - todo.size();
  forEachParallel(todo.size(), jobs, [&](std::size_t i) {
    const std::size_t k = todo[i];
    try {
      sim::SimOptions so;
      so.trace = false;
      so.linkLoad = false;
      totals[k] = sim::predict(*work[k].schedule, *work[k].topo, *work[k].profile, so).totalUs;
    } catch (const Error& e) {
      throw Error(e.code(), where(k) + ": simulation: " + e.message());
    }
  });
  if (cache != nullptr && cache->enabled()) {
    for (const std::size_t k : todo) cache->put(keys[k], totals[k]);
    (void)cache->save();
  }
  return totals;
}

}  // namespace mk
