// mkernel — bounded TCP helpers (socket_util.hpp).
#include "net/socket_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mk/error.hpp"

namespace mk::net {

Clock::time_point deadlineAfter(double ms) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

double msLeft(Clock::time_point deadline) {
  return std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
}

std::string sysError(int err) { return std::strerror(err); }

void setNonBlocking(int fd, const std::string& context) {
  const int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    throw Error(ErrorCode::IoError, context + ": fcntl(O_NONBLOCK) failed: " + sysError(errno));
}

void noDelay(int fd) noexcept {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool waitFd(int fd, short events, Clock::time_point deadline, const std::string& context) {
  for (;;) {
    const double left = msLeft(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    // At most a second per poll: a clock that jumps or a huge budget still re-checks the deadline.
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left + 1, 1000.0)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) throw Error(ErrorCode::IoError, context + ": poll failed: " + sysError(errno));
  }
}

void sendAll(int fd, const void* data, std::size_t n, Clock::time_point deadline, const std::string& context,
             const std::string& who) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!waitFd(fd, POLLOUT, deadline, context))
        throw Error(ErrorCode::Timeout, context + ": sending to " + who + " timed out (is it still running?)");
      continue;
    }
    throw Error(ErrorCode::IoError,
                context + ": sending to " + who + " failed: " + sysError(errno) + " (did that process die?)");
  }
}

void recvAll(int fd, void* data, std::size_t n, Clock::time_point deadline, const std::string& context,
             const std::string& who) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0)
      throw Error(ErrorCode::IoError, context + ": " + who + " closed the connection (did that process die or fail?)");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!waitFd(fd, POLLIN, deadline, context))
        throw Error(ErrorCode::Timeout, context + ": " + who +
                                            " did not answer in time (is it still running, and "
                                            "calling the same collective?)");
      continue;
    }
    if (errno == ECONNRESET)
      throw Error(ErrorCode::IoError, context + ": " + who + " reset the connection (did that process die or fail?)");
    throw Error(ErrorCode::IoError, context + ": receiving from " + who + " failed: " + sysError(errno));
  }
}

sockaddr_in resolveIPv4(const std::string& host, uint16_t port, const std::string& context, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int e = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (e != 0 || !res)
    throw Error(ErrorCode::IoError, context + ": cannot resolve " + what + " '" + host + "': " + gai_strerror(e));
  sockaddr_in a{};
  std::memcpy(&a, res->ai_addr, sizeof a);
  freeaddrinfo(res);
  a.sin_port = htons(port);
  return a;
}

std::string formatAddress(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
  return std::string(text) + ":" + std::to_string(ntohs(address.sin_port));
}

}  // namespace mk::net
