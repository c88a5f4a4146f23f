// mkernel — the GPU engine's host API: a communicator per rank, collectives and any schedule through one
// resident kernel per GPU.
//
// Two modes, one engine. One process drives several GPUs of one node (Communicator::createLocal): every
// rank is a Communicator; like NCCL in that mode, an op is submitted by calling it on every rank (from one
// thread, or one thread per rank). Or one process per GPU (Communicator::createFromEnvironment under
// torchrun / mpirun, or Communicator::create with any mk::Bootstrap): each process holds one rank; peers'
// memory is mapped through CUDA IPC (docs/gpu-engine.md, "One process per GPU"). Either way an op starts
// on a GPU once that rank's stream reaches it.
//
// Stream semantics: a call returns once the op is enqueued. The op starts when `stream` reaches it (the
// doorbell is rung from the stream: CommConfig::streamHandoff). Outside a group the call also makes `stream`
// wait until the op is complete for this rank — done on every rank, or done here when no other rank's step
// touches this rank's buffers (one-shot) — so later work on `stream` sees the result and may reuse the
// buffers. Inside groupStart() / groupEnd() only the last op per (communicator, stream) gets that wait, at
// groupEnd(): back-to-back ops then run without a host or stream round trip between them
// (docs/gpu-engine.md, "Submission" and "Latency").
//
// While a communicator is alive its GPUs run a resident kernel: cudaDeviceSynchronize() and cudaFree()
// on those devices would wait for it forever. Use stream or event synchronisation, and
// cudaFreeAsync / free memory after the communicator is gone.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// How an op meets the caller's stream (docs/gpu-engine.md, "Latency").
enum class StreamHandoff : uint8_t {
  /// Kernel when the resident kernel leaves an SM with room for one more block, MemOps otherwise; always
  /// MemOps under compute-sanitizer (which runs one kernel at a time; Kernel is refused there).
  Auto = 0,
  /// One 32-thread kernel per op on the caller's stream rings the doorbell and holds the stream until the op
  /// completes (inside a group: a memory write rings, one such kernel waits at groupEnd). About 2.3 us per
  /// op on the stream; costs a kernel launch on the host (about 4 us on the measured machine).
  Kernel = 1,
  /// A stream memory write rings and a stream memory wait holds the stream: cheaper on the host (two ~1.3 us
  /// calls) but 7-9 us per op on the stream once the op takes longer than ~2 us (the front end deschedules
  /// the wait). Never needs an SM.
  MemOps = 2,
};

/// The proxy's transport between nodes (CommConfig::transport).
enum class ProxyTransport : uint8_t { Auto, Socket, IbVerbs };

