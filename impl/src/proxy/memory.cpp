// mkernel — host memory as a transport sees it (mk/proxy/memory.hpp: HostCopier).
#include <cstring>
#include <new>

#include "mk/error.hpp"
#include "mk/proxy/memory.hpp"

namespace mk::proxy {
namespace {

/// Copies are memcpy: each ticket is complete when issued.
class HostCopyStream final : public CopyStream {
 public:
  uint64_t copyOut(void* staging, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(staging, src, bytes);
    return ++ticket_;
  }
  uint64_t copyIn(void* dst, const void* staging, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, staging, bytes);
    return ++ticket_;
  }
  void wait(uint64_t ticket, std::chrono::milliseconds /*budget*/) override {
    if (ticket > ticket_)
      throw Error(ErrorCode::Internal, "HostCopier: wait for copy " + std::to_string(ticket) + ", only " +
                                           std::to_string(ticket_) + " were issued");
  }

 private:
  uint64_t ticket_ = 0;
};

/// Staging buffers are aligned to a page (like pinned host memory) so the sizes and alignments the transports see
/// are those a GPU engine gives them.
constexpr std::size_t kStagingAlign = 4096;

}  // namespace

void* HostCopier::allocateStaging(std::size_t bytes) {
  return ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{kStagingAlign});
}

void HostCopier::freeStaging(void* staging) noexcept { ::operator delete (staging, std::align_val_t{kStagingAlign}); }

std::unique_ptr<CopyStream> HostCopier::openStream() { return std::make_unique<HostCopyStream>(); }

}  // namespace mk::proxy
