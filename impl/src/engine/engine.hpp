// mkernel — internal: the engine, the state the ranks of a communicator share, in one process or one per GPU.
//
// Both modes run the same code (lowering, submission, gating, failures); they differ only in where a
// peer's addresses come from:
//  * one process (createLocal): every rank lives here; peer access makes peers' RankState, scratch and
//    user buffers plain pointers; an op's descriptor is written when the last local rank submitted it.
//  * one process per GPU (create / createFromEnvironment): ranks_[me_] is the only local rank; a
//    ProcessLink shares the status block and a post board in POSIX shared memory; peers' memory arrives as
//    CUDA IPC handles (RankState once at creation, buffers of each op through the post board). Op k's
//    descriptor is written by whichever of this rank's submit call or the progress thread first sees
//    every rank's post of op k (a submit never waits for a peer, except ring back-pressure).
//
// One class, one mutex (mu_), its methods defined by concern in the files of engine/ named below.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "device/topology_probe.hpp"
#include "engine/capture.hpp"
#include "engine/process_link.hpp"
#include "engine/resources.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cost/cost.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

class InterNode;

/// The engine of one communicator: resources, resident kernels and op submission of its ranks (every rank in
/// one process, or this process's rank of one process per GPU). Communicator holds it through shared_ptr.
class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(const std::vector<int>& devices, const CommConfig& config);
  /// Multi-process: this process is rank boot.rank() of boot.size(), on `device` (collective over boot;
  /// the bootstrap is not used after the constructor returns).
  Engine(Bootstrap& boot, int device, const CommConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int size() const noexcept { return static_cast<int>(ranks_.size()); }
  const RankResources& rank(int r) const { return ranks_[r]; }
  const Topology& topology() const noexcept { return topology_; }
  /// Where topology() came from ("preset h200x2 (NVML: 18 NVLinks per GPU, through a switch)").
  const std::string& topologySource() const noexcept { return topologySource_; }
  const std::string& profileSource() const noexcept { return profileSource_; }
  /// The proxy's transport between nodes ("" on one node).
  std::string interNodeTransport() const;
  uint32_t workers() const noexcept { return workers_; }
  /// True for one process per GPU (only rank ownRank() lives here).
  bool multiProcess() const noexcept { return link_ != nullptr; }
  /// Ranks q and r share a node (NVLink and CUDA IPC reach; otherwise the proxy).
  bool sameNode(int q, int r) const { return nodeOf_[static_cast<size_t>(q)] == nodeOf_[static_cast<size_t>(r)]; }
  uint32_t nodeCount() const;
  uint32_t nodeSize(uint32_t node) const;
  /// Bit q set for every rank q on rank r's node.
  uint32_t localMask(int r) const;
  bool multiNode() const { return nodeCount() > 1; }
  int ownRank() const noexcept { return me_; }

  /// Submit one rank's part of a collective (see Communicator; submit.cpp).
  void submitCollective(int r, const CollectiveSpec& spec, std::optional<Algorithm> algo, const GenOptions& gen,
                        const void* send, void* recv, cudaStream_t stream);
  /// Submit one rank's part of a custom schedule, every Input buffer bound to `input` and every Output / InOut one
  /// to `output` (submit.cpp).
  void submitSchedule(int r, const Schedule& s, const void* input, void* output, cudaStream_t stream);
  /// Throws Error(Unsupported) when rank r's ops cannot be captured into a CUDA graph at all (several nodes). Every
  /// Communicator entry point calls it first when its stream is capturing (CaptureScope).
  void requireCapturable(int r) const;
  /// GraphExec::launch: each record's launch gets its op numbers and its ops are submitted, as if called now
  /// (capture.cpp). Throws what a submission throws.
  void launchCaptured(const std::vector<CaptureRecord*>& recs);
  /// GraphExec::launch when cudaGraphLaunch failed: the ops given numbers will never run; the engine is unusable.
  void failLaunch(const std::string& message);
  /// groupEnd inside a capture: the completion wait for captured op `index` of `rec` on `stream`.
  void enqueueCapturedWait(const CaptureRecord& rec, uint32_t index, cudaStream_t stream);
  /// execute() with the schedule's Input buffers bound, in declaration order, to `inputs` and its Output / InOut ones
  /// to `outputs` (a list shorter than the buffers of its kind repeats its last entry; fused.cpp).
  void submitScheduleBound(int r, const Schedule& s, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs, cudaStream_t stream);
  /// A fused op (fused.cpp): plan (cached), generate, lower and upload once per FusedKey, bind a, b and c.
  void submitFused(int r, const FusedSpec& spec, const FusedOptions& opt, const void* a, const void* b, void* c,
                   cudaStream_t stream);
  /// What submitFused decides for (spec, opt) on this communicator (cached; fused.cpp).
  FusedPlan fusedPlan(const FusedSpec& spec, const FusedOptions& opt);

  /// The "auto" choice (algorithm_choice.cpp).
  Algorithm chooseAlgorithm(CollOp op, uint64_t count, DType dtype);
  /// The chunks and channels an op gets when the caller leaves them 0 (algorithm_choice.cpp).
  GenOptions chooseGenOptions(CollOp op, uint64_t count, DType dtype, Algorithm algo) const;

  /// Host-side wait for rank r's submitted ops (handoff.cpp).
  void synchronize(int r);
  /// How many ops rank r has submitted (the next op's number; handoff.cpp).
  uint64_t submitted(int r);
  /// Rank r's timestamps of op `op` (timing.cpp).
  OpTiming opTiming(int r, uint64_t op);
  /// The offset between the host clock and rank r's GPU clock, best of `rounds` pings (timing.cpp).
  ClockSync calibrateClock(int r, int rounds);
  /// Rank r's per-step trace records not returned before (timing.cpp).
  std::vector<TraceEvent> takeTrace(int r);
  /// Enqueue the completion wait for op `seq` (0-based) of rank r on `stream` (groupEnd uses it; handoff.cpp).
  void enqueueWait(int r, cudaStream_t stream, uint32_t seq);

 private:
  // ---- setup.cpp: configuration, allocations, the resident kernels' launch
  static void checkConfig(const CommConfig& config);
  /// Worker CTAs for `dev` shared by `sharers` ranks (CommConfig::shareGpus), after checking that every sharer's
  /// grid can be co-resident at once.
  uint32_t workersFor(int dev, uint32_t sharers = 1) const;
  void allocRank(int r, int dev);
  void allocHostBlocks(size_t nRanks);
  void launchKernels();

  // ---- peers.cpp: which GPUs the ranks use, how they reach each other, the topology
  void init(const std::vector<int>& devices);
  void initProcess(Bootstrap& boot, int device);
  /// Fill topology_ (a preset or "N GPUs like GPU 0") with the NVLink probes; sets topologySource_.
  void refineTopology(const std::vector<NvlinkProbe>& probes, int major);

  // ---- teardown.cpp
  void shutdown() noexcept;
  void releaseMemory() noexcept;

  // ---- failures.cpp
  /// Throws the first failure (poisoned communicator or a device-side abort).
  void throwIfFailedLocked(bool deep = false);
  [[noreturn]] void poisonAndThrow(ErrorCode code, const std::string& message);
  /// Record the first failure and stop the engine's kernels, without throwing.
  void poisonLocked(ErrorCode code, const std::string& message) noexcept;
  std::string describeDeviceFailure() const;
  /// " (the process of rank q (pid p) has exited: ...)" for peers of this node found gone, else "".
  std::string goneNote() const;
  /// " (a graph ... was replayed by cudaGraphLaunch ...)" when a captured graph's first node stopped the context for
  /// a replay the host never authorised (capture.cpp), else "".
  std::string graphMisuseNote() const;
  uint32_t fetched(int r) const;
  uint32_t completed(int r) const;

  // ---- algorithm_choice.cpp
  Algorithm chooseAlgorithmLocked(CollOp op, uint64_t count, DType dtype);

  // ---- schedule_cache.cpp: lowered schedules, scratch and staging memory
  CachedSchedule& cacheLocked(const ScheduleKey& key, const std::function<Schedule()>& make, const std::string& what);
  void ensureScratchLocked(uint64_t bytes);
  void* stagingLocked(int r, uint32_t seq, uint64_t bytes);

  // ---- nodes.cpp: where ranks are and what that allows
  /// Throws Error(Unsupported) unless the generators' node-major layout of equal nodes is this communicator's.
  void requireCollectiveLayout() const;
  /// Throws Error(InvalidArgument) unless `s` places its ranks on nodes as this communicator does (node ids may be
  /// numbered differently, the grouping must be the same).
  void requireSameNodes(const Schedule& s) const;

  // ---- capture.cpp: ops captured into CUDA graphs (mk/graph.hpp, engine/capture.hpp)
  /// Rank r's op captured on `stream` instead of submitted: its hand-off nodes go into the caller's graph (the
  /// record's first node before its first op) and its arguments into the record, for every launch.
  void captureLocked(int r, const CapturedOp& op, cudaStream_t stream);
  /// Most captures one engine keeps (its host-mapped GraphCells block and each rank's device bases).
  static constexpr uint32_t kMaxCaptures = 1024;
  std::vector<std::shared_ptr<CaptureRecord>> captures_;  ///< every record (their cells and bases are the engine's)
  std::map<std::pair<int, unsigned long long>, CaptureRecord*> openCaptures_;  ///< (rank, capture id) -> record
  device::GraphCells* graphCells_ = nullptr;                                   ///< [kMaxCaptures], host-mapped

  // ---- submit.cpp
  /// Rank r's call of op `key` (lowered as `sched`) on `stream`: captured, or given the next op number and handed
  /// off. `bind` (optional): this rank's per-buffer addresses (PendingOp::bind); `extraReads` / `extraWrites`: user
  /// byte ranges it touches besides send / recv (the fence rule).
  void submitLocked(int r, const ScheduleKey& key, CachedSchedule& sched, const void* send, void* recv,
                    uint64_t inBytes, uint64_t outBytes, cudaStream_t stream, const std::vector<uint64_t>& bind = {},
                    const std::vector<std::pair<uintptr_t, uintptr_t>>& extraReads = {},
                    const std::vector<std::pair<uintptr_t, uintptr_t>>& extraWrites = {});
  /// Bind `cs` (already cached as `key`) on rank r to per-buffer addresses and submit it (fused.cpp).
  void submitBoundLocked(int r, const ScheduleKey& key, CachedSchedule& cs, const std::vector<uint64_t>& bind,
                         cudaStream_t stream);
  /// fusedPlan with mu_ held (fused.cpp).
  FusedPlan fusedPlanLocked(const FusedSpec& spec, const FusedOptions& opt);
  /// Block (bounded) until rank r's doorbell and descriptor slot for op `seq` are free (back-pressure).
  void waitRingSpaceLocked(int r, uint32_t seq);
  /// Op `seq` as rank r's call joins it: the pending op (created for the first rank), or Error(InvalidArgument)
  /// naming both calls when the ranks submitted different ops.
  PendingOp& pendingOpLocked(int r, uint32_t seq, const ScheduleKey& key, CachedSchedule& sched);
  /// Rank r's part of op `seq` recorded (bound input and output, user ranges, bindings); once every local rank
  /// called, the descriptor is written (one process) or posted (one process per GPU).
  void recordCallLocked(int r, uint32_t seq, PendingOp& op, const void* boundInput, const void* send, void* recv,
                        uint64_t inBytes, uint64_t outBytes, const std::vector<uint64_t>& bind,
                        const std::vector<std::pair<uintptr_t, uintptr_t>>& extraReads,
                        const std::vector<std::pair<uintptr_t, uintptr_t>>& extraWrites);

  // ---- finalize.cpp: an op's descriptor
  /// Write op `seq`'s descriptor: per rank, where its input, output and scratch (slot base) are; `bind` (per rank,
  /// per buffer, may be empty) overrides the binding by kind where non-zero (PendingOp::bind).
  void finalizeLocked(uint32_t seq, const CachedSchedule& cs, const std::vector<uint64_t>& input,
                      const std::vector<uint64_t>& output, const std::vector<uint64_t>& scratch, bool fence,
                      const std::vector<std::vector<uint64_t>>& bind = {});
  /// One process: every rank called; the addresses are this process's.
  void finalizeLocalLocked(uint32_t seq, PendingOp& op);
  /// Whether `op` touches user memory the previous op of these ranks touched (and remember op's ranges).
  bool touchesPreviousLocked(PendingOp& op);

  // ---- fault_injection.cpp: tests of the kernel's descriptor checks (engine/fault_injection.hpp)
  /// Corrupt descriptor `d` of op `seq` as injectFault_ says, for rank injectRank_'s entry, and clear it.
  void applyInjectedFaultLocked(device::OpDescriptor& d, uint32_t seq);
  device::DescriptorFault injectFault_{};  ///< 0: none (the only state outside the tests)
  int injectRank_ = 0;                     ///< the rank whose descriptor entry injectFault_ corrupts

  // ---- handoff.cpp: how an op meets the caller's stream
  /// Whether rank r's ops meet their streams through the hand-off kernel (CommConfig::streamHandoff).
  bool useKernelHandoff(int r);
  /// Ring rank r's doorbell for op `seq` on `stream` and, when `wait`, hold the stream until the op completed.
  void handoff(int r, cudaStream_t stream, uint32_t seq, bool wait);

  // ---- progress.cpp: multi-process post board and progress thread
  /// Multi-process: put this rank's part of op `seq` on the post board.
  void postLocked(uint32_t seq, PendingOp& op);
  /// Multi-process: finalize every posted op every rank has posted (in order). Never blocks on a peer.
  void progressLocked();
  /// Poll-loop hook: progressLocked() in multi-process mode, nothing otherwise.
  void pumpLocked();
  /// Multi-process: the progress thread's loop (progressLocked and the peer watch until stopProgress_).
  void progressThread();
  /// Stop and join the progress thread.
  void stopProgressThread() noexcept;
  /// Multi-process: whether it is time to look for dead peer processes (every kPeerWatchMs; the progress thread and
  /// host waits look). peersGoneLocked poisons the engine, naming them, when ProcessLink::goneRanks found any.
  bool peerWatchDueLocked();
  void peersGoneLocked(const std::string& gone);
  /// How often peers are looked for (a /proc read per peer of the node).
  static constexpr int kPeerWatchMs = 20;
  std::chrono::steady_clock::time_point lastPeerWatch_{};  ///< when peers were last looked for
  /// Ranks that have not posted op `seq` yet ("1, 3").
  std::string unpostedRanks(uint32_t seq) const;

  CommConfig config_;
  Topology topology_;
  std::string topologySource_;
  Profile profile_;  ///< what "auto" costs against (CommConfig::profile, else defaultProfile(topology_))
  std::string profileSource_;
  uint32_t workers_ = 0;
  uint32_t ringSlots_ = 0;
  std::vector<RankResources> ranks_;   ///< every rank; only local ones have resources (device >= 0)
  std::vector<int> local_;             ///< ranks driven by this process
  std::vector<uint32_t> nodeOf_;       ///< rank -> node (dense ids in order of each node's first rank)
  int me_ = 0;                         ///< multi-process: this process's rank
  std::unique_ptr<ProcessLink> link_;  ///< multi-process only
  /// Several nodes: the proxy, the transport, the inbox writer and the relay (engine/internode.hpp). It reads the
  /// rank resources and mailboxes directly, and never takes mu_.
  std::unique_ptr<InterNode> interNode_;
  friend class InterNode;
  friend struct TestHooks;
  std::vector<device::RankState*> peerStates_;  ///< every rank's RankState as this process's GPU(s) address it
  std::thread progress_;
  std::atomic<bool> stopProgress_{false};
  std::condition_variable progressCv_;

  // Host-mapped blocks (pinned, portable, mapped; one allocation each).
  device::StatusBlock* status_ = nullptr;
  device::OpDescriptor* ring_ = nullptr;
  device::RankMailbox* mailboxes_ = nullptr;  ///< [nRanks]
  device::TraceRecord* trace_ = nullptr;      ///< [nRanks][traceCapacity]
  std::vector<uint32_t> traceTaken_;          ///< records already returned per rank
  uint32_t* clockPing_ = nullptr;             ///< clock probe mailbox (host-mapped): the host's ping
  uint64_t* clockPong_ = nullptr;             ///< the probe's answer: GPU time and the ping it answers

  std::mutex mu_;
  std::string poison_;  ///< first failure; non-empty = unusable
  ErrorCode poisonCode_ = ErrorCode::Internal;
  std::map<ScheduleKey, std::unique_ptr<CachedSchedule>> cache_;
  std::map<std::tuple<int, uint64_t, int>, Algorithm> autoCache_;  ///< "auto" choices
  std::map<FusedKey, FusedPlan> fusedPlans_;                       ///< planFused per requested (spec, options)
  std::map<uint32_t, PendingOp> pending_;          ///< ops not yet submitted by every rank, by sequence number
  std::vector<const CachedSchedule*> opSchedule_;  ///< [seq % ringSlots]: what each recent op ran
  std::vector<std::pair<uintptr_t, uintptr_t>> prevReads_, prevWrites_;  ///< user ranges of the last finalized op
  uint64_t scratchBytes_ = 0;
};

/// True between groupStart() and groupEnd() on this thread: ops then get no per-op stream wait (handoff.cpp).
bool insideGroup() noexcept;
/// Inside a group: op `seq` of `engine`'s rank `rank` on `stream` gets its completion wait at groupEnd()
/// (the engine must outlive the open group: communicator.hpp, groupEnd). Captured ops: `rec` is their record and
/// `seq` the op's index in it.
void deferGroupWait(Engine* engine, int rank, cudaStream_t stream, uint32_t seq, const CaptureRecord* rec = nullptr);

}  // namespace mk::runtime
