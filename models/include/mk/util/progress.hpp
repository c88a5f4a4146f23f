// mkernel — progress lines for work longer than a couple of seconds (generation, verification, simulation):
// "mk-schedule: verify: 42 % done, 6.1 s" on stderr, only when stderr is a terminal or the user asked for them
// (--progress); never on stdout, so --json output and piped tables stay clean.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace mk {

/// Whether progress lines are wanted: `asked` (--progress) or stderr is a terminal.
bool progressWanted(bool asked) noexcept;

/// The one progress line format: "<tool>: <what>: 42.0 % done, 6.1 s" (fraction < 0: no percentage), with
/// ", <detail>" when `detail` is not empty. Printed to stderr.
void printProgress(const std::string& tool, const std::string& what, double fraction, double wallS,
                   const std::string& detail = {});

/// While it lives and when enabled, prints a progress line every `everyS` seconds once `afterS` have passed,
/// from a thread of its own: for work that has no loop of its own to report from. `fraction` (optional) is
/// read from that thread, so it must be safe to call concurrently with the work (an atomic counter).
class ProgressTicker {
 public:
  ProgressTicker(std::string tool, std::string what, bool enabled, std::function<double()> fraction = {},
                 double afterS = 2.0, double everyS = 2.0);
  ProgressTicker(const ProgressTicker&) = delete;
  ProgressTicker& operator=(const ProgressTicker&) = delete;
  ~ProgressTicker();

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

/// Run `work` under a ProgressTicker (`tool`: `what`, when `enabled`) and return what it returns: generation and
/// verification, which have no loop of their own to report from.
template <class Work>
auto withProgress(const std::string& tool, const std::string& what, bool enabled, Work&& work) {
  const ProgressTicker ticker(tool, what, enabled);
  return work();
}

}  // namespace mk
