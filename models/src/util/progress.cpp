// mkernel — progress lines (mk/util/progress.hpp).
#include "mk/util/progress.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <utility>

namespace mk {

bool progressWanted(bool asked) noexcept { return asked || ::isatty(STDERR_FILENO) == 1; }

void printProgress(const std::string& tool, const std::string& what, double fraction, double wallS,
                   const std::string& detail) {
  if (fraction >= 0)
    std::fprintf(stderr, "%s: %s: %5.1f %% done, %.1f s%s%s\n", tool.c_str(), what.c_str(), 100.0 * fraction, wallS,
                 detail.empty() ? "" : ", ", detail.c_str());
  else
    std::fprintf(stderr, "%s: %s: %.1f s%s%s\n", tool.c_str(), what.c_str(), wallS, detail.empty() ? "" : ", ",
                 detail.c_str());
}

ProgressTicker::ProgressTicker(std::string tool, std::string what, bool enabled, std::function<double()> fraction,
                               double afterS, double everyS) {
  if (!enabled) return;
  thread_ = std::thread(
      [this, tool = std::move(tool), what = std::move(what), fraction = std::move(fraction), afterS, everyS] {
        using Clock = std::chrono::steady_clock;
        const auto start = Clock::now();
        auto next = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(afterS));
        std::unique_lock<std::mutex> lock(mutex_);
        while (!wake_.wait_until(lock, next, [this] { return done_; })) {
          const double wallS = std::chrono::duration<double>(Clock::now() - start).count();
          printProgress(tool, what, fraction ? fraction() : -1.0, wallS);
          next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(everyS));
        }
      });
}

ProgressTicker::~ProgressTicker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace mk