/// Runtime knobs of a communicator (one typed struct; no environment variables).
struct CommConfig {
  uint32_t workerCtas = 0;              ///< worker CTAs of the resident kernel per GPU; 0 = min(64, SMs / 2)
  uint32_t threadsPerCta = 512;         ///< 64..512, a multiple of 32 (the control block runs two warps)
  uint32_t ringSlots = 64;              ///< doorbell ring depth: ops in flight before a submit blocks (back-pressure)
  double pollBudgetMs = 10000;          ///< budget of every device-side wait; past it the kernel reports and stops
  double hostBudgetMs = 20000;          ///< budget of host-side waits (ring full, synchronize, start, shutdown)
  bool trace = false;                   ///< record start/end of every step (takeTrace); off costs nothing
  uint32_t traceCapacity = 1u << 20;    ///< trace records kept per rank
  uint64_t minBytesPerCta = 32 * 1024;  ///< a data step uses one more CTA of its lane per this many bytes
  /// How ops meet the caller's stream.
  StreamHandoff streamHandoff = StreamHandoff::Auto;
  /// Device memory reserved per GPU at creation, before the resident kernel starts, for everything the engine
  /// allocates later (lowered programs, scratch and staging arenas, compute-lane parameter blocks); an op that
  /// needs more than is left is refused with Error(InvalidArgument) naming the setting. 0 (the default) =
  /// cudaMalloc at first use. Set it to run under compute-sanitizer memcheck, which checks a running kernel
  /// only against the allocations older than it (user buffers then have to be allocated before creation too),
  /// or to keep cudaMalloc off the submission path.
  uint64_t deviceArenaBytes = 0;
  /// Multi-process mode: device allocations of this rank (cudaMalloc'd pointers, at most kMaxPremapped) that
  /// every peer maps at creation, before the resident kernels start. Ops on memory inside them then skip the
  /// IPC mapping at first use, and compute-sanitizer memcheck can check peers' accesses to them (it knows only
  /// mappings older than a running kernel). Each rank lists its own; ignored in one process (peer access
  /// covers all memory there). Empty (the default): every buffer is mapped when an op first names it.
  std::vector<const void*> premappedBuffers;
  static constexpr size_t kMaxPremapped = 16;
  /// Hardware profile (mkernel.profile.v1 file, e.g. from mk-calibrate) the "auto" algorithm choice costs
  /// against; empty = the datasheet defaults of the detected topology. Every rank must name the same file
  /// (ranks that choose differently are refused as mismatched ops).
  std::string profile;
  /// Compute lanes (docs/gpu-engine.md, "Compute lanes"): run the compute-capable resident kernel, whose
  /// CTAs can run Gemm steps (the Hopper tile engine) between communication steps, so execute() accepts
  /// schedules with Gemm steps. Each CTA then has 384 threads (threadsPerCta must be 384 or the default 512,
  /// which becomes 384) and ~226 KiB of shared memory, so it owns a whole SM; workerCtas = 0 means SMs - 4
  /// workers (+ the control block: 3 SMs stay free for the caller's kernels, since any kernel the caller's
  /// streams wait for needs an SM while the resident kernel runs). Every rank must use the same value.
  /// Off (the default): the communication-only kernel, unchanged, and Gemm steps are refused.
  bool computeLanes = false;
  /// Nodes (multi-process mode): ranks on one host form one node — they reach each other over NVLink and CUDA
  /// IPC — and ranks on different hosts reach each other through the proxy (ProxyPut steps). ranksPerNode = N > 0
  /// splits each host's ranks, in rank order, into nodes of N ranks, so the inter-node path runs on one machine
  /// (each "node" then talks to the others through the proxy over loopback). 0 (the default): one node per host.
  /// Every rank must use the same value.
  uint32_t ranksPerNode = 0;
  /// How the proxy reaches other nodes: Socket (TCP; any hosts, no RDMA NIC needed), IbVerbs (rdma-core RC queue
  /// pairs; needs an RDMA device), or Auto (IbVerbs when a device exists, else Socket). Unused on one node.
  ProxyTransport transport = ProxyTransport::Auto;
  /// Slots of each rank's command FIFO (a power of two; a full FIFO back-pressures the pushing lane) and of its
  /// inbox of what arrives from other nodes. Unused on one node.
  uint32_t proxyFifoSlots = 1024;
  uint32_t inboxSlots = 4096;
  /// Bytes a rank holds in host memory for puts that arrive from other nodes before it submitted their op (the
  /// receiver keeps reading its connections, so notices behind them are not held up); past it the op fails.
  uint64_t proxyParkBytes = uint64_t{1} << 30;
  /// The bytes of a ProxyPut travel in chunks of proxyChunkBytes (a multiple of 256) through host memory the GPU
  /// writes and reads itself: proxyStagingSlots chunks per rank to send (at most proxyFifoSlots), proxyReceiveBytes
  /// to receive (at least one chunk).
  uint64_t proxyChunkBytes = uint64_t{1} << 20;
  uint32_t proxyStagingSlots = 16;
  uint64_t proxyReceiveBytes = uint64_t{64} << 20;
  /// Let several ranks use one GPU (one process with createLocal({0, 0, ...}), or one process per rank under CUDA
  /// MPS): each rank's resident kernel then takes its share of the SMs (workerCtas = 0 divides the default among
  /// the ranks on the GPU), and the engine refuses a grid the GPU cannot hold for all of them at once. Off (the
  /// default): two ranks on one GPU are refused as a launch mistake (LOCAL_RANK, CUDA_VISIBLE_DEVICES).
  bool shareGpus = false;
};

