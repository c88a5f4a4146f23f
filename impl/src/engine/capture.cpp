// mkernel — ops captured into CUDA graphs (mk/graph.hpp): at capture, the hand-off nodes go into the caller's graph
// and the op's arguments into a CaptureRecord; at each launch, the record's ops are submitted again as if called
// then (their op numbers, descriptors and the fence rule decided on the host, as for any op), and the graph's
// first node hands the replay's first op number to the op nodes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/capture.hpp"
#include "engine/engine.hpp"
#include "engine/host_log.hpp"
#include "engine/host_sync.hpp"
#include "kernels/resident_kernel.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/graph.hpp"

namespace mk {
namespace runtime {
namespace {

std::mutex gRecordsMu;
std::map<const device::GraphCells*, std::weak_ptr<CaptureRecord>> gRecords;

}  // namespace

std::shared_ptr<CaptureRecord> findCaptureRecord(const device::GraphCells* cells) {
  std::lock_guard<std::mutex> lock(gRecordsMu);
  auto it = gRecords.find(cells);
  return it == gRecords.end() ? nullptr : it->second.lock();
}

void registerCaptureRecord(const std::shared_ptr<CaptureRecord>& rec) {
  std::lock_guard<std::mutex> lock(gRecordsMu);
  for (auto it = gRecords.begin(); it != gRecords.end();) it = it->second.expired() ? gRecords.erase(it) : ++it;
  gRecords[rec->cells] = rec;
}

bool RelaxedCapture::capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MK_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status == cudaStreamCaptureStatusInvalidated)
    throw Error(ErrorCode::InvalidArgument,
                "an op was submitted to a stream whose CUDA graph capture was invalidated by an earlier call; end the "
                "capture (cudaStreamEndCapture) and capture again");
  return status == cudaStreamCaptureStatusActive;
}

RelaxedCapture::RelaxedCapture(cudaStream_t stream) : active_(capturing(stream)) {
  if (!active_) return;
  previous_ = cudaStreamCaptureModeRelaxed;
  MK_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&previous_));
}

RelaxedCapture::~RelaxedCapture() {
  if (active_) cudaThreadExchangeStreamCaptureMode(&previous_);
}

CaptureScope::CaptureScope(const Engine& engine, int rank, cudaStream_t stream) : RelaxedCapture(stream) {
  if (active()) engine.requireCapturable(rank);
}

void EngineSubmission::captureLocked(int r, const CapturedOp& op, cudaStream_t stream) {
  failures_.throwIfFailedLocked();
  RankResources& rr = ctx_.ranks[r];
  const std::string who = rankName(r) + ": " + op.sched->what + " under CUDA graph capture";
  if (!handoff_.useKernel(r))
    throw Error(ErrorCode::Unsupported,
                who +
                    " needs the kernel hand-off (its op number is known only when the graph runs, and a stream "
                    "memory operation writes a fixed value); this rank uses stream memory operations "
                    "(CommConfig::streamHandoff, or no SM free beside the resident kernel, or compute-sanitizer)");
  const uintptr_t s0 = reinterpret_cast<uintptr_t>(op.send), r0 = reinterpret_cast<uintptr_t>(op.recv);
  if (op.send && op.inBytes > 0 && op.outBytes > 0 && s0 < r0 + op.outBytes && r0 < s0 + op.inBytes)
    throw Error(ErrorCode::Unsupported, who +
                                            ": send and recv overlap (in place), which needs a staging copy "
                                            "chosen per op number; capture it with separate buffers");
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  if (ctx_.link) {
    // One process per GPU: every launch posts these buffers for the peers to map (CUDA IPC); one that cannot be
    // exported is refused now, at capture, rather than at some later launch.
    ctx_.link->exportPointer(op.send, who + ": send buffer");
    ctx_.link->exportPointer(op.recv, who + ": recv buffer");
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  MK_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id));
  CaptureRecord*& rec = openCaptures_[{r, id}];
  if (rec && rec->stream != stream)
    throw Error(ErrorCode::Unsupported, who +
                                            ": this rank's earlier ops of the same capture are on another stream; "
                                            "capture one rank's ops on one stream (their order must be the graph's)");
  if (!rec) {
    if (captures_.size() >= kMaxCaptures)
      throw Error(ErrorCode::Unsupported, who + ": this communicator already holds " + std::to_string(kMaxCaptures) +
                                              " captures (rank, capture), the most it keeps");
    auto fresh = std::make_shared<CaptureRecord>();
    fresh->engine = engine_.weak_from_this();
    fresh->rank = r;
    fresh->captureId = id;
    fresh->stream = stream;
    const size_t index = captures_.size();
    fresh->cells = &graphCells_[index];
    fresh->base = &rr.graphBase[index];
    // The record's first node: takes each replay's first op number (launchCaptured writes it).
    MK_CUDA_CHECK(launchGraphBegin(fresh->cells, fresh->base, stream));
    registerCaptureRecord(fresh);
    captures_.push_back(fresh);
    rec = fresh.get();
    MK_LOG_AT(Debug, rankName(r),
              "capture " + std::to_string(id) + ": first op captured on stream " +
                  std::to_string(reinterpret_cast<uintptr_t>(stream)));
  }
  const uint32_t index = static_cast<uint32_t>(rec->ops.size());
  const bool grouped = insideGroup();
  MK_CUDA_CHECK(launchGraphHandoff(rec->base, index, rr.doorbell, ctx_.ringSlots, true, &rr.state->complete, !grouped,
                                   &rr.state->abort, static_cast<uint64_t>(ctx_.config.hostBudgetMs * 1e6), stream));
  if (grouped) deferGroupWait(&engine_, r, stream, index, rec);
  rec->ops.push_back(op);
}

