// mkernel — internal: the engine, the state the ranks of a communicator share, in one process or one per GPU.
//
// Both modes run the same code (lowering, submission, gating, failures); they differ only in where a
// peer's addresses come from:
//  * one process (createLocal): every rank lives here; peer access makes peers' RankState, scratch and
//    user buffers plain pointers; an op's descriptor is written when the last local rank submitted it.
//  * one process per GPU (create / createFromEnvironment): ranks[me] is the only local rank; a
//    ProcessLink shares the status block and a post board in POSIX shared memory; peers' memory arrives as
//    CUDA IPC handles (RankState once at creation, buffers of each op through the post board). Op k's
//    descriptor is written by whichever of this rank's submit call or the progress thread first sees
//    every rank's post of op k (a submit never waits for a peer, except ring back-pressure).
//
// Engine is a façade over owned parts (docs/gpu-engine.md, "The engine's parts"), each with its own state and a
// reference to what it reads, given at construction:
//  * EngineContext (engine_context.hpp): what creation establishes (config, topology, ranks, nodes, the
//    host-mapped blocks) and the one mutex;
//  * EngineSubmission (submission.hpp): calls -> pending ops -> descriptors, the schedule cache, captures;
//  * EngineHandoff (handoff.hpp): the doorbell and the completion wait on the caller's stream;
//  * EngineProgress (progress.hpp): one process per GPU, the post board, the progress thread, the peer watch;
//  * InterNode (internode.hpp): several nodes, the proxy, the transport, the inbox and the relay;
//  * EngineTiming (timing.hpp): timestamps, clock calibration, traces.
// The façade itself keeps creation (setup.cpp, peers.cpp), teardown (teardown.cpp), the first failure
// (failures.cpp) and the host wait (handoff.cpp, synchronize).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/topology_probe.hpp"
#include "engine/capture.hpp"
#include "engine/engine_context.hpp"
#include "engine/handoff.hpp"
#include "engine/progress.hpp"
#include "engine/resources.hpp"
#include "engine/submission.hpp"
#include "engine/timing.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

class InterNode;