/// How one collective call is generated. A string converts to it ("auto", "ring", ...).
struct CollOptions {
  std::string algo = "auto";  ///< generator name (algorithmsFor(op)) or "auto": lowest closed-form cost
  uint32_t chunks = 0;        ///< GenOptions::chunks; 0 = chosen by size
  uint32_t channels = 0;      ///< GenOptions::channels; 0 = chosen by size
  /// GenOptions::protocol: Protocol::LL sends the puts of one-shot / two-shot all-reduce and direct all-gather as
  /// LL packets (data and flag in the same 16-byte stores, no fence between them; one node). Auto leaves it to the
  /// generator (plain puts today).
  Protocol protocol = Protocol::Auto;
  CollOptions() = default;
  CollOptions(const char* a) : algo(a) {}             // NOLINT: implicit on purpose
  CollOptions(std::string a) : algo(std::move(a)) {}  // NOLINT: implicit on purpose
  CollOptions(Algorithm a) : algo(toString(a)) {}     // NOLINT: implicit on purpose
};

/// GPU-clock timestamps of one op on one rank (%globaltimer, ns).
struct OpTiming {
  uint64_t op = 0;
  uint64_t doorbellNs = 0;   ///< the kernel noticed the doorbell
  uint64_t publishNs = 0;    ///< the op was handed to the worker CTAs
  uint64_t firstStepNs = 0;  ///< lane 0 began its first step
  uint64_t localDoneNs = 0;  ///< every CTA of this rank finished
  uint64_t completeNs = 0;   ///< every rank finished (this rank, for ops complete on local completion)
  uint64_t stagedNs = 0;     ///< the kernel had read the op's descriptor from host memory
  uint64_t rungNs = 0;       ///< the kernel first saw the doorbell (doorbellNs: the later of this and stagedNs)
};

/// Offset between the GPU's %globaltimer and the host's steady clock: gpuNs ~ hostNs + offsetNs.
struct ClockSync {
  double offsetNs = 0;
  double uncertaintyNs = 0;  ///< half the best ping round trip
};

/// One traced step.
struct TraceEvent {
  uint32_t rank = 0, lane = 0, step = 0;
  uint64_t op = 0;
  StepKind kind = StepKind::Copy;
  uint64_t startNs = 0, endNs = 0;  ///< %globaltimer
};

class Bootstrap;

namespace runtime {
class Engine;
struct TestHooks;  // fault injection for the engine's own tests (impl/src/engine/fault_injection.hpp)
}  // namespace runtime

/// What Communicator::ringAttention runs for a spec on a communicator (Communicator::ringAttentionPlan): the spec as
/// generated (scale and the compute lane's weight filled in) and the worker CTAs the calling rank's lowered program
/// gives each lane — what a benchmark records so that the model replays the same split.
struct RingAttentionPlan {
  RingAttentionSpec spec;
  uint32_t workerCtas = 0;   ///< the rank's worker CTAs (Communicator::workerCtas())
  uint32_t computeCtas = 0;  ///< of them, the compute lane's (the attention steps and merges)
  uint32_t sendCtas = 0;     ///< of them, the send lane's (puts inside a node, proxy puts across); the rest idle
};

/// What Communicator::moeFfn runs on the calling rank: the worker CTAs its lowered program gives the compute lane (the
/// grouped GEMMs) and the other lanes (route, dispatch, return, combine) — what a benchmark records.
struct MoeFfnPlan {
  uint32_t workerCtas = 0;   ///< the rank's worker CTAs (Communicator::workerCtas())
  uint32_t computeCtas = 0;  ///< of them, the compute lane's
  uint32_t otherCtas = 0;    ///< of them, every other lane's; the rest idle
};

