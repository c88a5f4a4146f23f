// mkernel — bootstrap through MPI (mk/bootstrap.hpp: makeMpiBootstrap), compiled when MPI is found.
//
// Every MPI collective is posted non-blocking and polled with MPI_Test against the budget, so a rank that
// never calls ends in Error(Timeout) instead of a hang. A collective that timed out stays posted (MPI has no
// way to cancel one): its request and buffers are kept alive — leaked if the bootstrap dies first — because
// MPI may still write into them should the missing rank call later.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "mk/bootstrap.hpp"
#include "mk/error.hpp"

namespace mk {
namespace {

using Clock = std::chrono::steady_clock;

/// Polls this many times with a yield before sleeping between polls: a collective whose ranks are all
/// present completes within microseconds, a late rank should not cost a busy core.
constexpr int kSpinPolls = 2000;
constexpr auto kPollSleep = std::chrono::microseconds(100);

std::string mpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

void checkMpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw Error(ErrorCode::IoError, std::string("MPI bootstrap: ") + call + " failed: " + mpiErrorText(rc));
}

std::mutex& initMutex() {
  static std::mutex m;
  return m;
}

void finaliseAtExit() {
  int finalised = 0;
  if (MPI_Finalized(&finalised) == MPI_SUCCESS && !finalised) MPI_Finalize();
}

/// Initialise MPI unless the program did; only then finalise it at exit (the program owns its own MPI).
void ensureMpiInitialised() {
  const std::lock_guard<std::mutex> lock(initMutex());
  int finalised = 0;
  checkMpi(MPI_Finalized(&finalised), "MPI_Finalized");
  if (finalised)
    throw Error(ErrorCode::InvalidArgument,
                "makeMpiBootstrap: MPI was already finalised in this process and cannot be initialised again "
                "(create the communicator before MPI_Finalize)");
  int initialised = 0;
  checkMpi(MPI_Initialized(&initialised), "MPI_Initialized");
  if (initialised) return;
  int provided = 0;
  // SERIALIZED: the bootstrap's calls may come from any thread, one at a time (the caller's creation path).
  checkMpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  std::atexit(finaliseAtExit);
}

/// One posted collective: its request and the buffers MPI reads and writes until it completes.
struct Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Comm newComm = MPI_COMM_NULL;  ///< MPI_Comm_idup's result
  std::vector<uint8_t> send;
  std::vector<uint8_t> recv;
};

/// Poll `p` until it completes or `timeoutMs` passes. On timeout (or an MPI_Test failure) `p` is still
/// posted: the caller must keep it alive. Returns an empty string on completion, else why it did not.
std::string await(Pending& p, double timeoutMs) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(timeoutMs));
  for (int poll = 0;; ++poll) {
    int done = 0;
    const int rc = MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return "MPI_Test failed: " + mpiErrorText(rc);
    if (done) return {};
    if (Clock::now() >= deadline) return "timeout";
    if (poll < kSpinPolls)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(kPollSleep);
  }
}

std::string budgetText(double ms) { return std::to_string(static_cast<long long>(std::llround(ms))) + " ms"; }

class MpiBootstrap final : public Bootstrap {
 public:
  explicit MpiBootstrap(double timeoutMs) : timeoutMs_(timeoutMs) {
    // A duplicate of the world: our collectives never match the program's own on MPI_COMM_WORLD.
    auto dup = std::make_unique<Pending>();
    checkMpi(MPI_Comm_idup(MPI_COMM_WORLD, &dup->newComm, &dup->request), "MPI_Comm_idup");
    const std::string why = await(*dup, timeoutMs_);
    if (!why.empty()) {
      int worldRank = -1, worldSize = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
      MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
      (void)dup.release();  // still posted: MPI may complete it into dup->newComm later
      if (why != "timeout") throw Error(ErrorCode::IoError, "MPI bootstrap: MPI_Comm_idup: " + why);
      throw Error(ErrorCode::Timeout, "MPI bootstrap: MPI_Comm_idup of MPI_COMM_WORLD did not complete within " +
                                          budgetText(timeoutMs_) + ": a rank never created its bootstrap (rank " +
                                          std::to_string(worldRank) + " of " + std::to_string(worldSize) + ")");
    }
    comm_ = dup->newComm;
    // Errors on our communicator come back as codes (turned into mk::Error), never abort the program.
    checkMpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    checkMpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    checkMpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // Blocking, but every rank is known to be here (the idup completed): it cannot wait for a missing one.
    MPI_Comm node = MPI_COMM_NULL;
    checkMpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
             "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    const int rc = MPI_Comm_rank(node, &localRank_);
    MPI_Comm_free(&node);
    checkMpi(rc, "MPI_Comm_rank(node communicator)");
  }

