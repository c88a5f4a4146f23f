// mkernel — the socket transport's bounded byte streams (socket_stream.hpp).
#include "proxy/socket_stream.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mk/error.hpp"
#include "net/socket_util.hpp"

namespace mk::proxy {
namespace {

/// Poll `fd` for `events` up to `ms` (-1: forever, in 200 ms slices so `stop` is seen). True when ready.
bool pollFor(int fd, short events, long long ms, const std::atomic<bool>* stop) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms < 0 ? 0 : ms);
  for (;;) {
    if (stop && stop->load(std::memory_order_relaxed)) return false;
    long long left = 200;
    if (ms >= 0) {
      left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left < 0) return false;
      left = std::min<long long>(left + 1, 200);
    }
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR)
      throw Error(ErrorCode::IoError, std::string("socket transport: poll failed: ") + net::sysError(errno));
  }
}

}  // namespace

void writeAll(int fd, iovec* iov, int count, std::chrono::milliseconds budget, const std::string& who) {
  while (count > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --count;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(std::min(count, 64));
    const ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w > 0) {
      auto left = static_cast<std::size_t>(w);
      while (left > 0) {
        const std::size_t take = std::min(left, iov->iov_len);
        iov->iov_base = static_cast<char*>(iov->iov_base) + take;
        iov->iov_len -= take;
        left -= take;
        if (iov->iov_len == 0) {
          ++iov;
          --count;
        }
      }
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!pollFor(fd, POLLOUT, budget.count(), nullptr))
        throw Error(ErrorCode::Timeout, who + ": stalled: no byte accepted for " + std::to_string(budget.count()) +
                                            " ms (is that process still running and reading?)");
      continue;
    }
    throw Error(ErrorCode::IoError,
                who + ": the connection broke while sending: " + net::sysError(errno) + " (did that process die?)");
  }
}

FrameReader::FrameReader(int fd, std::size_t bufferBytes, std::chrono::milliseconds budget, std::string who)
    : fd_(fd), budget_(budget), who_(std::move(who)), buf_(bufferBytes) {}

std::size_t FrameReader::fill(bool bounded, const std::atomic<bool>* stop, const std::string& what) {
  if (begin_ == end_) begin_ = end_ = 0;
  if (end_ == buf_.size()) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  for (;;) {
    const ssize_t r = ::recv(fd_, buf_.data() + end_, buf_.size() - end_, 0);
    if (r > 0) {
      end_ += static_cast<std::size_t>(r);
      return static_cast<std::size_t>(r);
    }
    if (r == 0) return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!pollFor(fd_, POLLIN, bounded ? budget_.count() : -1, stop)) {
        if (!bounded) return 0;  // asked to stop
        throw Error(ErrorCode::Timeout, who_ + ": " + what + " stalled: no byte arrived for " +
                                            std::to_string(budget_.count()) + " ms (is that process still running?)");
      }
      continue;
    }
    if (errno == ECONNRESET) return 0;  // a reset reads as a close: the caller says what was cut
    throw Error(ErrorCode::IoError, who_ + ": receive failed: " + net::sysError(errno));
  }
}

bool FrameReader::readFrameStart(void* dst, std::size_t n, const std::atomic<bool>& stop) {
  if (begin_ == end_ && fill(false, &stop, "the next frame") == 0) return false;
  readExact(dst, n, "a frame header");
  return true;
}

void FrameReader::readExact(void* dst, std::size_t n, const std::string& what, uint64_t before, uint64_t total) {
  if (total == 0) total = n;
  auto* out = static_cast<uint8_t*>(dst);
  std::size_t got = 0;
  const std::size_t buffered = std::min(n, end_ - begin_);
  if (buffered) std::memcpy(out, buf_.data() + begin_, buffered);  // out may be null when n is 0
  begin_ += buffered;
  got += buffered;
  while (got < n) {
    const std::size_t want = n - got;
    if (want < buf_.size() / 2) {
      // Small: through the buffer, so the frames behind it arrive with the same recv.
      if (fill(true, nullptr, what) == 0)
        throw Error(ErrorCode::ParseError, who_ + ": " + what + " is truncated: the connection closed after " +
                                               std::to_string(before + got) + " of " + std::to_string(total) +
                                               " bytes");
      const std::size_t take = std::min(want, end_ - begin_);
      std::memcpy(out + got, buf_.data() + begin_, take);
      begin_ += take;
      got += take;
      continue;
    }
    // Large: straight into the destination.
    const ssize_t r = ::recv(fd_, out + got, want, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!pollFor(fd_, POLLIN, budget_.count(), nullptr))
        throw Error(ErrorCode::Timeout, who_ + ": " + what + " stalled: no byte arrived for " +
                                            std::to_string(budget_.count()) + " ms after " +
                                            std::to_string(before + got) + " of " + std::to_string(total) +
                                            " bytes (is that process still running?)");
      continue;
    }
    if (r == 0 || errno == ECONNRESET)
      throw Error(ErrorCode::ParseError, who_ + ": " + what + " is truncated: the connection closed after " +
                                             std::to_string(before + got) + " of " + std::to_string(total) + " bytes");
    throw Error(ErrorCode::IoError, who_ + ": receive failed: " + net::sysError(errno));
  }
}

}  // namespace mk::proxy
