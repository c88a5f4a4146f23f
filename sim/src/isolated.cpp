// mkernel — a simulation in a process of its own (runIsolated, replay.hpp) and its Prediction through the pipe
// (isolated.hpp).
#include "isolated.hpp"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mk/error.hpp"
#include "mk/sim/replay.hpp"

namespace mk::sim {
namespace {

// ---- results through a pipe ---------------------------------------------------------------------------------

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    buf_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void putString(const std::string& s) {
    put<uint64_t>(s.size());
    buf_ += s;
  }
  template <class T>
  void putVector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(buf_); }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(const std::string& b) : buf_(b) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string getString() {
    const auto n = static_cast<std::size_t>(get<uint64_t>());
    need(n);
    std::string s = buf_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  template <class T>
  std::vector<T> getVector() {
    const auto n = static_cast<std::size_t>(get<uint64_t>());
    if (n > (buf_.size() - pos_) / sizeof(T)) fail();
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), buf_.data() + pos_, n * sizeof(T));  // an empty vector's data() may be null
    pos_ += n * sizeof(T);
    return v;
  }

 private:
  void need(std::size_t n) const {
    if (buf_.size() - pos_ < n) fail();
  }
  [[noreturn]] static void fail() {
    throw Error(ErrorCode::Internal, "the simulation process sent a truncated result");
  }
  const std::string& buf_;
  std::size_t pos_ = 0;
};

bool writeAll(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

namespace detail {

std::string serialize(const Prediction& p) {
  Writer w;
  w.put(p.totalUs);
  w.putVector(p.steps);
  w.put<uint64_t>(p.links.size());
  for (const LinkLoad& l : p.links) {
    w.putString(l.name);
    w.put(l.bandwidthGBs);
    w.put(l.bytes);
    w.put(l.avgGBs);
    w.put(l.peakGBs);
    w.put(l.utilization);
  }
  w.put(p.stats);
  return w.take();
}

Prediction deserialize(const std::string& bytes) {
  Reader r(bytes);
  Prediction p;
  p.totalUs = r.get<double>();
  p.steps = r.getVector<StepRecord>();
  const auto nLinks = r.get<uint64_t>();
  for (uint64_t i = 0; i < nLinks; ++i) {
    LinkLoad l;
    l.name = r.getString();
    l.bandwidthGBs = r.get<double>();
    l.bytes = r.get<double>();
    l.avgGBs = r.get<double>();
    l.peakGBs = r.get<double>();
    l.utilization = r.get<double>();
    p.links.push_back(std::move(l));
  }
  p.stats = r.get<SimStats>();
  return p;
}

}  // namespace detail

std::string runIsolated(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error(ErrorCode::Internal, std::string("cannot create a pipe: ") + std::strerror(errno));
  std::fflush(nullptr);  // or buffered output would be written twice, once by each process
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(ErrorCode::Internal, std::string("cannot fork the simulation process: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // The child must not outlive mk-sim: killed with its parent, and gone at once if the parent died between
    // fork and prctl (then the child was already adopted and getppid no longer names the parent).
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(4);
    ::close(fds[0]);
    char tag = 'O';
    std::string payload;
    try {
      payload = body();
    } catch (const Error& e) {
      tag = 'E';
      payload = std::string(1, static_cast<char>(e.code())) + e.message();
    } catch (const std::bad_alloc&) {
      tag = 'M';  // the parent throws it again: out of memory is exit 5, not an internal failure
      payload.clear();
    } catch (const std::exception& e) {
      tag = 'X';
      payload = e.what();
    } catch (...) {
      tag = 'X';
      payload = "unknown exception";
    }
    const uint64_t n = payload.size();
    const bool ok = writeAll(fds[1], &tag, 1) && writeAll(fds[1], reinterpret_cast<const char*>(&n), sizeof n) &&
                    writeAll(fds[1], payload.data(), payload.size());
    ::close(fds[1]);
    std::fflush(nullptr);
    // _exit, not exit: the child must not run the parent's atexit handlers or static destructors (doctest,
    // SimGrid's engine) a second time.
    ::_exit(ok ? 0 : 3);
  }
  ::close(fds[1]);
  std::string data;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fds[0], chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    data.append(chunk, static_cast<std::size_t>(got));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  uint64_t n = 0;
  if (data.size() >= 1 + sizeof n) std::memcpy(&n, data.data() + 1, sizeof n);
  if (data.size() < 1 + sizeof n || data.size() - 1 - sizeof n != n) {
    if (WIFSIGNALED(status))
      throw Error(ErrorCode::Internal, "the simulation process was killed by signal " +
                                           std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
                                           "): SimGrid aborted or memory ran out; rerun with --verbose");
    throw Error(ErrorCode::Internal, "the simulation process exited (status " +
                                         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                         ") without sending a result");
  }
  const char tag = data[0];
  std::string payload = data.substr(1 + sizeof n);
  if (tag == 'O') return payload;
  if (tag == 'M') throw std::bad_alloc();
  if (tag == 'E' && !payload.empty())
    throw Error(static_cast<ErrorCode>(static_cast<unsigned char>(payload[0])), payload.substr(1));
  throw Error(ErrorCode::Internal, "in the simulation process: " + payload);
}

}  // namespace mk::sim
