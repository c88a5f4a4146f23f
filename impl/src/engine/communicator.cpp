// mkernel — Communicator: one rank's handle on the engine (engine/engine.hpp). It checks what the caller passed
// and forwards; the engine does the work. Creation in one process (createLocal) or one process per GPU (create,
// createFromEnvironment).
#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "device/driver_api.hpp"
#include "engine/engine.hpp"
#include "engine/fused_args.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk {
namespace {

std::string rangeText(const void* p, uint64_t bytes) {
  std::ostringstream os;
  os << p << " (+" << bytes << " bytes)";
  return os.str();
}

}  // namespace

std::vector<Communicator> Communicator::createLocal(const std::vector<int>& devices, const CommConfig& config) {
  auto engine = std::make_shared<runtime::Engine>(devices, config);
  std::vector<Communicator> out;
  for (int r = 0; r < static_cast<int>(devices.size()); ++r) out.push_back(Communicator(engine, r));
  return out;
}

Communicator Communicator::create(Bootstrap& bootstrap, int device, const CommConfig& config) {
  auto engine = std::make_shared<runtime::Engine>(bootstrap, device, config);
  const int rank = engine->ownRank();
  return Communicator(std::move(engine), rank);
}

Communicator Communicator::createFromEnvironment(const CommConfig& config) {
  RankLaunch launch = bootstrapFromEnvironment(config.hostBudgetMs);
  return create(*launch.bootstrap, launch.device, config);
}

bool Communicator::multiProcess() const noexcept { return engine_ && engine_->multiProcess(); }

Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
Communicator::~Communicator() = default;

int Communicator::size() const noexcept { return engine_ ? engine_->size() : 0; }
int Communicator::device() const noexcept { return engine_ ? engine_->rank(rank_).device : -1; }
const Topology& Communicator::topology() const noexcept { return engine_->topology(); }
const std::string& Communicator::topologySource() const noexcept { return engine_->topologySource(); }
const std::string& Communicator::profileSource() const noexcept { return engine_->profileSource(); }
std::string Communicator::interNodeTransport() const { return engine_->interNodeTransport(); }
uint32_t Communicator::workerCtas() const noexcept { return engine_ ? engine_->workers() : 0; }

namespace {
/// Memory from a stream-ordered pool (cudaMallocAsync) is reachable from a peer GPU only where the pool
/// grants it (cudaMemPoolSetAccess); cudaDeviceEnablePeerAccess does not cover pools.
void checkPoolAccess(const void* p, const char* which, const std::vector<int>& peers, const char* call) {
  void* pool = nullptr;
  const CUresult r = runtime::driverApi().pointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                                              reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS || pool == nullptr) return;  // not pool memory: peer access covers it
  for (int peer : peers) {
    cudaMemLocation loc{};
    loc.type = cudaMemLocationTypeDevice;
    loc.id = peer;
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    if (cudaMemPoolGetAccess(&flags, static_cast<cudaMemPool_t>(pool), &loc) != cudaSuccess) cudaGetLastError();
    if (flags != cudaMemAccessFlagsProtReadWrite)
      throw Error(ErrorCode::InvalidArgument,
                  std::string(call) + ": " + which + " comes from a stream-ordered memory pool that GPU " +
                      std::to_string(peer) +
                      " cannot access; grant it with cudaMemPoolSetAccess (peer access does not cover pools)");
  }
}

void checkPointer(const void* p, const char* which, uint64_t elemSize, int device, const char* call) {
  if (!p) throw Error(ErrorCode::InvalidArgument, std::string(call) + ": " + which + " is null");
  if (reinterpret_cast<uintptr_t>(p) % elemSize != 0)
    throw Error(ErrorCode::InvalidArgument, std::string(call) + ": " + which + " " + rangeText(p, 0) +
                                                " is not aligned to the element size (" + std::to_string(elemSize) +
                                                " bytes)");
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) cudaGetLastError();
  if (e != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
      attr.device != device)
    throw Error(ErrorCode::InvalidArgument,
                std::string(call) + ": " + which + " must be device memory of GPU " + std::to_string(device) +
                    " (got " +
                    (e != cudaSuccess                          ? "an unknown pointer"
                     : attr.type == cudaMemoryTypeHost         ? "pinned host memory"
                     : attr.type == cudaMemoryTypeUnregistered ? "pageable host memory"
                                                               : "memory of GPU " + std::to_string(attr.device)) +
                    ")");
}
}  // namespace

