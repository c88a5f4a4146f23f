// mkernel — the CPU reference executor: one host thread per (rank, lane) over host memory.
//
// Synchronisation design (one mutex, one condition variable per rank):
//  * flags are std::atomic<uint64_t>; an increment is a seq_cst fetch_add done outside the mutex;
//  * a lane that must wait takes the mutex, publishes "I am blocked on X" and sleeps on its rank's
//    condition variable. A signaller wakes a rank's sleepers only when `sleepers_[rank]` is non-zero:
//    the waiter increments `sleepers_` before re-reading the flag and the signaller reads `sleepers_`
//    after its fetch_add, both seq_cst, so at least one of them sees the other (no lost wake-up) and
//    the common case — nobody asleep — costs no lock;
//  * deadlock: under the mutex, when the number of blocked lanes equals the number of unfinished
//    lanes, no increment can be in flight (only running lanes increment), so re-evaluating every
//    blocked lane's condition decides exactly whether anyone can still move. This runs on every
//    transition into "blocked" and on every lane finish, so detection is immediate and deterministic;
//  * stall: a sleeping lane wakes every stallTimeout and compares the global step count with the one it
//    saw; no step completed anywhere in between means Error(Timeout).
// The first error (thrown by a step, or a detected deadlock/stall) is stored, an abort flag is raised,
// every sleeper is woken, and the caller waits for every lane to return before rethrowing it. Lanes
// run on a process-wide pool of reused threads (WorkerPool), one thread per lane for the whole run.
//
// A run that spans processes (ExecOptions::localRanks, ExecOptions::proxy) runs the lanes of its local ranks only;
// ProxyPut steps go to the port, and what arrives comes back through RemoteEndpoint (this class): bytes straight
// into memory, then the flag increment through the same increment() as a local signal. Such an increment comes
// from no lane of this run, so a lane blocked on a flag some ProxyPut raises ("async-fed") never counts as
// deadlocked; the stall timeout bounds it, and every arrival counts as progress.
#include "mk/exec/executor.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/check.hpp"
#include "mk/schedule/route.hpp"
#include "mk/util/range.hpp"
#include "operand_overlap.hpp"
#include "step_operands.hpp"
#include "worker_pool.hpp"

namespace mk {

namespace {

constexpr std::size_t kMaxThreads = 8192;
constexpr std::size_t kMaxReportLines = 10;

using detail::BoundBuffer;

enum class BlockKind : uint8_t { None, Flag, Barrier };

/// Per-lane state shared with the deadlock/stall reporter; `block*` fields are guarded by the mutex.
struct alignas(64) LaneState {
  uint32_t rank = 0;
  uint32_t lane = 0;
  const std::vector<Step>* steps = nullptr;
  std::atomic<uint64_t> stepsDone{0};  ///< progress, read by the stall detector
  bool finished = false;
  BlockKind blockKind = BlockKind::None;
  uint32_t blockStep = 0;
  uint32_t blockId = 0;  ///< flag id or barrier id
  uint64_t blockThreshold = 0;
  std::vector<float> scratchA, scratchB;  ///< Gemm tiles as float, reused across steps
  ExecStats stats;                        ///< what this lane's steps moved; summed when the run ends
};

class Executor final : public RemoteEndpoint {
 public:
  Executor(const Schedule& s, HostMemory& mem, const ExecOptions& opt)
      : s_(s), mem_(mem), opt_(opt), ops_(s, opt.extents) {}

  /// What the run's lanes moved (complete once run() returns).
  const ExecStats& stats() const noexcept { return stats_; }

