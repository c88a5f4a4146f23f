// mkernel — the file helpers every tool shares (mk/schedule/io.hpp): read a whole file, write one atomically,
// the one check of an output path (not a device, FIFO or directory; not one of the command's inputs), a set of
// outputs written all or nothing, and the removal of temporaries when a signal ends the process.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/schedule/io.hpp"

namespace mk {

std::string readFile(const std::string& path, std::size_t maxBytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::IoError, "cannot open '" + path + "' for reading: " + std::strerror(errno));
  std::string out;
  std::vector<char> buf(std::size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    out.append(buf.data(), static_cast<std::size_t>(in.gcount()));
    if (out.size() > maxBytes)
      throw Error(ErrorCode::ParseError,
                  path + ": longer than the limit of " + std::to_string(maxBytes) + " bytes for this kind of file");
  }
  if (in.bad()) throw Error(ErrorCode::IoError, "error while reading '" + path + "'");
  return out;
}

namespace {

/// "" when `path` may be replaced by a rename (absent, or a regular file), else what it is.
std::string nonRegularKind(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // follows links: a link to /dev/null is refused too
  if (ec || !fs::exists(st) || fs::is_regular_file(st)) return {};
  if (fs::is_directory(st)) return "a directory";
  if (fs::is_fifo(st)) return "a FIFO";
  if (fs::is_character_file(st) || fs::is_block_file(st)) return "a device";
  if (fs::is_socket(st)) return "a socket";
  return "not a regular file";
}

}  // namespace

void checkOutputPath(const std::string& option, const std::string& path, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const fs::path p(resolveOutputTarget(path));  // through a symbolic link, its target is what gets written
  std::error_code ec;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::IoError, option + " " + path + ": directory '" + dir.string() + "' does not exist");
  const std::string kind = nonRegularKind(path);
  if (!kind.empty())
    throw Error(ErrorCode::InvalidArgument,
                option + " " + path + ": is " + kind + "; an output must be a regular file or a new path");
  for (const std::string& in : inputs) {
    if (!in.empty() && fs::equivalent(p, fs::path(in), ec))
      throw Error(ErrorCode::InvalidArgument,
                  option + " " + path + ": is also an input of this command (" + in + "); it would be overwritten");
  }
}

namespace {

// ---- temporaries removed on SIGINT / SIGTERM / SIGHUP -------------------------------------------------------
// A fixed table, so that the handler reads it without allocating or locking: a slot is claimed (0 -> 1), filled,
// then published (2); the handler only touches published slots of the process that registered them (a forked
// simulation child inherits the table and the handler, and must not remove its parent's files).
constexpr int kTempSlots = 64;
constexpr std::size_t kTempPathMax = 4096;
struct TempSlot {
  std::atomic<int> state{0};
  bool directory = false;
  pid_t owner = 0;
  char path[kTempPathMax] = {};
};
TempSlot gTempSlots[kTempSlots];

void removeTemporaries(int sig) {
  const pid_t self = ::getpid();
  for (TempSlot& slot : gTempSlots) {
    if (slot.state.load(std::memory_order_acquire) != 2 || slot.owner != self) continue;
    if (!slot.directory) {
      ::unlink(slot.path);
      continue;
    }
    // No async-signal-safe recursive removal exists: fork and exec rm, both safe in a handler.
    const pid_t child = ::fork();
    if (child == 0) {
      char rm[] = "rm", rf[] = "-rf", dd[] = "--";
      char* argv[] = {rm, rf, dd, slot.path, nullptr};
      char* envp[] = {nullptr};
      ::execve("/bin/rm", argv, envp);
      ::_exit(127);
    }
    if (child > 0) ::waitpid(child, nullptr, 0);
  }
  // The default action, so the parent sees the process killed by `sig` (exit status 128 + sig in a shell).
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

/// Install the handler for SIGINT, SIGTERM and SIGHUP where it is not already there; checked at every registration,
/// since a test harness (doctest) may have put its own back. A signal that is ignored stays ignored (nohup).
void installHandlers() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN || old.sa_handler == removeTemporaries) continue;
    struct sigaction sa {};
    sa.sa_handler = removeTemporaries;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
}

std::string tmpNameFor(const std::string& path) {
  return path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
}

/// Write `text` to `tmp` (created or truncated) and fsync it; throws IoError about `path`.
void writeTemporary(const std::string& path, const std::string& tmp, const std::string& text) {
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    throw Error(ErrorCode::IoError,
                "cannot write '" + path + "': cannot create temporary file '" + tmp + "': " + std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = ok ? 0 : errno;
  if (ok && std::fflush(f) != 0) ok = false, err = errno;
  // fsync so that a crash after the rename cannot expose an empty file under the final name.
  if (ok && ::fsync(::fileno(f)) != 0) ok = false, err = errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(ErrorCode::IoError, "cannot write '" + path + "': " + std::strerror(err));
  }
}

void requireReplaceable(const std::string& path) {
  if (const std::string kind = nonRegularKind(path); !kind.empty())
    throw Error(ErrorCode::IoError, "cannot write '" + path + "': it is " + kind + ", not a regular file");
}

}  // namespace

TempGuard::TempGuard(const std::string& path, bool directory) {
  if (path.size() >= kTempPathMax) return;  // not removable on a signal; the owner still removes it normally
  installHandlers();
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = 0;
    if (!gTempSlots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) continue;
    TempSlot& slot = gTempSlots[i];
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.directory = directory;
    slot.owner = ::getpid();
    slot.state.store(2, std::memory_order_release);
    slot_ = i;
    return;
  }
}

TempGuard::~TempGuard() {
  if (slot_ >= 0) gTempSlots[slot_].state.store(0, std::memory_order_release);
}

void writeFileAtomic(const std::string& path, const std::string& text) {
  requireReplaceable(path);
  // Through a symbolic link the link is kept and its target replaced, as cp and shell redirection do: the temporary
  // goes next to the target (same file system, so the rename cannot fail with EXDEV).
  const std::string target = resolveOutputTarget(path);
  const std::string tmp = tmpNameFor(target);
  const TempGuard guard(tmp, false);
  writeTemporary(path, tmp, text);
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(ErrorCode::IoError, "cannot write '" + path + "': " + std::strerror(err));
  }
}

OutputSet::~OutputSet() {
  for (const Entry& e : staged_) std::remove(e.tmp.c_str());
}

void OutputSet::stage(const std::string& option, const std::string& path, const std::string& text) {
  if (path.empty()) return;
  requireReplaceable(path);
  const std::string target = resolveOutputTarget(path);  // written through a symbolic link, as writeFileAtomic
  Entry e{option, path, target, tmpNameFor(target)};
  // Guarded from creation to commit: a signal in between removes it.
  staged_.push_back(e);
  guards_.push_back(std::make_unique<TempGuard>(e.tmp, false));
  try {
    writeTemporary(path, e.tmp, text);
  } catch (const Error& err) {
    throw Error(ErrorCode::IoError, option + " " + err.message());
  }
}

void OutputSet::commit() {
  for (std::size_t i = 0; i < staged_.size(); ++i) {
    const Entry& e = staged_[i];
    if (std::rename(e.tmp.c_str(), e.target.c_str()) != 0)
      throw Error(ErrorCode::IoError,
                  e.option + " " + e.path + ": cannot move the finished file into place: " + std::strerror(errno));
  }
  staged_.clear();
  guards_.clear();
}

}  // namespace mk
