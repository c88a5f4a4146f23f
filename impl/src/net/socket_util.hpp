// mkernel — bounded TCP helpers shared by the bootstrap's rendezvous and the socket transport: deadlines, poll,
// send / receive everything or throw mk::Error naming the peer, IPv4 name resolution.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mk::net {

using Clock = std::chrono::steady_clock;

/// Now + `ms` milliseconds.
Clock::time_point deadlineAfter(double ms);
/// Milliseconds until `deadline` (negative once it passed).
double msLeft(Clock::time_point deadline);
/// strerror(err) as a string.
std::string sysError(int err);

/// O_NONBLOCK on `fd`; throws Error(IoError) "<context>: fcntl(O_NONBLOCK) failed: ...".
void setNonBlocking(int fd, const std::string& context);
/// TCP_NODELAY on `fd` (best effort: small frames must not wait for Nagle's timer).
void noDelay(int fd) noexcept;

/// Wait until `fd` is ready for `events` or `deadline` passes; false on timeout. Throws Error(IoError) when poll
/// itself fails.
bool waitFd(int fd, short events, Clock::time_point deadline, const std::string& context);

/// Send all `n` bytes on a non-blocking socket before `deadline`. Throws Error(Timeout) "<context>: sending to <who>
/// timed out (is it still running?)" or Error(IoError) "<context>: sending to <who> failed: ... (did that process
/// die?)".
void sendAll(int fd, const void* data, std::size_t n, Clock::time_point deadline, const std::string& context,
             const std::string& who);
/// Receive exactly `n` bytes before `deadline`. Throws Error(IoError) when the peer closes or resets the
/// connection, Error(Timeout) "<context>: <who> did not answer in time (...)".
void recvAll(int fd, void* data, std::size_t n, Clock::time_point deadline, const std::string& context,
             const std::string& who);

/// IPv4 address of `host` (numeric or a name) with `port`. Throws Error(IoError) "<context>: cannot resolve
/// <what> '<host>': ...".
sockaddr_in resolveIPv4(const std::string& host, uint16_t port, const std::string& context, const std::string& what);

/// "a.b.c.d:port" of an IPv4 socket address.
std::string formatAddress(const sockaddr_in& address);

}  // namespace mk::net