  ~MpiBootstrap() override {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (pending_) {
      int done = 0;
      if (finalised || MPI_Test(&pending_->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done)
        (void)pending_.release();  // still posted: MPI may write into its buffers until the missing rank calls
    }
    if (!finalised && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MpiBootstrap(const MpiBootstrap&) = delete;
  MpiBootstrap& operator=(const MpiBootstrap&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  int localRank() const noexcept { return localRank_; }

  std::vector<uint8_t> allGather(const void* mine, size_t bytes) override {
    usable("allGather");
    if (bytes > 0 && !mine)
      throw Error(ErrorCode::InvalidArgument, "MPI bootstrap: allGather of " + std::to_string(bytes) +
                                                  " bytes from a null pointer (rank " + std::to_string(rank_) + ")");
    if (bytes > static_cast<size_t>(INT_MAX))
      throw Error(ErrorCode::InvalidArgument, "MPI bootstrap: allGather of " + std::to_string(bytes) +
                                                  " bytes per rank; at most " + std::to_string(INT_MAX) +
                                                  " (an MPI count is an int)");
    const uint64_t call = ++calls_;
    // First the (call number, byte count) of every rank: a mismatch is reported by every rank alike,
    // instead of an MPI truncation error on some and garbage on others.
    const uint64_t header[2] = {call, static_cast<uint64_t>(bytes)};
    const std::vector<uint8_t> all = exchange(header, sizeof header, "MPI_Iallgather");
    bool agree = true;
    std::string seen;
    for (int q = 0; q < size_; ++q) {
      uint64_t theirs[2];
      std::memcpy(theirs, all.data() + static_cast<size_t>(q) * sizeof header, sizeof header);
      agree = agree && theirs[0] == call && theirs[1] == bytes;
      seen += (q ? ", rank " : "rank ") + std::to_string(q) + ": " + std::to_string(theirs[1]) + " bytes at call #" +
              std::to_string(theirs[0]);
    }
    if (!agree) {
      // The same text on every rank (built from the gathered headers alone).
      broken_ = "the ranks disagreed at an allGather";
      throw Error(ErrorCode::InvalidArgument,
                  "MPI bootstrap: allGather: the ranks disagree (" + seen +
                      "); every rank must pass the same byte count, in the same call order");
    }
    if (bytes == 0) return {};
    return exchange(mine, bytes, "MPI_Iallgather");
  }

  void barrier() override {
    usable("barrier");
    ++calls_;
    auto p = std::make_unique<Pending>();
    checkMpi(MPI_Ibarrier(comm_, &p->request), "MPI_Ibarrier");
    finish(std::move(p), "MPI_Ibarrier");
  }

 private:
  void usable(const char* call) const {
    if (!broken_.empty())
      throw Error(ErrorCode::InvalidArgument, std::string("MPI bootstrap: ") + call + " on rank " +
                                                  std::to_string(rank_) + " after an earlier failure (" + broken_ +
                                                  "): the bootstrap is unusable; create a new one");
  }

  /// Iallgather `bytes` bytes from every rank; returns size_ * bytes bytes in rank order.
  std::vector<uint8_t> exchange(const void* mine, size_t bytes, const char* call) {
    auto p = std::make_unique<Pending>();
    const auto* src = static_cast<const uint8_t*>(mine);
    p->send.assign(src, src + bytes);
    p->recv.resize(bytes * static_cast<size_t>(size_));
    const int count = static_cast<int>(bytes);
    checkMpi(MPI_Iallgather(p->send.data(), count, MPI_BYTE, p->recv.data(), count, MPI_BYTE, comm_, &p->request),
             call);
    const std::unique_ptr<Pending> done = finish(std::move(p), call);
    return std::move(done->recv);
  }

  /// Wait for `p` within the budget; on failure keep it posted in pending_ and throw.
  std::unique_ptr<Pending> finish(std::unique_ptr<Pending> p, const char* call) {
    const std::string why = await(*p, timeoutMs_);
    if (why.empty()) return p;
    pending_ = std::move(p);
    const std::string where =
        " (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ", call #" + std::to_string(calls_) + ")";
    if (why != "timeout") {
      broken_ = std::string(call) + " failed";
      throw Error(ErrorCode::IoError, std::string("MPI bootstrap: ") + call + ": " + why + where);
    }
    broken_ = std::string(call) + " timed out";
    throw Error(ErrorCode::Timeout, std::string("MPI bootstrap: ") + call + " did not complete within " +
                                        budgetText(timeoutMs_) + ": a rank never called it" + where);
  }

  double timeoutMs_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int localRank_ = 0;
  uint64_t calls_ = 0;
  std::string broken_;                ///< why the bootstrap is unusable (empty while usable)
  std::unique_ptr<Pending> pending_;  ///< a collective that did not complete (kept alive for MPI)
};

}  // namespace

bool mpiBootstrapBuilt() noexcept { return true; }

std::unique_ptr<Bootstrap> makeMpiBootstrap(double timeoutMs, int* localRank) {
  if (!std::isfinite(timeoutMs) || timeoutMs <= 0)
    throw Error(ErrorCode::InvalidArgument,
                "makeMpiBootstrap: timeoutMs = " + std::to_string(timeoutMs) + "; expected a positive number of ms");
  ensureMpiInitialised();
  auto boot = std::make_unique<MpiBootstrap>(timeoutMs);
  if (localRank) *localRank = boot->localRank();
  return boot;
}

}  // namespace mk