void Communicator::collective(const CollectiveSpec& specIn, const void* send, void* recv, cudaStream_t stream,
                              const CollOptions& opt) {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  const runtime::CaptureScope capture(*engine_, rank_, stream);  // first (capture.hpp)
  const char* call = toString(specIn.op);
  CollectiveSpec spec = specIn;
  if (spec.count == 0) throw Error(ErrorCode::InvalidArgument, std::string(call) + ": count must be > 0");
  if (spec.dtype != DType::Float32 && spec.dtype != DType::BFloat16 && spec.dtype != DType::Float16)
    throw Error(ErrorCode::Unsupported, std::string(call) + ": dtype " + toString(spec.dtype) +
                                            " is not supported (float32, bfloat16, float16)");
  if (spec.redop != RedOp::Sum && spec.redop != RedOp::Max && spec.redop != RedOp::Min)
    throw Error(ErrorCode::Unsupported, std::string(call) + ": reduction operator code " +
                                            std::to_string(int(spec.redop)) + " is not supported (sum, max, min)");
  if (spec.op == CollOp::Broadcast && spec.root >= static_cast<uint32_t>(size()))
    throw Error(ErrorCode::InvalidArgument, std::string(call) + ": root " + std::to_string(spec.root) +
                                                " is outside 0.." + std::to_string(size() - 1));
  const uint64_t es = dtypeSize(spec.dtype);
  if (spec.count > (uint64_t{1} << 46) / es / static_cast<uint64_t>(size()))
    throw Error(ErrorCode::InvalidArgument,
                std::string(call) + ": count " + std::to_string(spec.count) + " is too large");
  const bool sendOptional = spec.op == CollOp::Broadcast && static_cast<uint32_t>(rank_) != spec.root;
  // cudaPointerGetAttributes costs about a microsecond: pointers validated recently on this rank are
  // trusted (still checked for null and alignment, which depend on the dtype).
  auto check = [&](const void* p, const char* which) {
    if (p && reinterpret_cast<uintptr_t>(p) % es == 0)
      for (const void* known : checked_)
        if (known == p) return;
    checkPointer(p, which, es, device(), call);
    // Multi-process: peers reach the buffer through CUDA IPC; the export refuses what it cannot share.
    if (engine_->multiProcess()) {
      checked_[checkedNext_++ % 4] = p;
      return;
    }
    std::vector<int> peers;
    for (int q = 0; q < size(); ++q)
      if (q != rank_) peers.push_back(engine_->rank(q).device);
    checkPoolAccess(p, which, peers, call);
    checked_[checkedNext_++ % 4] = p;
  };
  if (!(sendOptional && send == nullptr)) check(send, "send");
  check(recv, "recv");
  // The algorithm's name is parsed here, at the API's edge: an unknown one fails before anything is submitted.
  std::optional<Algorithm> algo;
  if (!opt.algo.empty() && opt.algo != "auto") algo = requireAlgorithm(spec.op, opt.algo);
  GenOptions gen;
  gen.chunks = opt.chunks;
  gen.channels = opt.channels;
  gen.protocol = opt.protocol;
  engine_->submitCollective(rank_, spec, algo, gen, send, recv, stream);
}

namespace {
/// The spec of one collective call (the per-op entry points differ only in these fields).
CollectiveSpec callSpec(CollOp op, uint64_t count, DType dtype, RedOp redop = RedOp::Sum, uint32_t root = 0) {
  CollectiveSpec s;
  s.op = op;
  s.count = count;
  s.dtype = dtype;
  s.redop = redop;
  s.root = root;
  return s;
}
}  // namespace

