// mkernel — simulated totals kept on disk between runs, and the one loop that predicts a list of schedules.
//
// Every run of mk-plan validates the simulator on the committed measurements (hundreds of small simulations, each
// in a forked process), and mk-validate's gates do the same on the same files: the same predictions, again and
// again. A prediction is a deterministic function of the schedule, the topology, the profile and the simulator,
// so a run can reuse what an earlier run of the same executable computed: a hit is the number a fresh simulation
// gives, bit for bit (tests/test_prediction_cache.cpp checks it).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// Simulated totals (microseconds) of one executable, in DIR/predictions-<executable id>.json. The executable id
/// covers what the simulator is: this program's path, size and modification time (the simulator is linked into
/// it) and the SimGrid version; a rebuilt tool starts a new file. A missing, unreadable or foreign file is an
/// empty cache; nothing here ever fails a run. Every entry read is checked (a well-formed key, a finite total in
/// (0, 1e10] us): a damaged one is never used, only simulated again and counted. A path that is not a regular file
/// (a FIFO, a device, a directory) is never opened for long nor replaced: the cache is off for the run.
class PredictionCache {
 public:
  /// `dir` empty: disabled (every lookup misses, save() writes nothing). `warn` receives one line when the file
  /// holds damaged entries or is not a regular file (default: "<program>: warning: ..." on stderr).
  explicit PredictionCache(std::string dir, const std::function<void(const std::string&)>& warn = {});

  /// $XDG_CACHE_HOME/mkernel, else $HOME/.cache/mkernel; empty when neither is set.
  static std::string defaultDir();

  bool enabled() const noexcept { return !file_.empty(); }
  const std::string& file() const noexcept { return file_; }
  /// Entries of the file that were damaged and ignored when it was read.
  std::size_t damaged() const noexcept { return damaged_; }

  /// The key of one prediction: a digest of the packed schedule, the topology and the profile.
  static std::string key(const Schedule& s, const Topology& topo, const Profile& profile);

  std::optional<double> find(const std::string& key) const;
  void put(const std::string& key, double totalUs);

  /// Merge the new entries into the file on disk (another process may have added some) and replace it atomically.
  /// Keeps the directory to the 16 most recently written cache files. False when it could not write.
  bool save();

 private:
  std::string dir_;
  std::string id_;  ///< what the simulator is (the executable, SimGrid); read once
  std::string file_;
  std::map<std::string, double> entries_;
  std::map<std::string, double> added_;
  std::size_t damaged_ = 0;
};

/// One prediction to make (trace and link loads off: only the total is kept).
struct TotalJob {
  const Schedule* schedule = nullptr;
  const Topology* topo = nullptr;
  const Profile* profile = nullptr;
};

/// The simulated total of every job in microseconds, each in a process of its own, up to `jobs` at once; from
/// `cache` where it holds the job (nullptr: none), and what was simulated is added to it and saved. `where(k)`
/// names job k in an error. `fromCache` (optional) receives how many came from the cache.
std::vector<double> predictTotals(const std::vector<TotalJob>& work, unsigned jobs, PredictionCache* cache,
                                  const std::function<std::string(std::size_t)>& where,
                                  std::size_t* fromCache = nullptr);

}  // namespace mk