void EngineSubmission::enqueueCapturedWait(const CaptureRecord& rec, uint32_t index, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  MK_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id));
  if (status != cudaStreamCaptureStatusActive || id != rec.captureId)
    throw Error(ErrorCode::InvalidArgument,
                rankName(rec.rank) +
                    ": groupEnd() after the capture of the group's ops ended; call groupEnd() before "
                    "cudaStreamEndCapture so the group's completion wait is captured too");
  const RankResources& rr = ctx_.ranks[rec.rank];
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  MK_CUDA_CHECK(launchGraphHandoff(rec.base, index, rr.doorbell, ctx_.ringSlots, false, &rr.state->complete, true,
                                   &rr.state->abort, static_cast<uint64_t>(ctx_.config.hostBudgetMs * 1e6), stream));
}

void EngineSubmission::launchCaptured(const std::vector<CaptureRecord*>& recs) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  failures_.throwIfFailedLocked();
  // Each record's launch n gets its first op number in cell n % kGraphCells, reusable once launch n - kGraphCells
  // began on the GPU.
  size_t most = 0;
  for (CaptureRecord* rec : recs) {
    const uint32_t n = rec->launches;
    device::GraphCells& cells = *rec->cells;
    const bool ok = hostPoll(ctx_.config.hostBudgetMs, [&] {
      progress_.pumpLocked();
      return seqGeq(loadHost(&cells.begun) + device::kGraphCells, n + 1) || loadHost(&ctx_.status->abort) != 0;
    });
    failures_.throwIfFailedLocked(true);
    if (!ok)
      failures_.poisonAndThrow(ErrorCode::Timeout,
                               rankName(rec->rank) + ": graph launch " + std::to_string(n) + " waited " +
                                   fmtMs(ctx_.config.hostBudgetMs) + " for launch " +
                                   std::to_string(n - device::kGraphCells) +
                                   " of the same graph to start on the GPU (is its stream blocked?)");
    cells.base[n % device::kGraphCells] = ctx_.ranks[rec->rank].submitted;
    storeHost(&cells.authorized, n + 1);  // release: the base is visible first
    rec->launches = n + 1;
    most = std::max(most, rec->ops.size());
  }
  // Op i of every rank before op i + 1 of any: ranks' calls then meet as one thread submitting them would.
  for (size_t i = 0; i < most; ++i)
    for (CaptureRecord* rec : recs) {
      if (i >= rec->ops.size()) continue;
      const CapturedOp& c = rec->ops[i];
      const int r = rec->rank;
      const uint32_t seq = ctx_.ranks[r].submitted;
      waitRingSpaceLocked(r, seq);
      PendingOp& op = pendingOpLocked(r, seq, c.key, *c.sched);
      ctx_.ranks[r].submitted = seq + 1;
      recordCallLocked(r, seq, op, c.send, c.send, c.recv, c.inBytes, c.outBytes, c.bind, c.extraReads, c.extraWrites);
    }
}

std::string EngineSubmission::graphMisuseNote() const {
  for (const auto& rec : captures_) {
    const uint32_t m = loadHost(&rec->cells->misused);
    if (m != 0)
      return " (rank " + std::to_string(rec->rank) + ": replay " + std::to_string(m - 1) +
             " of a captured graph ran without mk::GraphExec::launch — a plain cudaGraphLaunch cannot give its ops "
             "their numbers, so its first node stopped the CUDA context)";
  }
  return std::string();
}

void Engine::failLaunch(const std::string& message) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  poisonLocked(ErrorCode::CudaError, message);
}

}  // namespace runtime

// ---- GraphExec

struct GraphExec::Impl {
  cudaGraphExec_t exec = nullptr;
  std::vector<std::shared_ptr<runtime::CaptureRecord>> recs;
  uint64_t ops = 0;
};

namespace {

/// Every node of `graph` and of its child graphs, depth first.
void collectNodes(cudaGraph_t graph, std::vector<cudaGraphNode_t>& out) {
  size_t n = 0;
  MK_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) MK_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    MK_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeGraph) {
      cudaGraph_t child = nullptr;
      MK_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child));
      collectNodes(child, out);
    } else if (type == cudaGraphNodeTypeKernel) {
      out.push_back(node);
    }
  }
}

}  // namespace

