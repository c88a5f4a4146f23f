// mkernel — internal: the one bounded spin-then-sleep wait of the proxy's host side.
//
// A waiter first spins (a command or a completion usually follows within microseconds, and a sleep costs tens of
// them), then sleeps in short slices on a condition variable or the clock, checking its budget between slices.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mk::proxy {

/// Tell the CPU this is a spin loop (frees the sibling hyper-thread, saves power).
inline void cpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Budget and phase of one bounded wait.
class SpinWait {
 public:
  using Clock = std::chrono::steady_clock;
  /// Spins this many times before sleeping: about 20 us of pause instructions on current x86 cores.
  static constexpr uint32_t kSpins = 512;

  explicit SpinWait(std::chrono::milliseconds budget) : deadline_(Clock::now() + budget) {}

  /// True while still in the spinning phase (after one pause); the caller re-checks its condition.
  bool spin() noexcept {
    if (spins_ >= kSpins) return false;
    ++spins_;
    cpuRelax();
    return true;
  }
  /// True once the budget is spent (reads the clock every 64 spins only).
  bool expired() noexcept {
    if (spins_ < kSpins && (spins_ & 63) != 0) return false;
    return Clock::now() >= deadline_;
  }
  /// How long to sleep next: 50 us, doubling to 1 ms, never past the deadline.
  std::chrono::microseconds sleepSlice() noexcept {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - Clock::now());
    const std::chrono::microseconds slice = slice_;
    if (slice_ < std::chrono::microseconds(1000)) slice_ *= 2;
    return std::max(std::chrono::microseconds(1), std::min(slice, left));
  }

 private:
  Clock::time_point deadline_;
  uint32_t spins_ = 0;
  std::chrono::microseconds slice_{50};
};

}  // namespace mk::proxy
