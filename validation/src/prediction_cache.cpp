// mkernel — simulated totals kept on disk between runs (prediction_cache.hpp).
#include "mk/validation/prediction_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
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

/// A damaged file's worth of text is far below this (200000 entries of ~60 bytes); a larger file is not ours.
constexpr std::size_t kMaxFileBytes = std::size_t{64} << 20;
/// The longest total a cache entry may hold, in microseconds (about 2.8 hours of one collective): far above any
/// schedule the tools simulate, far below what a damaged value (1e300) would do to an error.
constexpr double kMaxTotalUs = 1e10;

/// A key as key() writes it: 32 hex digits, '-', digits, '-', digits.
bool wellFormedKey(const std::string& k) {
  if (k.size() < 36 || k.size() > 80 || k[32] != '-') return false;
  for (std::size_t i = 0; i < 32; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(k[i]))) return false;
  const std::size_t dash = k.find('-', 33);
  if (dash == std::string::npos || dash == 33 || dash + 1 == k.size()) return false;
  for (std::size_t i = 33; i < k.size(); ++i)
    if (i != dash && !std::isdigit(static_cast<unsigned char>(k[i]))) return false;
  return true;
}

/// Whether `totalUs` is a total a simulation can have given: finite, > 0, below kMaxTotalUs. The one rule for
/// what is written and what is read back: a damaged value (negative, zero, huge) is never used as a prediction.
bool plausibleTotal(double totalUs) { return std::isfinite(totalUs) && totalUs > 0 && totalUs <= kMaxTotalUs; }

/// What a cache file held: its good entries, how many were damaged, and why the file was not read at all.
struct ReadResult {
  std::map<std::string, double> entries;
  std::size_t damaged = 0;
  std::string unusable;  ///< non-empty: the file is not a regular file, or too large (say so once)
};

ReadResult readEntries(const std::string& file, const std::string& id) {
  ReadResult r;
  // O_NONBLOCK: a FIFO at the path must not block the open (and then the run) waiting for a writer; fstat then
  // refuses anything that is not a regular file.
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return r;
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    r.unusable = "not a regular file";
  } else if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
    r.unusable = "larger than " + std::to_string(kMaxFileBytes >> 20) + " MiB";
  } else {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0 && text.size() + static_cast<std::size_t>(n) <= kMaxFileBytes) {
        text.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n != 0) text.clear();  // an error, or a file growing past the bound while read: an empty cache
      break;
    }
  }
  ::close(fd);
  if (text.empty()) return r;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("schema", "") != kSchema || j.value("executable", "") != id) return r;
    for (const auto& [k, v] : j.at("entries").items()) {
      if (v.is_number() && wellFormedKey(k) && plausibleTotal(v.get<double>()))
        r.entries.emplace(k, v.get<double>());
      else
        ++r.damaged;
    }
  } catch (const std::exception&) {
    r.entries.clear();  // a torn or foreign file: an empty cache
    r.damaged = 0;
  }
  return r;
}

void warnOnStderr(const std::string& message) {
  std::fprintf(stderr, "%s: warning: %s\n", program_invocation_short_name, message.c_str());
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

PredictionCache::PredictionCache(std::string dir, const std::function<void(const std::string&)>& warn)
    : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  id_ = executableId();
  if (id_.empty()) return;
  const std::string file = (fs::path(dir_) / ("predictions-" + hex(fnv1a(id_.data(), id_.size())) + ".json")).string();
  ReadResult r = readEntries(file, id_);
  const auto say = warn ? warn : warnOnStderr;
  if (!r.unusable.empty()) {
    // Not ours to replace (a FIFO, a device, a directory): no cache this run, and nothing written there.
    say("prediction cache " + file + " is " + r.unusable + ": running without the cache");
    return;
  }
  if (r.damaged > 0)
    say("prediction cache " + file + ": ignored " + std::to_string(r.damaged) + " damaged cache entr" +
        (r.damaged == 1 ? "y" : "ies") + " (simulated again)");
  file_ = file;
  damaged_ = r.damaged;
  entries_ = std::move(r.entries);
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
  if (!enabled() || !plausibleTotal(totalUs)) return;  // what a later read would reject is not kept
  entries_[key] = totalUs;
  added_[key] = totalUs;
}

bool PredictionCache::save() {
  if (!enabled() || added_.empty()) return true;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  ReadResult onDisk = readEntries(file_, id_);
  if (!onDisk.unusable.empty()) return false;  // replaced by something not ours since the start: leave it
  std::map<std::string, double> merged = std::move(onDisk.entries);
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