  void run() {
    checkShape();
    ops_.bind(mem_);

    std::size_t laneCount = 0;
    for (uint32_t rank = 0; rank < s_.nRanks; ++rank)
      if (local_[rank])
        for (const Lane& lane : s_.lanes[rank])
          if (!lane.steps.empty()) ++laneCount;
    if (laneCount == 0 && !opt_.proxy) return;  // with a port the run still meets the other processes
    if (laneCount > kMaxThreads)
      throw Error(ErrorCode::Unsupported,
                  "the CPU executor runs one thread per (rank, lane) with steps; this "
                  "schedule has " +
                      std::to_string(laneCount) + " such lanes, above the limit of " + std::to_string(kMaxThreads) +
                      " (run it on fewer ranks or merge lanes)");

    if (static_cast<uint64_t>(s_.nRanks) * s_.nFlags > (uint64_t{1} << 30))
      throw Error(ErrorCode::Unsupported,
                  "nRanks x nFlags = " + std::to_string(static_cast<uint64_t>(s_.nRanks) * s_.nFlags) +
                      " flag counters exceed the CPU executor's limit of 2^30");
    checkPlacement();
    flags_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<std::size_t>(s_.nRanks) * s_.nFlags);
    for (std::size_t i = 0; i < static_cast<std::size_t>(s_.nRanks) * s_.nFlags; ++i) flags_[i].store(0);
    barrierCount_.assign(s_.nBarriers, 0);
    barrierArrived_.assign(static_cast<std::size_t>(s_.nBarriers) * s_.nRanks, 0);
    sleepers_ = std::make_unique<std::atomic<uint32_t>[]>(s_.nRanks);
    for (uint32_t rank = 0; rank < s_.nRanks; ++rank) sleepers_[rank].store(0);
    cvs_ = std::make_unique<std::condition_variable[]>(s_.nRanks);

    lanes_ = std::make_unique<LaneState[]>(laneCount);
    laneCount_ = laneCount;
    std::size_t idx = 0;
    for (uint32_t rank = 0; rank < s_.nRanks; ++rank)
      for (uint32_t lane = 0; local_[rank] && lane < s_.lanes[rank].size(); ++lane)
        if (!s_.lanes[rank][lane].steps.empty()) {
          lanes_[idx].rank = rank;
          lanes_[idx].lane = lane;
          lanes_[idx].steps = &s_.lanes[rank][lane].steps;
          ++idx;
        }
    unfinished_ = laneCount;

    if (opt_.proxy) opt_.proxy->begin(s_, mem_, *this);
    try {
      // Throws (before any lane starts) if the threads cannot be had.
      detail::WorkerPool::instance().runConcurrently(
          laneCount,
          [](void* self, std::size_t i) noexcept {
            auto* ex = static_cast<Executor*>(self);
            ex->laneMain(ex->lanes_[i]);
          },
          this);
    } catch (...) {
      fail(std::current_exception());
    }
    for (std::size_t i = 0; i < laneCount; ++i)
      for (std::size_t k = 0; k < kStepKindCount; ++k) stats_.bytesMoved[k] += lanes_[i].stats.bytesMoved[k];
    if (opt_.proxy) {
      std::exception_ptr error;
      {
        std::lock_guard<std::mutex> lock(mu_);
        error = firstError_;
      }
      opt_.proxy->end(error);
    }
    if (firstError_) std::rethrow_exception(firstError_);
  }

  // ---- RemoteEndpoint ----------------------------------------------------------------------------------------
  std::byte* remoteWriteTarget(uint32_t rank, uint16_t buffer, uint64_t byteOffset, uint64_t bytes) override {
    if (rank >= s_.nRanks || !local_[rank])
      throw Error(ErrorCode::InvalidArgument,
                  "remote write for rank " + std::to_string(rank) + ", which this process does not run");
    if (buffer >= ops_.buffers())
      throw Error(ErrorCode::InvalidArgument, "remote write for buffer " + std::to_string(buffer) + " of rank " +
                                                  std::to_string(rank) + ", the schedule declares " +
                                                  std::to_string(ops_.buffers()));
    const BoundBuffer& bb = ops_.bound(rank, buffer);
    const uint64_t size = bb.count * dtypeSize(bb.dtype);
    if (!rangeInside(byteOffset, bytes, size))
      throw Error(ErrorCode::InvalidArgument, "remote write of bytes " + rangeText(byteOffset, bytes) +
                                                  " is outside buffer '" + s_.buffers[buffer].name + "' of rank " +
                                                  std::to_string(rank) + " (" + std::to_string(size) + " bytes)");
    return bb.data + byteOffset;
  }

