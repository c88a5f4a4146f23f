// mkernel — internal: the engine's submission (engine/engine.hpp maps the parts): a rank's call of a collective, a
// custom schedule or a fused op becomes its part of op `seq` (the "auto" choice, the schedule cache, bound buffers,
// staged input, captured ops); once every rank called, the op's descriptor is written (one process) or posted
// (EngineProgress). Defined by concern in submit.cpp, fused.cpp, finalize.cpp, schedule_cache.cpp, capture.cpp,
// algorithm_choice.cpp, nodes.cpp and fault_injection.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/capture.hpp"
#include "engine/engine_context.hpp"
#include "engine/handoff.hpp"
#include "engine/progress.hpp"
#include "engine/resources.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/communicator.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

class Engine;
class InterNode;

/// The engine's failure rule as its parts use it (the façade keeps the first failure; failures.cpp). Every call
/// under the engine's mutex.
class FailureHost {
 public:
  /// Throws the first failure (poisoned communicator or a device-side abort); `deep`: also asks whether a kernel died.
  virtual void throwIfFailedLocked(bool deep = false) = 0;
  /// Record the first failure, stop the engine's kernels and throw it.
  [[noreturn]] virtual void poisonAndThrow(ErrorCode code, const std::string& message) = 0;

 protected:
  ~FailureHost() = default;
};

/// Worker CTAs of `prog`'s compute lanes and of its other lanes (schedule_cache.cpp).
void countLaneCtas(const LoweredProgram& prog, uint32_t* compute, uint32_t* other);

/// The caller's buffers of one moe-ffn call (Communicator::moeFfn says what each holds).
struct MoeFfnBuffers {
  const void* ids = nullptr;
  const void* x = nullptr;
  const void* w1 = nullptr;
  const void* weights = nullptr;
  const void* w2 = nullptr;
  void* y = nullptr;
};

/// Op submission of an engine's ranks: it owns the schedule cache, the "auto" and fused plans, the ops not yet
/// submitted by every rank, the descriptor ring's writer and the captures. Every call takes or holds the engine's
/// mutex, except enqueueCapturedWait (groupEnd; the record it reads is only appended to).
class EngineSubmission {
 public:
  /// `engine`: the façade, as the handle of group waits, capture records and compute-lane binders.
  EngineSubmission(EngineContext& ctx, Engine& engine, EngineHandoff& handoff, EngineProgress& progress,
                   FailureHost& failures, const std::unique_ptr<InterNode>& interNode)
      : ctx_(ctx),
        engine_(engine),
        handoff_(handoff),
        progress_(progress),
        failures_(failures),
        interNode_(interNode) {}
  EngineSubmission(const EngineSubmission&) = delete;
  EngineSubmission& operator=(const EngineSubmission&) = delete;

  /// Most captures one engine keeps (its host-mapped GraphCells block and each rank's device bases).
  static constexpr uint32_t kMaxCaptures = 1024;

  /// The descriptor ring's schedule table and the captures' host-mapped cells, before the kernels start.
  void allocate();
  /// Release the lowered programs of ranks whose kernel stopped (teardown; before the arenas go).
  void releasePrograms() noexcept;
  /// Free the captures' cells; only once no kernel runs.
  void releaseHostBlocks() noexcept;

