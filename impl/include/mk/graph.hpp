// mkernel — CUDA graph capture of mkernel ops (docs/gpu-engine.md, "CUDA graph capture").
//
// Ops submitted to a stream under capture (cudaStreamBeginCapture ... cudaStreamEndCapture) do not run: they become
// nodes of the captured graph — per rank, a first node that takes the replay's op numbers, and per op the hand-off
// kernel that rings its doorbell (and holds the stream until the op completes, or once per group at groupEnd) —
// and the engine keeps what each op needs. GraphExec instantiates such a graph; each launch() gives the replay's
// ops their numbers, writes their descriptors (the host work of a submission without its CUDA calls) and launches
// the graph with one cudaGraphLaunch, so a step replayed as a graph pays one host call, not one per op.
//
// What can be captured: ops of a communicator on one node — all its ranks in this process
// (Communicator::createLocal), or one rank per process (createFromEnvironment; each process captures and launches
// its own rank's graph, and its buffers, which the peers map through CUDA IPC, are checked at capture) — with
// separate send and recv buffers, through the kernel hand-off (an SM left free beside the resident kernel:
// CommConfig::streamHandoff Auto or Kernel), all of one rank's ops of a capture on one stream. Anything else is
// refused with mk::Error at capture time, and the caller's capture stays valid. Every rank must capture the same
// ops in the same order (as for submission); a mismatch is reported at launch.
//
// A captured graph must be launched through GraphExec::launch: a plain cudaGraphLaunch of it cannot know its op
// numbers, so its first node stops the CUDA context, and the communicator's next call throws an mk::Error naming
// the replay that was not authorised. A graph replayed after its communicator was destroyed is refused by launch()
// (mk::Error(InvalidArgument)).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace mk {

/// An executable graph holding mkernel ops (move-only; destroys the executable graph).
class GraphExec {
 public:
  /// cudaGraphInstantiate(graph) and find the mkernel ops captured in it (child graphs included). Throws
  /// mk::Error(InvalidArgument) when a communicator that captured ops in it was destroyed, when one rank's ops come
  /// from two captures (their order in the graph would be unknown), or when another live GraphExec instantiated
  /// the same captured ops (their launches would share the op numbers); mk::Error(CudaError) when CUDA refuses.
  explicit GraphExec(cudaGraph_t graph);
  GraphExec(GraphExec&&) noexcept;
  GraphExec& operator=(GraphExec&&) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  ~GraphExec();

  /// Replay the graph on `stream`: the ops get the next op numbers of their ranks (as if submitted now, in
  /// capture order), then one cudaGraphLaunch. Blocks (bounded by CommConfig::hostBudgetMs) only when the
  /// descriptor ring is full or more than device::kGraphCells launches of this graph are queued and not started.
  /// Throws mk::Error(InvalidArgument) when a communicator of its ops was destroyed, the engine's failure when one
  /// failed, mk::Error(CudaError) when the launch fails (the communicators are then unusable: their ops were given
  /// numbers that will never run).
  void launch(cudaStream_t stream);
  /// The CUDA executable graph (owned).
  cudaGraphExec_t get() const noexcept;
  /// mkernel ops per launch, over every rank captured in the graph.
  uint64_t ops() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mk