/// One rank of a communicator: owns nothing alone, shares the engine's resources (RAII: the resident
/// kernels stop and every allocation is freed when the last rank of a communicator is destroyed). Movable, not
/// copyable. Every method throws mk::Error; after a device-side failure (timeout, ...) every call throws
/// that failure's message.
class Communicator {
 public:
  /// One communicator per device in `devices` (rank i on devices[i]), one resident kernel per device.
  /// Throws Error(InvalidArgument) for an empty list, a repeated device or one that does not exist;
  /// Error(Unsupported) when two of them cannot map each other's memory (naming the pair), when more
  /// ranks than the engine drives are asked for, or when the kernel's grid cannot be co-resident.
  static std::vector<Communicator> createLocal(const std::vector<int>& devices, const CommConfig& config = {});
  /// One process per GPU: this process is rank bootstrap.rank() of bootstrap.size(), on `device` (every
  /// rank calls it; collective over the bootstrap, which is not used after create returns). Ranks must
  /// share a node. Peers' memory is mapped through CUDA IPC: user buffers passed to collectives must be
  /// cudaMalloc memory (stream-ordered pool memory is refused with an error). Throws like createLocal,
  /// plus Error(Unsupported) for ranks on different hosts and Error(InvalidArgument) for two ranks on
  /// one GPU or mismatched CommConfig::ringSlots; bootstrap failures name the rank or address at fault.
  static Communicator create(Bootstrap& bootstrap, int device, const CommConfig& config = {});
  /// One process per GPU from the launcher's variables (bootstrapFromEnvironment, mk/bootstrap.hpp). Started
  /// by mpirun without MASTER_ADDR, in a build with MPI (mpiBootstrapBuilt()): the MPI bootstrap, the GPU
  /// being the process's rank on its node. Otherwise torchrun-style variables (readLaunchEnvironment): TCP
  /// rendezvous at MASTER_ADDR:MASTER_PORT, LOCAL_RANK picks the GPU. Budget CommConfig::hostBudgetMs. Throws
  /// Error(InvalidArgument) naming a missing or malformed variable.
  static Communicator createFromEnvironment(const CommConfig& config = {});

  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  int rank() const noexcept { return rank_; }
  /// True when each rank of this communicator is its own process (create / createFromEnvironment).
  bool multiProcess() const noexcept;
  int size() const noexcept;
  int device() const noexcept;
  /// The topology the "auto" choice costs against (detected at creation).
  const Topology& topology() const noexcept;
  /// How topology() was found: the preset or the local GPU model, and the NVLinks NVML reports
  /// ("preset h200x2 (NVML: 18 NVLinks per GPU, direct)"; NVML is loaded at run time, optional).
  const std::string& topologySource() const noexcept;
  /// Where the profile of the "auto" choice came from (its `source`, and the file when CommConfig::profile is set).
  const std::string& profileSource() const noexcept;
  /// The proxy's transport between this communicator's nodes ("socket", "ibverbs"); empty on one node.
  std::string interNodeTransport() const;
  /// Worker CTAs of this rank's resident kernel.
  uint32_t workerCtas() const noexcept;

  /// Collectives (counts as in algorithms.hpp; NCCL's conventions). `send` and `recv` are device memory
  /// of this rank's GPU, aligned to the element size; send == recv (in place) is allowed, and so is any
  /// overlap: the input is then staged through engine memory first (a device copy on `stream`).
  void allReduce(const void* send, void* recv, uint64_t count, DType dtype, RedOp op, cudaStream_t stream,
                 const CollOptions& opt = {});
  void allGather(const void* send, void* recv, uint64_t count, DType dtype, cudaStream_t stream,
                 const CollOptions& opt = {});
  void reduceScatter(const void* send, void* recv, uint64_t count, DType dtype, RedOp op, cudaStream_t stream,
                     const CollOptions& opt = {});
  void broadcast(const void* send, void* recv, uint64_t count, DType dtype, uint32_t root, cudaStream_t stream,
                 const CollOptions& opt = {});
  void allToAll(const void* send, void* recv, uint64_t count, DType dtype, cudaStream_t stream,
                const CollOptions& opt = {});