  // ---- the calls of Communicator (through the façade; each takes the engine's mutex)
  /// Submit one rank's part of a collective (submit.cpp).
  void submitCollective(int r, const CollectiveSpec& spec, std::optional<Algorithm> algo, const GenOptions& gen,
                        const void* send, void* recv, cudaStream_t stream);
  /// Submit one rank's part of a custom schedule, every Input buffer bound to `input` and every Output / InOut one
  /// to `output` (submit.cpp).
  void submitSchedule(int r, const Schedule& s, const void* input, void* output, cudaStream_t stream);
  /// execute() with the schedule's Input buffers bound, in declaration order, to `inputs` and its Output / InOut ones
  /// to `outputs` (a list shorter than the buffers of its kind repeats its last entry; fused.cpp). `extentWords` (may
  /// be null): this rank's runtime extent values, bound per op after the buffers (bind[nBuffers]; finalize.cpp).
  void submitScheduleBound(int r, const Schedule& s, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs, cudaStream_t stream, const uint64_t* extentWords);
  /// A fused op (fused.cpp): plan (cached), generate, lower and upload once per FusedKey, bind a, b and c.
  void submitFused(int r, const FusedSpec& spec, const FusedOptions& opt, const void* a, const void* b, void* c,
                   cudaStream_t stream);
  /// What submitFused decides for (spec, opt) on this communicator (cached; fused.cpp).
  FusedPlan fusedPlan(const FusedSpec& spec, const FusedOptions& opt);
  /// Ring attention (ring_attention.cpp): generate, lower and upload once per spec, bind q, kv and out.
  /// Communicator::ringAttentionPlan (ring_attention.cpp).
  RingAttentionPlan ringAttentionPlan(int r, const RingAttentionSpec& spec);
  void submitRingAttention(int r, const RingAttentionSpec& spec, const void* q, const void* kv, float* out,
                           cudaStream_t stream);
  /// moe-ffn (moe.cpp): generate, lower and upload once per spec, bind the caller's buffers by name.
  void submitMoeFfn(int r, const MoeFfnSpec& spec, const MoeFfnBuffers& io, cudaStream_t stream);
  /// Communicator::moeFfnPlan (moe.cpp).
  MoeFfnPlan moeFfnPlan(int r, const MoeFfnSpec& spec);
  /// The "auto" choice (algorithm_choice.cpp).
  Algorithm chooseAlgorithm(CollOp op, uint64_t count, DType dtype);
  /// The chunks and channels an op gets when the caller leaves them 0 (algorithm_choice.cpp).
  GenOptions chooseGenOptions(CollOp op, uint64_t count, DType dtype, Algorithm algo) const;
  /// Throws Error(Unsupported) when rank r's ops cannot be captured into a CUDA graph at all (several nodes).
  void requireCapturable(int r) const;
  /// GraphExec::launch: each record's launch gets its op numbers and its ops are submitted, as if called now
  /// (capture.cpp). Throws what a submission throws.
  void launchCaptured(const std::vector<CaptureRecord*>& recs);
  /// groupEnd inside a capture: the completion wait for captured op `index` of `rec` on `stream`.
  void enqueueCapturedWait(const CaptureRecord& rec, uint32_t index, cudaStream_t stream);
  /// Tests only (TestHooks): corrupt the next descriptor for rank `rank`'s entry (fault_injection.cpp).
  void injectDescriptorFault(int rank, device::DescriptorFault fault);

  // ---- what the façade and EngineProgress read (engine's mutex held)
  /// Ops not yet submitted by every rank, by sequence number.
  std::map<uint32_t, PendingOp>& pendingOps() { return pending_; }
  /// What op `op` ran (the ring slot's schedule; null before the slot's first op).
  const CachedSchedule* scheduleOf(uint32_t op) const { return opSchedule_[op % ctx_.ringSlots]; }
  /// Write op `seq`'s descriptor: per rank, where its input, output and scratch (slot base) are; `bind` (per rank,
  /// per buffer, may be empty) overrides the binding by kind where non-zero (PendingOp::bind; finalize.cpp).
  void finalizeLocked(uint32_t seq, const CachedSchedule& cs, const std::vector<uint64_t>& input,
                      const std::vector<uint64_t>& output, const std::vector<uint64_t>& scratch, bool fence,
                      const std::vector<std::vector<uint64_t>>& bind = {});
  /// Whether `op` touches user memory the previous op of these ranks touched (and remember op's ranges).
  bool touchesPreviousLocked(PendingOp& op);
  /// " (a graph ... was replayed by cudaGraphLaunch ...)" when a captured graph's first node stopped the context for
  /// a replay the host never authorised (capture.cpp), else "".
  std::string graphMisuseNote() const;