GraphExec::GraphExec(cudaGraph_t graph) : impl_(std::make_unique<Impl>()) {
  if (!graph) throw Error(ErrorCode::InvalidArgument, "GraphExec: the graph is null");
  std::vector<cudaGraphNode_t> kernels;
  collectNodes(graph, kernels);
  const void* begin = runtime::graphBeginKernelAddress();
  for (cudaGraphNode_t node : kernels) {
    cudaKernelNodeParams p{};
    MK_CUDA_CHECK(cudaGraphKernelNodeGetParams(node, &p));
    if (p.func != begin || !p.kernelParams) continue;
    const auto* cells = *static_cast<device::GraphCells* const*>(p.kernelParams[0]);
    std::shared_ptr<runtime::CaptureRecord> rec = runtime::findCaptureRecord(cells);
    if (!rec || rec->engine.expired())
      throw Error(ErrorCode::InvalidArgument,
                  "GraphExec: the graph holds mkernel ops of a communicator that was destroyed; capture them again");
    impl_->recs.push_back(std::move(rec));
  }
  for (size_t i = 0; i < impl_->recs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (impl_->recs[i]->engine.lock() == impl_->recs[j]->engine.lock() &&
          impl_->recs[i]->rank == impl_->recs[j]->rank)
        throw Error(ErrorCode::InvalidArgument,
                    "GraphExec: rank " + std::to_string(impl_->recs[i]->rank) +
                        "'s ops in this graph come from two captures, whose order in the graph is not known; capture "
                        "one rank's ops of a graph in one capture");
  for (const auto& rec : impl_->recs)
    if (rec->owner)
      throw Error(ErrorCode::InvalidArgument,
                  "GraphExec: rank " + std::to_string(rec->rank) +
                      "'s captured ops are already instantiated by another live GraphExec; their launches would give "
                      "out the same op numbers (destroy that one first, or capture again)");
  MK_CUDA_CHECK(cudaGraphInstantiate(&impl_->exec, graph, 0));
  for (const auto& rec : impl_->recs) {
    rec->owner = impl_.get();
    impl_->ops += rec->ops.size();
  }
}

GraphExec::GraphExec(GraphExec&&) noexcept = default;
GraphExec& GraphExec::operator=(GraphExec&& other) noexcept {
  if (this != &other) {
    GraphExec dying(std::move(*this));
    impl_ = std::move(other.impl_);
  }
  return *this;
}

GraphExec::~GraphExec() {
  if (!impl_) return;
  for (const auto& rec : impl_->recs)
    if (rec->owner == impl_.get()) rec->owner = nullptr;
  if (impl_->exec) cudaGraphExecDestroy(impl_->exec);
}

cudaGraphExec_t GraphExec::get() const noexcept { return impl_ ? impl_->exec : nullptr; }
uint64_t GraphExec::ops() const noexcept { return impl_ ? impl_->ops : 0; }

void GraphExec::launch(cudaStream_t stream) {
  if (!impl_) throw Error(ErrorCode::InvalidArgument, "GraphExec: launch of a moved-from GraphExec");
  // Per engine (communicator), its records; every engine must be alive before any op is given a number.
  std::vector<std::pair<std::shared_ptr<runtime::Engine>, std::vector<runtime::CaptureRecord*>>> engines;
  for (const auto& rec : impl_->recs) {
    std::shared_ptr<runtime::Engine> e = rec->engine.lock();
    if (!e)
      throw Error(ErrorCode::InvalidArgument,
                  "GraphExec::launch: the communicator whose rank " + std::to_string(rec->rank) +
                      " captured ops in this graph was destroyed; the graph cannot be replayed");
    auto it = std::find_if(engines.begin(), engines.end(), [&](const auto& x) { return x.first == e; });
    if (it == engines.end()) it = engines.insert(engines.end(), {e, {}});
    it->second.push_back(rec.get());
  }
  // A graph spanning several communicators: when one refuses, the ones before it were given op numbers that will
  // never run, so they are failed too (their next call says why) rather than left waiting for those ops.
  for (size_t i = 0; i < engines.size(); ++i) {
    try {
      engines[i].first->launchCaptured(engines[i].second);
    } catch (const std::exception& e) {
      for (size_t j = 0; j < i; ++j)
        engines[j].first->failLaunch(std::string("GraphExec::launch: another communicator of the graph refused the "
                                                 "launch (") +
                                     e.what() +
                                     "); this one's ops of the launch were given numbers that will never run");
      throw;
    }
  }
  const cudaError_t err = cudaGraphLaunch(impl_->exec, stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    const std::string message = std::string("GraphExec::launch: cudaGraphLaunch failed (") + cudaGetErrorString(err) +
                                "); the ops of this launch were given numbers that will never run";
    for (auto& [engine, recs] : engines) engine->failLaunch(message);
    throw Error(ErrorCode::CudaError, message);
  }
}

}  // namespace mk