  void remoteSignal(uint32_t rank, uint32_t flagId, uint64_t value) override {
    if (rank >= s_.nRanks || !local_[rank] || flagId >= s_.nFlags)
      throw Error(ErrorCode::InvalidArgument, "remote signal of flag " + std::to_string(flagId) + " of rank " +
                                                  std::to_string(rank) + ": not a flag of a rank this process runs (" +
                                                  std::to_string(s_.nFlags) + " flags per rank)");
    arrivals_.fetch_add(1, std::memory_order_relaxed);  // progress for the stall detector
    increment(rank, flags_[static_cast<std::size_t>(rank) * s_.nFlags + flagId], value);
  }

  void remoteFailure(std::exception_ptr error) noexcept override { fail(std::move(error)); }

  bool aborting() const noexcept override { return abort_.load(); }
  const ExtentValues& extents() const noexcept override { return opt_.extents; }

 private:
  // ---- setup -----------------------------------------------------------------------------------------
  void checkShape() {
    if (const std::string problem = laneListProblem(s_); !problem.empty())
      throw Error(ErrorCode::InvalidSchedule, "schedule: " + problem);
    if (mem_.bytes.size() != s_.nRanks)
      throw Error(ErrorCode::InvalidArgument, "host memory has " + std::to_string(mem_.bytes.size()) +
                                                  " ranks, the schedule " + std::to_string(s_.nRanks) +
                                                  " (use HostMemory::allocate(schedule))");
    local_.assign(s_.nRanks, opt_.localRanks.empty() ? 1 : 0);
    for (uint32_t r : opt_.localRanks) {
      if (r >= s_.nRanks)
        throw Error(ErrorCode::InvalidArgument, "ExecOptions::localRanks names rank " + std::to_string(r) +
                                                    ", outside the schedule's " + std::to_string(s_.nRanks) + " ranks");
      if (local_[r])
        throw Error(ErrorCode::InvalidArgument, "ExecOptions::localRanks names rank " + std::to_string(r) + " twice");
      local_[r] = 1;
    }
    for (uint32_t rank = 0; rank < s_.nRanks; ++rank) {
      if (!local_[rank] && mem_.bytes[rank].empty()) continue;  // another process's rank
      if (mem_.bytes[rank].size() != s_.buffers.size())
        throw Error(ErrorCode::InvalidArgument,
                    "host memory of rank " + std::to_string(rank) + " has " + std::to_string(mem_.bytes[rank].size()) +
                        " buffers, the schedule declares " + std::to_string(s_.buffers.size()));
      for (std::size_t b = 0; b < s_.buffers.size(); ++b) {
        const BufferDecl& decl = s_.buffers[b];
        if (const std::string problem = bufferCountProblem(s_, b); !problem.empty())
          throw Error(ErrorCode::InvalidSchedule, "schedule: " + problem);
        const uint64_t want = decl.count[rank] * dtypeSize(decl.dtype);
        if (mem_.bytes[rank][b].size() != want)
          throw Error(ErrorCode::InvalidArgument,
                      "host memory of buffer '" + decl.name + "' on rank " + std::to_string(rank) + " has " +
                          std::to_string(mem_.bytes[rank][b].size()) + " bytes, expected " + std::to_string(want));
      }
    }
  }