 private:
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
  /// The cached schedule of a generated op (ring attention, moe-ffn) whose spec reads `what` (the op's name first),
  /// made by `make` on first use: validated (the shape we rely on; the generators' tests prove race freedom) and keyed
  /// by its packed image (schedule_cache.cpp).
  CachedSchedule& specScheduleLocked(const std::string& what, const std::function<Schedule()>& make, ScheduleKey* key);
  /// Bind the buffers of `cs` named in `named` to the caller's addresses on rank r (the rest: scratch) and submit it;
  /// Error(Internal) if the schedule lacks one of the names (schedule_cache.cpp).
  void submitNamedLocked(int r, const ScheduleKey& key, CachedSchedule& cs,
                         const std::vector<std::pair<const char*, const void*>>& named, cudaStream_t stream);
  /// The cached moe-ffn schedule of `spec` (moe.cpp), generated on first use.
  CachedSchedule& moeScheduleLocked(const MoeFfnSpec& spec, ScheduleKey* key);
  /// The cached schedule of a ring-attention spec as planned (ring_attention.cpp), generated on first use.
  CachedSchedule& ringScheduleLocked(const RingAttentionSpec& planned, ScheduleKey* key);
  /// fusedPlan with the mutex held (fused.cpp).
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
  /// One process: every rank called; the addresses are this process's.
  void finalizeLocalLocked(uint32_t seq, PendingOp& op);

  // ---- fault_injection.cpp: tests of the kernel's descriptor checks (engine/fault_injection.hpp)
  /// Corrupt descriptor `d` of op `seq` as injectFault_ says, for rank injectRank_'s entry, and clear it.
  void applyInjectedFaultLocked(device::OpDescriptor& d, uint32_t seq);

  EngineContext& ctx_;
  Engine& engine_;
  EngineHandoff& handoff_;
  EngineProgress& progress_;
  FailureHost& failures_;
  const std::unique_ptr<InterNode>& interNode_;  ///< the façade's (null on one node; set during creation)

  std::map<ScheduleKey, std::unique_ptr<CachedSchedule>> cache_;
  std::map<std::tuple<int, uint64_t, int>, Algorithm> autoCache_;  ///< "auto" choices
  std::map<FusedKey, FusedPlan> fusedPlans_;                       ///< planFused per requested (spec, options)
  std::map<std::string, ScheduleKey> specKeys_;    ///< generated ops (specScheduleLocked): spec text -> its schedule
  std::map<uint32_t, PendingOp> pending_;          ///< ops not yet submitted by every rank, by sequence number
  std::vector<const CachedSchedule*> opSchedule_;  ///< [seq % ringSlots]: what each recent op ran
  std::vector<std::pair<uintptr_t, uintptr_t>> prevReads_, prevWrites_;  ///< user ranges of the last finalized op
  uint64_t scratchBytes_ = 0;
  std::vector<std::shared_ptr<CaptureRecord>> captures_;  ///< every record (their cells and bases are the engine's)
  std::map<std::pair<int, unsigned long long>, CaptureRecord*> openCaptures_;  ///< (rank, capture id) -> record
  device::GraphCells* graphCells_ = nullptr;                                   ///< [kMaxCaptures], host-mapped
  device::DescriptorFault injectFault_{};  ///< 0: none (the only state outside the tests)
  int injectRank_ = 0;                     ///< the rank whose descriptor entry injectFault_ corrupts
};

/// What Communicator::ringAttention refuses before anything runs (ring_attention.cpp): the spec on `nRanks` ranks
/// (validateRingAttentionSpec), a communicator without compute lanes (Unsupported), blocks the attention engine
/// cannot run (head dim, dtype: InvalidArgument naming it).
void checkRingAttentionCall(const RingAttentionSpec& spec, uint32_t nRanks, bool computeLanes);

/// What Communicator::moeFfn refuses before anything runs (moe.cpp): the spec on the ranks nodeOf places
/// (validateMoeFfnSpec: InvalidArgument naming the field), a communicator without compute lanes or ranks on more than
/// one node (Unsupported, saying what runs it instead).
void checkMoeFfnCall(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf, bool computeLanes);

}  // namespace mk::runtime
