// mkernel — how the proxy and the transports reach an engine's memory: chunk copies between engine memory (host
// or GPU) and host staging buffers, each with a completion the caller waits for, so a GPU engine can use
// asynchronous copies (a stream and events) that overlap the network.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace mk::proxy {

/// One thread's path for chunk copies (a GPU implementation: a CUDA stream, an event per ticket). Used by one
/// thread at a time; tickets complete in the order they were issued.
class CopyStream {
 public:
  virtual ~CopyStream() = default;
  /// Start copying `bytes` from engine memory `src` into host staging `staging` (from allocateStaging).
  /// Returns a ticket for wait().
  virtual uint64_t copyOut(void* staging, const void* src, std::size_t bytes) = 0;
  /// Start copying `bytes` from host staging `staging` into engine memory `dst`. Returns a ticket.
  virtual uint64_t copyIn(void* dst, const void* staging, std::size_t bytes) = 0;
  /// Return once copy `ticket` and every earlier one on this stream are complete. Throws Error(Timeout) after
  /// `budget` (naming the copy), or the engine's error when a copy failed.
  virtual void wait(uint64_t ticket, std::chrono::milliseconds budget) = 0;
};

/// An engine's memory as the transports see it. Shared by every proxy and receiver thread (thread-safe).
class MemoryCopier {
 public:
  virtual ~MemoryCopier() = default;
  /// True when engine memory is ordinary host memory the transports may read and write directly (no staging, no
  /// copies: a socket sends from the source and receives into the destination).
  virtual bool directAccess() const noexcept = 0;
  /// Host staging memory of `bytes` bytes for copyOut / copyIn (a GPU engine: pinned, so copies are
  /// asynchronous). Throws when it cannot be had.
  virtual void* allocateStaging(std::size_t bytes) = 0;
  /// Release memory from allocateStaging. Never throws.
  virtual void freeStaging(void* staging) noexcept = 0;
  /// A copy path for the calling thread.
  virtual std::unique_ptr<CopyStream> openStream() = 0;
};

/// Engine memory that is host memory (the CPU executor, tools, tests): copies are memcpy, complete on return.
class HostCopier final : public MemoryCopier {
 public:
  /// `direct` false forces the staged path (a copy into a staging buffer per chunk, as for a GPU), which tests and
  /// the benchmark use to run the pipeline a GPU engine runs.
  explicit HostCopier(bool direct = true) noexcept : direct_(direct) {}
  bool directAccess() const noexcept override { return direct_; }
  void* allocateStaging(std::size_t bytes) override;
  void freeStaging(void* staging) noexcept override;
  std::unique_ptr<CopyStream> openStream() override;

 private:
  bool direct_;
};

/// Owns one buffer from MemoryCopier::allocateStaging.
class StagingBuffer {
 public:
  /// No memory.
  StagingBuffer() = default;
  /// `bytes` of staging from `copier` (which must outlive this buffer).
  StagingBuffer(MemoryCopier& copier, std::size_t bytes) : copier_(&copier), data_(copier.allocateStaging(bytes)) {}
  ~StagingBuffer() {
    if (data_) copier_->freeStaging(data_);
  }
  StagingBuffer(StagingBuffer&& o) noexcept : copier_(o.copier_), data_(o.data_) { o.data_ = nullptr; }
  StagingBuffer& operator=(StagingBuffer&& o) noexcept {
    if (this != &o) {
      if (data_) copier_->freeStaging(data_);
      copier_ = o.copier_;
      data_ = o.data_;
      o.data_ = nullptr;
    }
    return *this;
  }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  /// The memory (null when default-constructed).
  std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }

 private:
  MemoryCopier* copier_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace mk::proxy