  /// A run over some ranks only: every step of a local rank stays among local ranks, except a ProxyPut's
  /// destination, which the port reaches. Also marks the async-fed flags (raised by a ProxyPut through the port).
  void checkPlacement() {
    const bool partial = std::find(local_.begin(), local_.end(), 0) != local_.end();
    if (!partial && !opt_.proxy) return;
    if (opt_.proxy) asyncFed_.assign(static_cast<std::size_t>(s_.nRanks) * s_.nFlags, 0);
    auto runsHere = [&](uint32_t r) { return r < s_.nRanks && local_[r]; };
    for (uint32_t rank = 0; rank < s_.nRanks; ++rank)
      for (uint32_t lane = 0; lane < s_.lanes[rank].size(); ++lane) {
        const std::vector<Step>& steps = s_.lanes[rank][lane].steps;
        for (uint32_t i = 0; i < steps.size(); ++i) {
          const Step& st = steps[i];
          const StepKindInfo& info = kindInfo(st.kind);
          if (opt_.proxy && info.remote && (st.flags & kStepSignal) && runsHere(st.flag.rank) && st.flag.id < s_.nFlags)
            asyncFed_[static_cast<std::size_t>(st.flag.rank) * s_.nFlags + st.flag.id] = 1;
          if (!local_[rank]) continue;
          auto refuse = [&](const std::string& what) {
            throw Error(ErrorCode::InvalidArgument,
                        describeStep(s_, rank, lane, i) + ": " + what + " (this process runs " + localRankList() + ")");
          };
          auto needLocal = [&](const char* name, uint32_t r) {
            if (!runsHere(r))
              refuse(std::string("operand ") + name + " is on rank " + std::to_string(r) +
                     ", which another process runs; only a proxyput crosses processes");
          };
          if (info.remote) {
            if (opt_.proxy && st.extent < s_.extents.size() && s_.extents[st.extent].sourced())
              throw Error(ErrorCode::Unsupported,
                          describeStep(s_, rank, lane, i) + ": its extent '" + s_.extents[st.extent].name +
                              "' is read from a buffer, but the proxy port sizes a proxyput from the caller's values "
                              "(ExecOptions::extents); give that extent's values as the caller, or run without a port");
            // A signal-only proxyput (count 0) has no data operands: its destination is its flag's rank.
            if (st.count > 0) needLocal("a", st.a.rank);
            if (!opt_.proxy)
              needLocal("dst (no ExecOptions::proxy to reach it)", st.count > 0 ? st.dst.rank : st.flag.rank);
          } else if (info.waits) {
            if ((info.fields & kFieldAux) && partial) refuse("a barrier needs every rank in one process");
          } else {
            const bool tile = info.extent == StepExtent::Tile;
            if (info.fields & kFieldDst) needLocal(tile ? "dst (C)" : "dst", st.dst.rank);
            if (info.fields & kFieldA) needLocal(tile ? "a (A)" : "a", st.a.rank);
            if (info.fields & kFieldB) needLocal(tile ? "b (B)" : "b", st.b.rank);
            if (incrementsFlag(st.kind, st.flags))
              needLocal((info.fields & kFieldFlag) ? "target flag" : "signal flag", st.flag.rank);
          }
        }
      }
  }

  std::string localRankList() const {
    std::string out;
    uint32_t count = 0;
    for (uint32_t r = 0; r < s_.nRanks; ++r)
      if (local_[r]) {
        if (count < 16) out += (count ? ", " : "") + std::to_string(r);
        ++count;
      }
    if (count > 16) out += ", ... (" + std::to_string(count) + " ranks)";
    return count == 1 ? "rank " + out : "ranks " + out;
  }

  bool isAsyncFed(uint32_t rank, uint32_t id) const {
    return !asyncFed_.empty() && asyncFed_[static_cast<std::size_t>(rank) * s_.nFlags + id];
  }

