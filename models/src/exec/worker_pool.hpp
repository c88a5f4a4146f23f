// mkernel — internal to the CPU reference executor: the process-wide pool of worker threads its lanes run on.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "mk/error.hpp"

namespace mk::detail {

/// Process-wide pool of worker threads, reused across execute() calls: verification runs thousands of
/// small schedules, and creating 30+ threads per run would cost more than running the schedule.
/// Every job of a batch gets its own thread at the same time (lanes block on each other, so they must
/// all run concurrently); the pool only saves the creation. The pool object is deliberately leaked:
/// idle workers are detached and sleep on it, so destroying it at static-destruction time would pull
/// the condition variables from under them.
class WorkerPool {
 public:
  using Job = void (*)(void* ctx, std::size_t index) noexcept;

  static WorkerPool& instance() {
    static WorkerPool* pool = new WorkerPool;  // leaked on purpose, see above
    return *pool;
  }

  /// Run job(ctx, i) for every i in [0, n), each on its own thread, and return when all have returned.
  /// Throws Error(Unsupported) without running anything if the threads cannot be obtained.
  void runConcurrently(std::size_t n, Job job, void* ctx) {
    std::vector<Worker*> workers;
    workers.reserve(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (workers.size() < n && !idle_.empty()) {
        workers.push_back(idle_.back());
        idle_.pop_back();
      }
    }
    try {
      while (workers.size() < n) {
        auto w = std::make_unique<Worker>();
        std::thread(&WorkerPool::workerLoop, this, w.get()).detach();
        workers.push_back(w.release());
      }
    } catch (const std::bad_alloc&) {  // out of memory is the tools' exit 5, not an unsupported request
      release(workers);
      throw;
    } catch (const std::exception& e) {  // std::system_error: no more threads
      release(workers);
      throw Error(ErrorCode::Unsupported, "could not start executor thread " + std::to_string(workers.size() + 1) +
                                              " of " + std::to_string(n) + ": " + e.what());
    }
    Batch batch;
    batch.remaining = n;
    for (std::size_t i = 0; i < n; ++i) {
      Worker* w = workers[i];
      std::lock_guard<std::mutex> lock(w->mu);
      w->job = job;
      w->ctx = ctx;
      w->index = i;
      w->batch = &batch;
      w->cv.notify_one();
    }
    std::unique_lock<std::mutex> lock(batch.mu);
    batch.done.wait(lock, [&] { return batch.remaining == 0; });
  }

 private:
  /// Idle workers beyond this many exit instead of parking: bounds what one huge run leaves behind.
  static constexpr std::size_t kMaxIdle = 1024;

  struct Batch {
    std::mutex mu;
    std::condition_variable done;
    std::size_t remaining = 0;
  };
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    Job job = nullptr;  ///< set (under mu) while a job is pending
    void* ctx = nullptr;
    std::size_t index = 0;
    Batch* batch = nullptr;
  };

  void release(const std::vector<Worker*>& workers) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Worker* w : workers) idle_.push_back(w);
  }

  void workerLoop(Worker* w) noexcept {
    for (;;) {
      Job job;
      void* ctx;
      std::size_t index;
      Batch* batch;
      {
        std::unique_lock<std::mutex> lock(w->mu);
        w->cv.wait(lock, [&] { return w->job != nullptr; });
        job = w->job;
        ctx = w->ctx;
        index = w->index;
        batch = w->batch;
        w->job = nullptr;
      }
      job(ctx, index);
      // Park before reporting completion, so that a caller starting its next run right away finds this
      // worker idle instead of creating a new thread. Once parked it may be handed a new job: that
      // only sets fields under w->mu, which the next loop iteration reads.
      bool park;
      {
        std::lock_guard<std::mutex> lock(mu_);
        park = idle_.size() < kMaxIdle;
        if (park) idle_.push_back(w);
      }
      {
        // Notify under the batch mutex: the caller may destroy `batch` as soon as it can lock it.
        std::lock_guard<std::mutex> lock(batch->mu);
        if (--batch->remaining == 0) batch->done.notify_all();
      }
      if (!park) {
        delete w;
        return;
      }
    }
  }

  std::mutex mu_;
  std::vector<Worker*> idle_;
};

}  // namespace mk::detail