  /// Run any schedule of this communicator's size (every rank calls it with the same schedule): buffers
  /// of kind Input are bound to `input`, Output and InOut to `output` (each rank's own pointers; sizes
  /// are the schedule's counts and are trusted), Scratch to engine memory. Lowered and uploaded once per
  /// distinct schedule. The schedule is not validated here: validate() it first when it comes from
  /// outside (a schedule that can never finish ends in a timeout error, not a hang).
  void execute(const Schedule& s, const void* input, void* output, cudaStream_t stream);
  /// The same with each buffer bound to its own pointer: the schedule's Input buffers, in declaration order, to
  /// `inputs[0]`, `inputs[1]`, ... and its Output / InOut buffers to `outputs[...]` (a list shorter than the buffers
  /// of its kind binds the rest to its last entry). A fused schedule (mk::generate(FusedSpec, ...)) runs as
  /// execute(s, {a, b}, {c}, stream). Outputs may not overlap inputs (nothing is staged). One process per GPU: a
  /// peer's steps may reach only a rank's first input and first output.
  void execute(const Schedule& s, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
               cudaStream_t stream);
  /// The same for a schedule with runtime extents (Schedule::extents, mk/schedule/extent.hpp; docs/gpu-engine.md,
  /// "Runtime extents"): `extentWords` is device memory of this rank's GPU, 8-byte aligned, holding one uint64 per
  /// extent (this rank's value, in the extent's units). A Copy, Put or Reduce step naming extent e moves count /
  /// bound x extentWords[e] elements; the kernel reads the word when the step starts, so the caller may write the
  /// words on `stream` before this call (a kernel, cudaMemcpyAsync) and change them for the next op: the program
  /// stays cached, only the pointer is bound per op. Null: every extent at its bound (as the CPU executor with no
  /// values). A value above its bound fails the op with Error(InvalidArgument) naming the step, the extent and the
  /// rank (the communicator is unusable afterwards, as after any device-side failure). Refused with
  /// Error(InvalidArgument) before anything runs: words for a schedule without extents, a misaligned pointer.
  /// Refused when lowered (Error(Unsupported)): a ProxyPut or an LL / LL128 put with an extent, a Gemm whose shape
  /// has one (run those on the CPU executor).
  void execute(const Schedule& s, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
               cudaStream_t stream, const uint64_t* extentWords);

  /// Fused operators (docs/fused-operators.md): a GEMM and a collective in one schedule, overlapped tile by tile on
  /// the resident kernel's compute lanes (the communicator needs CommConfig::computeLanes). Every rank calls the
  /// same op with the same shape; `a`, `b` and `c` are this rank's pieces (device memory of its GPU, 16-byte
  /// aligned, row-major with dense leading dimensions; B column-major with `layoutB` ColMajor), as
  /// mk::fusedShards() splits the whole C[m x n] = A[m x k] B[k x n]:
  ///  * gemmReduceScatter: a = A[:, K_r] (m x K_r), b = B[K_r, :]; c = rows M_r of C (M_r x n);
  ///  * allGatherGemm: a = A[M_r, :] (M_r x k), b = B[:, N_r] (k x N_r); c = C[:, N_r] (m x N_r);
  ///  * gemmAllReduce: a and b as gemmReduceScatter; c = all of C (m x n), bit-identical on every rank.
  /// Stream-ordered like the collectives. `opt` fields left 0 / Auto are decided by mk::planFused under this
  /// communicator's topology and profile, the split dividing workerCtas() (fusedPlan() tells what was chosen); the
  /// schedule is generated, lowered and uploaded once per shape and options. Refused before anything runs or is
  /// written, with mk::Error naming what to change: a communicator without compute lanes, a dtype other than
  /// bfloat16 (Unsupported), a shape that does not divide as the op needs (n, k multiples of 8; k, or n for
  /// ag-gemm, at least 8 per rank; m >= ranks), operands that are null, not 16-byte aligned or overlapping c, a
  /// split that leaves the compute lane or a communication lane without CTAs, FusedOptions::ctas other than 0 or
  /// workerCtas() (InvalidArgument).
  void gemmReduceScatter(const void* a, const void* b, void* c, uint64_t m, uint64_t n, uint64_t k, DType dtype,
                         cudaStream_t stream, const FusedOptions& opt = {},
                         MatrixLayout layoutB = MatrixLayout::RowMajor);
  void allGatherGemm(const void* a, const void* b, void* c, uint64_t m, uint64_t n, uint64_t k, DType dtype,
                     cudaStream_t stream, const FusedOptions& opt = {}, MatrixLayout layoutB = MatrixLayout::RowMajor);
  void gemmAllReduce(const void* a, const void* b, void* c, uint64_t m, uint64_t n, uint64_t k, DType dtype,
                     cudaStream_t stream, const FusedOptions& opt = {}, MatrixLayout layoutB = MatrixLayout::RowMajor);
  /// Any fused op by its spec (the three calls above forward here).
  void fused(const FusedSpec& spec, const void* a, const void* b, void* c, cudaStream_t stream,
             const FusedOptions& opt = {});
  /// What a fused call with (spec, opt) runs on this communicator: the concrete options (tile, order, the split,
  /// compute lanes) and the closed form's estimate. Throws what the call would throw for the shape and options.
  FusedPlan fusedPlan(const FusedSpec& spec, const FusedOptions& opt = {}) const;