/// The engine of one communicator: resources, resident kernels and op submission of its ranks (every rank in
/// one process, or this process's rank of one process per GPU). Communicator holds it through shared_ptr.
class Engine final : public std::enable_shared_from_this<Engine>, private ProgressHost, private FailureHost {
 public:
  Engine(const std::vector<int>& devices, const CommConfig& config);
  /// Multi-process: this process is rank boot.rank() of boot.size(), on `device` (collective over boot;
  /// the bootstrap is not used after the constructor returns).
  Engine(Bootstrap& boot, int device, const CommConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int size() const noexcept { return ctx_.size(); }
  const RankResources& rank(int r) const { return ctx_.ranks[r]; }
  const Topology& topology() const noexcept { return ctx_.topology; }
  /// Where topology() came from ("preset h200x2 (NVML: 18 NVLinks per GPU, through a switch)").
  const std::string& topologySource() const noexcept { return ctx_.topologySource; }
  const std::string& profileSource() const noexcept { return ctx_.profileSource; }
  /// The proxy's transport between nodes ("" on one node).
  std::string interNodeTransport() const;
  uint32_t workers() const noexcept { return ctx_.workers; }
  /// Whether the kernel is the compute-capable one (CommConfig::computeLanes).
  bool computeLanes() const noexcept { return ctx_.config.computeLanes; }
  /// True for one process per GPU (only rank ownRank() lives here).
  bool multiProcess() const noexcept { return ctx_.link != nullptr; }
  /// Ranks q and r share a node (EngineContext::sameNode).
  bool sameNode(int q, int r) const { return ctx_.sameNode(q, r); }
  bool multiNode() const { return ctx_.multiNode(); }
  int ownRank() const noexcept { return ctx_.me; }

  // ---- submission (EngineSubmission)
  /// Submit one rank's part of a collective (see Communicator).
  void submitCollective(int r, const CollectiveSpec& spec, std::optional<Algorithm> algo, const GenOptions& gen,
                        const void* send, void* recv, cudaStream_t stream) {
    submission_.submitCollective(r, spec, algo, gen, send, recv, stream);
  }
  /// Submit one rank's part of a custom schedule, every Input buffer bound to `input` and every Output / InOut one
  /// to `output`.
  void submitSchedule(int r, const Schedule& s, const void* input, void* output, cudaStream_t stream) {
    submission_.submitSchedule(r, s, input, output, stream);
  }
  /// execute() with the schedule's Input buffers bound, in declaration order, to `inputs` and its Output / InOut ones
  /// to `outputs` (a list shorter than the buffers of its kind repeats its last entry).
  void submitScheduleBound(int r, const Schedule& s, const std::vector<const void*>& inputs,
                           const std::vector<void*>& outputs, cudaStream_t stream, const uint64_t* extentWords) {
    submission_.submitScheduleBound(r, s, inputs, outputs, stream, extentWords);
  }
  /// A fused op: plan (cached), generate, lower and upload once per FusedKey, bind a, b and c.
  void submitFused(int r, const FusedSpec& spec, const FusedOptions& opt, const void* a, const void* b, void* c,
                   cudaStream_t stream) {
    submission_.submitFused(r, spec, opt, a, b, c, stream);
  }
  /// Ring attention: generate, lower and upload once per spec, bind q, kv and out (ring_attention.cpp).
  RingAttentionPlan ringAttentionPlan(int r, const RingAttentionSpec& spec) {
    return submission_.ringAttentionPlan(r, spec);
  }
  void submitRingAttention(int r, const RingAttentionSpec& spec, const void* q, const void* kv, float* out,
                           cudaStream_t stream) {
    submission_.submitRingAttention(r, spec, q, kv, out, stream);
  }
  /// moe-ffn: generate, lower and upload once per spec, bind the caller's buffers (moe.cpp).
  void submitMoeFfn(int r, const MoeFfnSpec& spec, const MoeFfnBuffers& io, cudaStream_t stream) {
    submission_.submitMoeFfn(r, spec, io, stream);
  }
  MoeFfnPlan moeFfnPlan(int r, const MoeFfnSpec& spec) { return submission_.moeFfnPlan(r, spec); }
  /// What submitFused decides for (spec, opt) on this communicator (cached).
  FusedPlan fusedPlan(const FusedSpec& spec, const FusedOptions& opt) { return submission_.fusedPlan(spec, opt); }
  /// The "auto" choice.
  Algorithm chooseAlgorithm(CollOp op, uint64_t count, DType dtype) {
    return submission_.chooseAlgorithm(op, count, dtype);
  }
  /// The chunks and channels an op gets when the caller leaves them 0.
  GenOptions chooseGenOptions(CollOp op, uint64_t count, DType dtype, Algorithm algo) const {
    return submission_.chooseGenOptions(op, count, dtype, algo);
  }
  /// Throws Error(Unsupported) when rank r's ops cannot be captured into a CUDA graph at all (several nodes). Every
  /// Communicator entry point calls it first when its stream is capturing (CaptureScope).
  void requireCapturable(int r) const { submission_.requireCapturable(r); }
  /// GraphExec::launch: each record's launch gets its op numbers and its ops are submitted, as if called now.
  /// Throws what a submission throws.
  void launchCaptured(const std::vector<CaptureRecord*>& recs) { submission_.launchCaptured(recs); }
  /// groupEnd inside a capture: the completion wait for captured op `index` of `rec` on `stream`.
  void enqueueCapturedWait(const CaptureRecord& rec, uint32_t index, cudaStream_t stream) {
    submission_.enqueueCapturedWait(rec, index, stream);
  }
  /// GraphExec::launch when cudaGraphLaunch failed: the ops given numbers will never run; the engine is unusable
  /// (capture.cpp).
  void failLaunch(const std::string& message);
  /// Tests only (TestHooks, engine/fault_injection.hpp): corrupt the next descriptor for rank `rank`'s entry.
  void injectDescriptorFault(int rank, device::DescriptorFault fault) {
    submission_.injectDescriptorFault(rank, fault);
  }

  // ---- completion (EngineHandoff; the host wait is the façade's)
  /// Host-side wait for rank r's submitted ops (handoff.cpp).
  void synchronize(int r);
  /// How many ops rank r has submitted (the next op's number; handoff.cpp).
  uint64_t submitted(int r);
  /// Enqueue the completion wait for op `seq` (0-based) of rank r on `stream` (groupEnd uses it).
  void enqueueWait(int r, cudaStream_t stream, uint32_t seq) { handoff_.enqueueWait(r, stream, seq); }

  // ---- observations (EngineTiming)
  /// Rank r's timestamps of op `op`.
  OpTiming opTiming(int r, uint64_t op) { return timing_.opTiming(r, op); }
  /// The offset between the host clock and rank r's GPU clock, best of `rounds` pings.
  ClockSync calibrateClock(int r, int rounds) { return timing_.calibrateClock(r, rounds); }
  /// Rank r's per-step trace records not returned before.
  std::vector<TraceEvent> takeTrace(int r) { return timing_.takeTrace(r); }

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
  /// Fill ctx_.topology (a preset or "N GPUs like GPU 0") with the NVLink probes; sets ctx_.topologySource.
  void refineTopology(const std::vector<NvlinkProbe>& probes, int major);

  // ---- teardown.cpp
  void shutdown() noexcept;
  void releaseMemory() noexcept;

  // ---- failures.cpp (FailureHost)
  /// Throws the first failure (poisoned communicator or a device-side abort).
  void throwIfFailedLocked(bool deep = false) override;
  [[noreturn]] void poisonAndThrow(ErrorCode code, const std::string& message) override;
  /// Record the first failure and stop the engine's kernels, without throwing.
  void poisonLocked(ErrorCode code, const std::string& message) noexcept;
  std::string describeDeviceFailure() const;
  /// " (the process of rank q (pid p) has exited: ...)" for peers of this node found gone, else "".
  std::string goneNote() const;

  // ---- ProgressHost (what EngineProgress asks of the engine)
  std::map<uint32_t, PendingOp>& pendingOps() override { return submission_.pendingOps(); }
  void finalize(uint32_t seq, const CachedSchedule& cs, const std::vector<uint64_t>& input,
                const std::vector<uint64_t>& output, const std::vector<uint64_t>& scratch, bool fence,
                const std::vector<std::vector<uint64_t>>& bind) override {
    submission_.finalizeLocked(seq, cs, input, output, scratch, fence, bind);
  }
  bool touchesPrevious(PendingOp& op) override { return submission_.touchesPreviousLocked(op); }
  bool poisoned() const override { return !poison_.empty(); }
  void poison(ErrorCode code, const std::string& message) noexcept override { poisonLocked(code, message); }

  EngineContext ctx_;  ///< what creation establishes; every part reads it (engine/engine_context.hpp)
  /// Several nodes: the proxy, the transport, the inbox writer and the relay (engine/internode.hpp). It reads the
  /// rank resources and mailboxes of ctx_ directly, and never takes ctx_.mu.
  std::unique_ptr<InterNode> interNode_;
  EngineTiming timing_{ctx_};
  EngineHandoff handoff_{ctx_};
  EngineProgress progress_{ctx_, *this};
  EngineSubmission submission_{ctx_, *this, handoff_, progress_, *this, interNode_};
  std::string poison_;  ///< first failure; non-empty = unusable
  ErrorCode poisonCode_ = ErrorCode::Internal;
};

/// True between groupStart() and groupEnd() on this thread: ops then get no per-op stream wait (handoff.cpp).
bool insideGroup() noexcept;
/// Inside a group: op `seq` of `engine`'s rank `rank` on `stream` gets its completion wait at groupEnd()
/// (the engine must outlive the open group: communicator.hpp, groupEnd). Captured ops: `rec` is their record and
/// `seq` the op's index in it.
void deferGroupWait(Engine* engine, int rank, cudaStream_t stream, uint32_t seq, const CaptureRecord* rec = nullptr);

}  // namespace mk::runtime