void Communicator::allReduce(const void* send, void* recv, uint64_t count, DType dtype, RedOp op, cudaStream_t stream,
                             const CollOptions& opt) {
  collective(callSpec(CollOp::AllReduce, count, dtype, op), send, recv, stream, opt);
}
void Communicator::allGather(const void* send, void* recv, uint64_t count, DType dtype, cudaStream_t stream,
                             const CollOptions& opt) {
  collective(callSpec(CollOp::AllGather, count, dtype), send, recv, stream, opt);
}
void Communicator::reduceScatter(const void* send, void* recv, uint64_t count, DType dtype, RedOp op,
                                 cudaStream_t stream, const CollOptions& opt) {
  collective(callSpec(CollOp::ReduceScatter, count, dtype, op), send, recv, stream, opt);
}
void Communicator::broadcast(const void* send, void* recv, uint64_t count, DType dtype, uint32_t root,
                             cudaStream_t stream, const CollOptions& opt) {
  collective(callSpec(CollOp::Broadcast, count, dtype, RedOp::Sum, root), send, recv, stream, opt);
}
void Communicator::allToAll(const void* send, void* recv, uint64_t count, DType dtype, cudaStream_t stream,
                            const CollOptions& opt) {
  collective(callSpec(CollOp::AllToAll, count, dtype), send, recv, stream, opt);
}

void Communicator::execute(const Schedule& s, const void* input, void* output, cudaStream_t stream) {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  const runtime::CaptureScope capture(*engine_, rank_, stream);  // first (capture.hpp)
  if (s.nRanks != static_cast<uint32_t>(size()))
    throw Error(ErrorCode::InvalidArgument, "execute: schedule has " + std::to_string(s.nRanks) +
                                                " ranks, the communicator " + std::to_string(size()));
  engine_->submitSchedule(rank_, s, input, output, stream);
}

void Communicator::execute(const Schedule& s, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                           cudaStream_t stream) {
  execute(s, inputs, outputs, stream, nullptr);
}

void Communicator::execute(const Schedule& s, const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                           cudaStream_t stream, const uint64_t* extentWords) {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  const runtime::CaptureScope capture(*engine_, rank_, stream);  // first (capture.hpp)
  if (s.nRanks != static_cast<uint32_t>(size()))
    throw Error(ErrorCode::InvalidArgument, "execute: schedule has " + std::to_string(s.nRanks) +
                                                " ranks, the communicator " + std::to_string(size()));
  engine_->submitScheduleBound(rank_, s, inputs, outputs, stream, extentWords);
}

void Communicator::fused(const FusedSpec& spec, const void* a, const void* b, void* c, cudaStream_t stream,
                         const FusedOptions& opt) {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  const runtime::CaptureScope capture(*engine_, rank_, stream);  // first (capture.hpp)
  // Shape, dtype, options and split first (pure checks, fused_args.hpp); then the operands: alignment and overlap,
  // and device memory of this GPU; only then is anything generated or enqueued.
  static_cast<void>(engine_->fusedPlan(spec, opt));
  runtime::checkFusedOperands(spec, static_cast<uint32_t>(size()), static_cast<uint32_t>(rank_), a, b, c);
  const char* call = toString(spec.op);
  checkPointer(a, "A", 2, device(), call);
  checkPointer(b, "B", 2, device(), call);
  checkPointer(c, "C", 2, device(), call);
  engine_->submitFused(rank_, spec, opt, a, b, c, stream);
}

void Communicator::ringAttention(const RingAttentionSpec& spec, const void* q, const void* kv, float* out,
                                 cudaStream_t stream) {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  const runtime::CaptureScope capture(*engine_, rank_, stream);  // first (capture.hpp)
  runtime::checkRingAttentionCall(spec, static_cast<uint32_t>(size()), engine_->computeLanes());
  checkPointer(q, "q", 16, device(), "ringAttention");
  checkPointer(kv, "kv", 16, device(), "ringAttention");
  checkPointer(out, "out", 4, device(), "ringAttention");
  engine_->submitRingAttention(rank_, spec, q, kv, out, stream);
}

