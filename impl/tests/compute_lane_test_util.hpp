// Helpers shared by the compute-lane GPU tests: a watchdog that ends a test binary whose GPU hangs, and the
// communicator configuration they run with.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "mk/communicator.hpp"

namespace mkt {

/// Fails the binary fast instead of letting a stuck GPU hang it. A resident kernel whose CTA never returns
/// (a hardware wait no budget bounds: setmaxnreg, bar.sync) keeps the GPU busy for ever, and the next
/// cudaFree of the test waits for it: CTest would only see a process killed after its timeout, with no word
/// of where. If the guarded scope lasts longer than `seconds`, this prints the test, what it ran last
/// (progress()) and exits with code 3.
class Watchdog {
 public:
  Watchdog(std::string what, int seconds) : what_(std::move(what)), seconds_(seconds) {
    progress("start");
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::seconds(seconds_), [this] { return done_; })) return;
      std::string last;
      {
        std::lock_guard<std::mutex> g(progressMu());
        last = progressText();
      }
      std::fprintf(
          stderr,
          "\nWATCHDOG: test '%s' still running after %d s (a GPU hang?); last progress: %s\n"
          "WATCHDOG: exiting with code 3 instead of hanging (see docs/gemm.md, 'Inside the resident kernel')\n",
          what_.c_str(), seconds_, last.c_str());
      std::fflush(stderr);
      std::fflush(stdout);
      std::_Exit(3);
    });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Record what the test does now (printed if the watchdog fires).
  static void progress(const std::string& text) {
    std::lock_guard<std::mutex> g(progressMu());
    progressText() = text;
  }

 private:
  static std::mutex& progressMu() {
    static std::mutex m;
    return m;
  }
  static std::string& progressText() {
    static std::string t;
    return t;
  }
  std::string what_;
  int seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

/// A communicator with compute lanes and test budgets: a stuck wait fails in seconds.
inline mk::CommConfig computeConfig() {
  mk::CommConfig c;
  c.computeLanes = true;
  c.pollBudgetMs = 5000;
  c.hostBudgetMs = 20000;
  return c;
}

/// `v` rounded up to a multiple of 8 (leading dimensions the tile engines' TMA accepts).
inline uint32_t roundUp8(uint32_t v) { return (v + 7) / 8 * 8; }

}  // namespace mkt