  /// The ranks whose ProxyPuts raise flag (rank, id), for reports.
  std::string proxySignallers(uint32_t rank, uint32_t id) const {
    std::string out;
    std::vector<char> seen(s_.nRanks, 0);
    for (uint32_t r = 0; r < s_.nRanks; ++r)
      for (const Lane& lane : s_.lanes[r])
        for (const Step& st : lane.steps)
          if (kindInfo(st.kind).remote && (st.flags & kStepSignal) && st.flag.rank == rank && st.flag.id == id &&
              !seen[r]) {
            seen[r] = 1;
            out += (out.empty() ? "" : ", ") + std::to_string(r);
          }
    return out;
  }

  // ---- errors ----------------------------------------------------------------------------------------
  [[noreturn]] void invalid(const LaneState& ls, uint32_t stepIdx, const std::string& what) const {
    ops_.invalid(at(ls, stepIdx), what);
  }

  /// Store the first error, raise abort and wake everyone. Safe to call from any thread.
  void fail(std::exception_ptr e) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    failLocked(std::move(e));
  }
  void failLocked(std::exception_ptr e) noexcept {
    if (!firstError_) firstError_ = std::move(e);
    abort_.store(true);
    for (uint32_t rank = 0; rank < s_.nRanks; ++rank) cvs_[rank].notify_all();
  }

  // ---- operand checks (step_operands.hpp) ------------------------------------------------------------
  static detail::StepAt at(const LaneState& ls, uint32_t stepIdx) noexcept { return {ls.rank, ls.lane, stepIdx}; }
  const BoundBuffer& operand(const LaneState& ls, uint32_t stepIdx, const char* name, const BufRef& ref,
                             uint64_t extent) const {
    return ops_.operand(at(ls, stepIdx), name, ref, extent);
  }

  /// The counter of the flag step `stepIdx` signals or awaits, after the shared checks of that reference.
  std::atomic<uint64_t>& flagRef(const LaneState& ls, uint32_t stepIdx, const FlagRef& f) const {
    requireSyncReferences(s_, ls.rank, ls.lane, stepIdx);
    return flags_[static_cast<std::size_t>(f.rank) * s_.nFlags + f.id];
  }

  // ---- synchronisation -------------------------------------------------------------------------------
  void increment(uint32_t rank, std::atomic<uint64_t>& flag, uint64_t value) {
    flag.fetch_add(value);  // seq_cst: pairs with the sleeper count read below (see file comment)
    if (sleepers_[rank].load() != 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cvs_[rank].notify_all();
    }
  }

  bool blockedCanProceed(const LaneState& ls) const {
    if (ls.blockKind == BlockKind::Flag)
      return flags_[static_cast<std::size_t>(ls.rank) * s_.nFlags + ls.blockId].load() >= ls.blockThreshold;
    if (ls.blockKind == BlockKind::Barrier) return barrierCount_[ls.blockId] >= s_.nRanks;
    return true;
  }

  /// Under mu_: every unfinished lane is blocked. Returns true (and fails) if none can proceed.
  bool checkDeadlockLocked() {
    if (unfinished_ == 0 || blocked_ != unfinished_ || abort_.load()) return false;
    for (std::size_t i = 0; i < laneCount_; ++i) {
      const LaneState& ls = lanes_[i];
      if (ls.finished || ls.blockKind == BlockKind::None) continue;
      if (blockedCanProceed(ls)) return false;
      // An increment through the proxy may still be in flight: only the stall timeout can tell.
      if (ls.blockKind == BlockKind::Flag && isAsyncFed(ls.rank, ls.blockId)) return false;
    }
    failLocked(std::make_exception_ptr(Error(
        ErrorCode::Deadlock, "all " + std::to_string(unfinished_) +
                                 " unfinished lanes are blocked and none can proceed:\n" + blockedReportLocked())));
    return true;
  }

