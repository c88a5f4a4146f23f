// mkernel — internal: the socket transport's bounded byte streams. A write or a read inside a frame fails when the
// connection makes no progress for the budget (a stalled peer), not when a large frame simply takes long; the wait
// for the next frame's first byte is unbounded (an idle connection is normal) but stops when asked to.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mk::proxy {

/// Write every byte of `iov[0..count)` to the non-blocking socket `fd`. Throws Error(Timeout) "<who>: stalled: no
/// byte accepted for B ms (is it still running and reading?)" or Error(IoError) "<who>: the connection broke while
/// sending: ... (did that process die?)". `iov` is consumed (advanced) as bytes go out.
void writeAll(int fd, iovec* iov, int count, std::chrono::milliseconds budget, const std::string& who);

/// Reads frames from one non-blocking socket through a buffer (many small frames per recv), and large payloads
/// straight into their destination.
class FrameReader {
 public:
  FrameReader(int fd, std::size_t bufferBytes, std::chrono::milliseconds budget, std::string who);

  /// Wait for the first byte of the next frame (unbounded; returns false when `stop` is raised or the peer closed
  /// the connection at this frame boundary), then read `n` bytes of it (bounded: readExact()).
  bool readFrameStart(void* dst, std::size_t n, const std::atomic<bool>& stop);
  /// Read exactly `n` bytes within the frame: buffered bytes first, then straight from the socket. Throws
  /// Error(ParseError) "<who>: <what> is truncated: the connection closed after X of N bytes" when the peer
  /// closes, Error(Timeout) "<who>: <what> stalled: ..." after the budget without a byte. A piece of a larger whole
  /// passes `before` (bytes of the whole already read) and `total` (its size) so messages count the whole.
  void readExact(void* dst, std::size_t n, const std::string& what, uint64_t before = 0, uint64_t total = 0);

 private:
  /// recv into the buffer; returns bytes read (0: the peer closed). Waits up to the budget (or forever with
  /// `stop`, returning 0 once it is raised).
  std::size_t fill(bool bounded, const std::atomic<bool>* stop, const std::string& what);

  int fd_;
  std::chrono::milliseconds budget_;
  std::string who_;
  std::vector<uint8_t> buf_;
  std::size_t begin_ = 0, end_ = 0;
};

}  // namespace mk::proxy
