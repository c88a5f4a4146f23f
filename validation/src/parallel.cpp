// mkernel — many simulations at once (parallel.hpp).
#include "mk/validation/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mk {

void forEachParallel(std::size_t n, unsigned jobs, const std::function<void(std::size_t)>& work) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr firstError;
  std::mutex errorMutex;
  auto worker = [&] {
    for (;;) {
      const std::size_t k = next.fetch_add(1);
      if (k >= n || stop.load()) return;
      try {
        work(k);
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!firstError) firstError = std::current_exception();
        stop = true;
      }
    }
  };
#if defined(__SANITIZE_ADDRESS__)
  // A simulation forks while other threads may be allocating; GCC 12's AddressSanitizer allocator has no fork
  // handlers, so a child can inherit one of its locks held and hang (seen in mk-plan's tests). Sanitizer builds
  // simulate one at a time.
  jobs = 1;
#endif
  const std::size_t nThreads = std::max<std::size_t>(1, std::min<std::size_t>(jobs, n));
  if (nThreads == 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    try {
      pool.reserve(nThreads);
      for (std::size_t t = 0; t < nThreads; ++t) pool.emplace_back(worker);
    } catch (...) {
      // No thread (or no memory for one): the running ones stop after their item and are joined, never left
      // joinable (std::terminate); the error (std::bad_alloc: the tools' exit 5) goes to the caller.
      stop = true;
      for (auto& th : pool) th.join();
      throw;
    }
    for (auto& th : pool) th.join();
  }
  if (firstError) std::rethrow_exception(firstError);
}

}  // namespace mk
