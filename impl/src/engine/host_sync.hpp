// mkernel — internal: the host side's small synchronisation vocabulary: wrapping sequence numbers, acquire /
// release access to words the kernels share through host-mapped memory, and the bounded host-side poll.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

namespace mk::runtime {

using Clock = std::chrono::steady_clock;

/// a >= b on wrapping 32-bit sequence numbers (the host twin of device::seqGeq).
inline bool seqGeq(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

/// "rank r" for the host log.
inline std::string rankName(int r) { return "rank " + std::to_string(r); }

inline uint32_t loadHost(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void storeHost(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

inline std::string fmtMs(double ms) {
  std::ostringstream os;
  os.precision(ms < 10 ? 3 : 1);
  os << std::fixed << ms << " ms";
  return os.str();
}

/// Polls `done` until it returns true, at most `budgetMs`; returns false on timeout.
inline bool hostPoll(double budgetMs, const std::function<bool()>& done) {
  const auto start = Clock::now();
  for (uint32_t spins = 0;; ++spins) {
    if (done()) return true;
    if (std::chrono::duration<double, std::milli>(Clock::now() - start).count() > budgetMs) return false;
    if (spins > 1000) std::this_thread::yield();
  }
}

}  // namespace mk::runtime