  std::string blockedReportLocked() const {
    std::ostringstream out;
    std::size_t lines = 0, more = 0;
    for (std::size_t i = 0; i < laneCount_; ++i) {
      const LaneState& ls = lanes_[i];
      if (ls.finished || ls.blockKind == BlockKind::None) continue;
      if (lines == kMaxReportLines) {
        ++more;
        continue;
      }
      if (lines) out << '\n';
      out << "  " << describeStep(s_, ls.rank, ls.lane, ls.blockStep) << ": ";
      if (ls.blockKind == BlockKind::Flag) {
        out << "waits for flag " << ls.blockId << " >= " << ls.blockThreshold << ", seen "
            << flags_[static_cast<std::size_t>(ls.rank) * s_.nFlags + ls.blockId].load();
        if (isAsyncFed(ls.rank, ls.blockId))
          out << " (raised through the proxy by rank(s) " << proxySignallers(ls.rank, ls.blockId) << ")";
      } else
        out << "waits at barrier " << ls.blockId << ": " << barrierCount_[ls.blockId] << " of " << s_.nRanks
            << " ranks arrived";
      ++lines;
    }
    if (more) out << "\n  (+" << more << " more)";
    return out.str();
  }

  uint64_t totalProgress() const {
    uint64_t sum = arrivals_.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < laneCount_; ++i) sum += lanes_[i].stepsDone.load(std::memory_order_relaxed);
    return sum;
  }

  /// Sleep (lock held) until `ready()` or abort. Handles deadlock and stall detection.
  template <class Ready>
  void blockLocked(std::unique_lock<std::mutex>& lock, LaneState& ls, Ready ready) {
    sleepers_[ls.rank].fetch_add(1);
    ++blocked_;
    uint64_t seen = totalProgress();
    // Clamped so that a huge timeout cannot overflow the clock's representation.
    const auto timeout = std::min<std::chrono::milliseconds>(opt_.stallTimeout, std::chrono::hours(24 * 365));
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!abort_.load() && !ready()) {
      if (checkDeadlockLocked()) break;
      if (cvs_[ls.rank].wait_until(lock, deadline) == std::cv_status::timeout && !abort_.load() && !ready()) {
        const uint64_t now = totalProgress();
        if (now == seen) {
          failLocked(std::make_exception_ptr(Error(
              ErrorCode::Timeout, "no step completed anywhere for " + std::to_string(opt_.stallTimeout.count()) +
                                      " ms (ExecOptions::stallTimeout); blocked lanes:\n" + blockedReportLocked())));
          break;
        }
        seen = now;
        deadline = std::chrono::steady_clock::now() + timeout;
      }
    }
    --blocked_;
    sleepers_[ls.rank].fetch_sub(1);
    ls.blockKind = BlockKind::None;
  }

  void waitFlag(LaneState& ls, uint32_t stepIdx, const Step& st) {
    std::atomic<uint64_t>& flag = flagRef(ls, stepIdx, st.flag);
    if (flag.load() >= st.value) return;  // fast path: no lock when already satisfied
    std::unique_lock<std::mutex> lock(mu_);
    ls.blockKind = BlockKind::Flag;
    ls.blockStep = stepIdx;
    ls.blockId = st.flag.id;
    ls.blockThreshold = st.value;
    blockLocked(lock, ls, [&] { return flag.load() >= st.value; });
  }

  void barrier(LaneState& ls, uint32_t stepIdx, const Step& st) {
    requireSyncReferences(s_, ls.rank, ls.lane, stepIdx);
    std::unique_lock<std::mutex> lock(mu_);
    char& arrived = barrierArrived_[static_cast<std::size_t>(st.aux) * s_.nRanks + ls.rank];
    if (arrived) {
      lock.unlock();
      invalid(ls, stepIdx,
              "rank " + std::to_string(ls.rank) + " arrives at barrier " + std::to_string(st.aux) +
                  " a second time; each rank must arrive exactly once");
    }
    arrived = 1;
    ls.stepsDone.fetch_add(1, std::memory_order_relaxed);  // an arrival is progress for the stall detector
    if (++barrierCount_[st.aux] == s_.nRanks) {
      for (uint32_t rank = 0; rank < s_.nRanks; ++rank) cvs_[rank].notify_all();
      return;
    }
    ls.blockKind = BlockKind::Barrier;
    ls.blockStep = stepIdx;
    ls.blockId = st.aux;
    blockLocked(lock, ls, [&] { return barrierCount_[st.aux] >= s_.nRanks; });
  }

  // ---- data steps ------------------------------------------------------------------------------------
  /// The destination and source of a data move (Copy, Put, ProxyPut), after the range and dtype checks.
  std::pair<const BoundBuffer*, const BoundBuffer*> moveOperands(const LaneState& ls, uint32_t stepIdx,
                                                                 const Step& st) const {
    const BoundBuffer& dst = operand(ls, stepIdx, "dst", st.dst, st.count);
    const BoundBuffer& src = operand(ls, stepIdx, "a", st.a, st.count);
    if (dst.dtype != src.dtype)
      invalid(ls, stepIdx,
              std::string("copies ") + toString(src.dtype) + " into " + toString(dst.dtype) +
                  "; copies move bytes, operand dtypes must agree");
    return {&dst, &src};
  }

  void copy(const LaneState& ls, uint32_t stepIdx, const Step& st) {
    if (st.count == 0) return;
    const auto [dst, src] = moveOperands(ls, stepIdx, st);
    if (detail::partialOverlap(st.dst, st.count, st.a, st.count))
      invalid(ls, stepIdx, "source and destination ranges partially overlap");
    const std::size_t esize = dtypeSize(dst->dtype);
    std::memmove(dst->data + st.dst.offset * esize, src->data + st.a.offset * esize,
                 static_cast<std::size_t>(st.count * esize));
  }

  void put(LaneState& ls, uint32_t stepIdx, const Step& st) {
    copy(ls, stepIdx, st);
    if (st.flags & kStepSignal) increment(st.flag.rank, flagRef(ls, stepIdx, st.flag), st.value);
  }

  void runStep(LaneState& ls, uint32_t stepIdx, const Step& st) {
    if (st.kind == StepKind::Combine) {  // its extent sizes the tokens it combines, not its blocks' stride
      const uint64_t bound = st.extent < s_.extents.size() ? s_.extents[st.extent].bound : 0;
      const uint64_t tokens = combineShape(st).tokens;
      const detail::StepAt here = at(ls, stepIdx);
      detail::combineStep(ops_, here, st,
                          bound == 0 ? tokens : scaleToExtent(tokens, bound, ops_.extentAt(here, st.extent)));
      return;
    }
    if (st.extent != kNoExtent) {  // the step as this rank runs it: count resolved against its extent value
      Step resolved = st;
      if (st.extent < s_.extents.size())
        resolved.count =
            scaleToExtent(st.count, s_.extents[st.extent].bound, ops_.extentAt(at(ls, stepIdx), st.extent));
      resolved.extent = kNoExtent;
      runStep(ls, stepIdx, resolved);
      return;
    }
    if (kindInfo(st.kind).movesData && st.dst.buffer < ops_.buffers() &&
        isDType(static_cast<uint8_t>(s_.buffers[st.dst.buffer].dtype)))
      ls.stats.bytesMoved[static_cast<std::size_t>(st.kind)] += st.count * dtypeSize(s_.buffers[st.dst.buffer].dtype);
    switch (st.kind) {
      case StepKind::Copy: copy(ls, stepIdx, st); return;
      case StepKind::Reduce: detail::reduceStep(ops_, at(ls, stepIdx), st); return;
      case StepKind::Put: put(ls, stepIdx, st); return;
      case StepKind::ProxyPut:
        if (st.count == 0 && !(st.flags & kStepSignal)) return;  // a runtime extent of 0: nothing to send
        if (opt_.proxy) {
          // Checked here as put() would: the port trusts the step.
          if (st.count > 0) moveOperands(ls, stepIdx, st);
          if (st.flags & kStepSignal) flagRef(ls, stepIdx, st.flag);
          opt_.proxy->proxyPut(ls.rank, ls.lane, stepIdx);
          return;
        }
        put(ls, stepIdx, st);
        return;
      case StepKind::Signal: increment(st.flag.rank, flagRef(ls, stepIdx, st.flag), st.value); return;
      case StepKind::Wait: waitFlag(ls, stepIdx, st); return;
      case StepKind::Gemm: detail::gemmStep(ops_, at(ls, stepIdx), st, ls.scratchA, ls.scratchB); return;
      case StepKind::GroupedGemm:
        forEachGemm(s_.gemms, st,
                    [&](const Step& one) { detail::gemmStep(ops_, at(ls, stepIdx), one, ls.scratchA, ls.scratchB); });
        return;
      case StepKind::Barrier: barrier(ls, stepIdx, st); return;
      case StepKind::Route: detail::routeStep(ops_, at(ls, stepIdx), st); return;
      case StepKind::Gather: detail::gatherStep(ops_, at(ls, stepIdx), st); return;
      case StepKind::Attention: detail::attentionStep(ops_, at(ls, stepIdx), st); return;
      case StepKind::Combine: return;  // run above
      case StepKind::AttentionGrad: detail::attentionGradStep(ops_, at(ls, stepIdx), st); return;
    }
    invalid(ls, stepIdx, "unknown step kind " + std::to_string(static_cast<int>(st.kind)));
  }

  void laneMain(LaneState& ls) noexcept {
    try {
      const std::vector<Step>& steps = *ls.steps;
      for (std::size_t i = 0; i < steps.size(); ++i) {
        if (abort_.load(std::memory_order_relaxed)) break;
        runStep(ls, static_cast<uint32_t>(i), steps[i]);
        ls.stepsDone.fetch_add(1, std::memory_order_relaxed);
      }
    } catch (...) {
      fail(std::current_exception());
    }
    std::lock_guard<std::mutex> lock(mu_);
    ls.finished = true;
    --unfinished_;
    try {
      checkDeadlockLocked();
    } catch (...) {  // building the report can run out of memory; a worker must never throw
      failLocked(std::current_exception());
    }
  }

  const Schedule& s_;
  HostMemory& mem_;
  const ExecOptions& opt_;
  detail::StepOperands ops_;  ///< the buffers bound to mem_, the operand checks

  std::vector<char> local_;                            ///< [rank]: this process runs it
  std::vector<char> asyncFed_;                         ///< [rank * nFlags + id]: raised by a ProxyPut through the port
  std::atomic<uint64_t> arrivals_{0};                  ///< remote signals so far (progress)
  std::unique_ptr<std::atomic<uint64_t>[]> flags_;     ///< [rank * nFlags + id]
  std::unique_ptr<std::atomic<uint32_t>[]> sleepers_;  ///< lanes of each rank inside blockLocked
  std::unique_ptr<std::condition_variable[]> cvs_;     ///< one per rank, all on mu_
  std::unique_ptr<LaneState[]> lanes_;
  std::size_t laneCount_ = 0;

  std::mutex mu_;  // guards everything below and LaneState::block*/finished
  std::vector<uint32_t> barrierCount_;
  std::vector<char> barrierArrived_;  ///< [barrier * nRanks + rank]
  std::size_t unfinished_ = 0;
  std::size_t blocked_ = 0;
  std::exception_ptr firstError_;
  std::atomic<bool> abort_{false};
  ExecStats stats_;
};

}  // namespace

ExecStats execute(const Schedule& s, HostMemory& mem, const ExecOptions& opt) {
  checkExtentValues(s, opt.extents);
  Executor ex(s, mem, opt);
  ex.run();
  return ex.stats();
}

}  // namespace mk