void Communicator::moeFfn(const MoeFfnSpec& spec, const int32_t* ids, const float* weights, const void* x,
                          const void* w1, const void* w2, float* y, cudaStream_t stream) {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  const runtime::CaptureScope capture(*engine_, rank_, stream);  // first (capture.hpp)
  const auto n = static_cast<uint32_t>(size());
  runtime::checkMoeFfnCall(spec, topology().layout(n), engine_->computeLanes());
  checkPointer(ids, "ids", 4, device(), "moeFfn");
  checkPointer(weights, "weights", 4, device(), "moeFfn");
  checkPointer(x, "x", 16, device(), "moeFfn");
  checkPointer(w1, "w1", 16, device(), "moeFfn");
  checkPointer(w2, "w2", 16, device(), "moeFfn");
  checkPointer(y, "y", 4, device(), "moeFfn");
  engine_->submitMoeFfn(rank_, spec, runtime::MoeFfnBuffers{ids, x, w1, weights, w2, y}, stream);
}

MoeFfnPlan Communicator::moeFfnPlan(const MoeFfnSpec& spec) const {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  return engine_->moeFfnPlan(rank_, spec);
}

RingAttentionPlan Communicator::ringAttentionPlan(const RingAttentionSpec& spec) const {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  runtime::checkRingAttentionCall(spec, static_cast<uint32_t>(size()), engine_->computeLanes());
  return engine_->ringAttentionPlan(rank_, spec);
}

namespace {
FusedSpec fusedSpec(FusedOp op, uint64_t m, uint64_t n, uint64_t k, DType dtype, MatrixLayout layoutB) {
  FusedSpec s;
  s.op = op;
  s.dtype = dtype;
  s.m = m;
  s.n = n;
  s.k = k;
  s.layoutB = layoutB;
  return s;
}
}  // namespace

void Communicator::gemmReduceScatter(const void* a, const void* b, void* c, uint64_t m, uint64_t n, uint64_t k,
                                     DType dtype, cudaStream_t stream, const FusedOptions& opt, MatrixLayout layoutB) {
  fused(fusedSpec(FusedOp::GemmReduceScatter, m, n, k, dtype, layoutB), a, b, c, stream, opt);
}
void Communicator::allGatherGemm(const void* a, const void* b, void* c, uint64_t m, uint64_t n, uint64_t k, DType dtype,
                                 cudaStream_t stream, const FusedOptions& opt, MatrixLayout layoutB) {
  fused(fusedSpec(FusedOp::AllGatherGemm, m, n, k, dtype, layoutB), a, b, c, stream, opt);
}
void Communicator::gemmAllReduce(const void* a, const void* b, void* c, uint64_t m, uint64_t n, uint64_t k, DType dtype,
                                 cudaStream_t stream, const FusedOptions& opt, MatrixLayout layoutB) {
  fused(fusedSpec(FusedOp::GemmAllReduce, m, n, k, dtype, layoutB), a, b, c, stream, opt);
}
FusedPlan Communicator::fusedPlan(const FusedSpec& spec, const FusedOptions& opt) const {
  if (!engine_) throw Error(ErrorCode::InvalidArgument, "communicator was moved from");
  return engine_->fusedPlan(spec, opt);
}

Algorithm Communicator::chooseAlgorithm(CollOp op, uint64_t count, DType dtype) const {
  return engine_->chooseAlgorithm(op, count, dtype);
}
GenOptions Communicator::chooseGenOptions(CollOp op, uint64_t count, DType dtype, const std::string& algo) const {
  return engine_->chooseGenOptions(
      op, count, dtype,
      algo == "auto" || algo.empty() ? chooseAlgorithm(op, count, dtype) : requireAlgorithm(op, algo));
}
void Communicator::synchronize() { engine_->synchronize(rank_); }
uint64_t Communicator::nextOpIndex() const { return engine_->submitted(rank_); }
OpTiming Communicator::opTiming(uint64_t op) const { return engine_->opTiming(rank_, op); }
ClockSync Communicator::calibrateClock(int rounds) const { return engine_->calibrateClock(rank_, rounds); }
std::vector<TraceEvent> Communicator::takeTrace() { return engine_->takeTrace(rank_); }

}  // namespace mk