  /// Ring attention, forward (context parallelism; docs/attention.md, "Ring attention"): the sequence of spec.seq
  /// tokens is split over the ranks, each rank keeps its queries while the key / value blocks travel around the ring
  /// and the compute lane runs attention against each arrived block while the next one travels (puts inside a node,
  /// the proxy between nodes), the partial results merged by log-sum-exp. Every rank calls it with the same spec;
  /// this rank's pieces (device memory of its GPU), L = seq / ranks tokens in its local order
  /// (mk::ringAttentionPosition: its L-token slice, or with spec.causal the zigzag's two chunks):
  ///  * q: bf16 [batch][L][qHeads][headDim], 16-byte aligned;
  ///  * kv: bf16 K [batch][L][kvHeads][headDim] then V of the same shape, 16-byte aligned;
  ///  * out: float32 [batch][L][qHeads][headDim + 1]: each row's attention output over the whole sequence (the keys it
  ///    sees), then its log-sum-exp (what a backward pass keeps).
  /// Stream-ordered like the collectives; generated, lowered and uploaded once per spec. spec.computeCtas <= 1 lets
  /// the engine weigh the compute lane 8 to the send lane's 1 (inside a node about 8 / 9 of the worker CTAs run the
  /// attention; across nodes all but one). Refused before anything runs, with mk::Error
  /// naming what to change: a spec mk::validateRingAttentionSpec refuses, a head dim other than 64 or 128 or a dtype
  /// other than bfloat16 (InvalidArgument), a communicator without CommConfig::computeLanes (Unsupported), pointers
  /// that are null, misaligned or not device memory of this GPU (InvalidArgument).
  void ringAttention(const RingAttentionSpec& spec, const void* q, const void* kv, float* out, cudaStream_t stream);
  /// What ringAttention(spec, ...) runs on this rank: the planned spec and the lanes' worker CTAs of the lowered
  /// program (generated, lowered and uploaded now if no call did yet). Throws what the call would for the spec.
  RingAttentionPlan ringAttentionPlan(const RingAttentionSpec& spec) const;

  /// The expert FFN of a mixture-of-experts layer (moe-ffn; docs/fused-operators.md, "MoE FFN"), one op per rank: the
  /// schedule routes this rank's tokens by their expert ids, dispatches each to the ranks of its experts (spec.experts
  /// on every rank, expert j on rank j / experts), runs every local expert's SwiGLU FFN as grouped GEMMs over the rows
  /// that arrived (their counts known only at run time), returns the rows and sums each token's topk results weighted
  /// by the router. Every rank calls it with the same spec; its buffers (device memory of its GPU, T = spec.tokens,
  /// H = spec.hidden, F = spec.ffn, E = spec.experts):
  ///  * ids: int32 [T][topk], the global expert ids of each token (distinct per token, in [0, ranks x E));
  ///  * weights: float32 [T][topk], the router's weight of each (token, k);
  ///  * x: bf16 [T][H], 16-byte aligned;
  ///  * w1: bf16 [E][H][2F], this rank's experts' first weights, row-major, the gate and up columns of unit f
  ///    interleaved at 2f and 2f + 1; w2: bf16 [E][F][H]; both 16-byte aligned;
  ///  * y: float32 [T][H]: row t = sum over k of weights[t][k] x the FFN of expert ids[t][k] applied to token t.
  /// Stream-ordered like the collectives; generated, lowered and uploaded once per spec. Refused before anything runs,
  /// with mk::Error naming what to change: a spec mk::validateMoeFfnSpec refuses (InvalidArgument), a communicator
  /// without CommConfig::computeLanes or ranks on more than one node (Unsupported: the GPU engine runs moe-ffn on one
  /// node so far), pointers that are null, misaligned or not device memory of this GPU (InvalidArgument). Routing
  /// errors are the op's: an id outside [0, ranks x E) or more than spec.capacity tokens of one rank for one expert
  /// fail it with Error(InvalidArgument) naming the rank, the id or expert (and the communicator is unusable after, as
  /// after any device failure).
  void moeFfn(const MoeFfnSpec& spec, const int32_t* ids, const float* weights, const void* x, const void* w1,
              const void* w2, float* y, cudaStream_t stream);
  /// What moeFfn(spec, ...) runs on this rank (generated, lowered and uploaded now if no call did yet). Throws what
  /// the call would for the spec.
  MoeFfnPlan moeFfnPlan(const MoeFfnSpec& spec) const;

  /// Algorithm "auto" would pick for this collective (mk::chooseAlgorithm on topology() under the profile).
  Algorithm chooseAlgorithm(CollOp op, uint64_t count, DType dtype) const;
  /// GenOptions the engine uses for (op, count, dtype, algo) when CollOptions leaves them at 0 (mk::defaultGenOptions;
  /// algo "auto" or empty: of chooseAlgorithm's pick). Throws Error(NotFound) for an unknown algorithm.
  GenOptions chooseGenOptions(CollOp op, uint64_t count, DType dtype, const std::string& algo) const;

  /// Block the host until every op this rank submitted is complete for this rank (see "Stream semantics"
  /// above; bounded by CommConfig::hostBudgetMs). Throws the kernel's failure, if any.
  void synchronize();
  /// Index of the next op this rank will submit (ops are numbered 0, 1, ... per rank).
  uint64_t nextOpIndex() const;
  /// Timestamps of op `op` (valid once it completed and until ringSlots later ops completed).
  OpTiming opTiming(uint64_t op) const;
  /// Ping-pong with a one-block kernel on this rank's GPU (`rounds` pings; the best round trip wins).
  ClockSync calibrateClock(int rounds = 200) const;
  /// Trace events recorded so far on this rank (CommConfig::trace), and forget them. Call after
  /// synchronize().
  std::vector<TraceEvent> takeTrace();

 private:
  Communicator(std::shared_ptr<runtime::Engine> engine, int rank) : engine_(std::move(engine)), rank_(rank) {}
  void collective(const CollectiveSpec& spec, const void* send, void* recv, cudaStream_t stream,
                  const CollOptions& opt);

  friend struct runtime::TestHooks;
  std::shared_ptr<runtime::Engine> engine_;
  int rank_ = 0;
  const void* checked_[4] = {};  ///< recently validated device pointers (skips cudaPointerGetAttributes)
  unsigned checkedNext_ = 0;
};

/// Start a group: until the matching groupEnd(), ops submitted by this thread get no per-op stream wait.
void groupStart();
/// End a group: each (communicator, stream) used inside waits on its last op's completion. The communicators
/// used inside a group must stay alive until its groupEnd().
void groupEnd();

/// Chrome / Perfetto trace JSON ("traceEvents", one complete event per step: pid = rank, tid = lane + 1,
/// ts / dur in whole nanoseconds from the earliest start, written in microseconds, args {op, step, lane}) —
/// the format the simulator emits too (both through mk::io::TraceWriter). Each GPU's own %globaltimer: ranks
/// on different GPUs keep their clock offsets (mk-validate aligns each rank on its first step).
std::string traceToChromeJson(const std::vector<TraceEvent>& events, const std::string& label = "mkernel");

}  // namespace mk
