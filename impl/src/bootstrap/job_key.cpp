// mkernel — the job key (mk/job_key.hpp): parsing, the key file's permission check, HMAC-SHA256 (OpenSSL's
// libcrypto: no hand-written cryptography) and the operating system's random bytes.
#include "mk/job_key.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "mk/error.hpp"

namespace mk {
namespace {

int hexValue(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool isSpace(char c) noexcept { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

const char* envOrNull(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

JobKey JobKey::fromHex(const std::string& text, const std::string& source) {
  std::size_t b = 0, e = text.size();
  while (b < e && isSpace(text[b])) ++b;
  while (e > b && isSpace(text[e - 1])) --e;
  const std::size_t digits = e - b;
  const std::string want = "a job key is " + std::to_string(2 * kMinBytes) + " to " + std::to_string(2 * kMaxBytes) +
                           " hex digits (e.g. od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')";
  if (digits < 2 * kMinBytes || digits > 2 * kMaxBytes || digits % 2 != 0)
    throw Error(ErrorCode::InvalidArgument, source + " holds " + std::to_string(digits) + " characters, but " + want);
  JobKey k;
  k.bytes_.resize(digits / 2);
  for (std::size_t i = 0; i < digits / 2; ++i) {
    const int hi = hexValue(text[b + 2 * i]), lo = hexValue(text[b + 2 * i + 1]);
    if (hi < 0 || lo < 0)
      throw Error(ErrorCode::InvalidArgument, source + " holds a character that is not a hex digit at position " +
                                                  std::to_string(2 * i + (hi < 0 ? 0 : 1) + 1) + ", but " + want);
    k.bytes_[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return k;
}

JobKey JobKey::fromFile(const std::string& path) {
  const std::string what = "job key file '" + path + "'";
  // O_NOFOLLOW | O_NONBLOCK: a symlink swapped in, or a FIFO, must not be read (or hang the process).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    throw Error(
        errno == ELOOP ? ErrorCode::InvalidArgument : ErrorCode::IoError,
        "cannot open " + what + ": " +
            (errno == ELOOP ? std::string("it is a symbolic link (name the file itself)") : std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(ErrorCode::IoError, "cannot stat " + what + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::InvalidArgument, what + " is not a regular file");
  if (st.st_uid != ::geteuid())
    throw Error(ErrorCode::InvalidArgument, what + " belongs to user id " + std::to_string(st.st_uid) +
                                                ", not to this process's user (" + std::to_string(::geteuid()) + ")");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error(ErrorCode::InvalidArgument, what + " is readable or writable by other users (mode " + mode +
                                                "): chmod 600 it, since whoever reads it can join the job");
  }
  if (st.st_size > 4096) throw Error(ErrorCode::InvalidArgument, what + " is larger than 4096 bytes: not a job key");
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd, text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(ErrorCode::IoError, "cannot read " + what + ": " + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  text.resize(got);
  return fromHex(text, what);
}

JobKey JobKey::generate() {
  JobKey k;
  k.bytes_.resize(32);
  randomBytes(k.bytes_.data(), k.bytes_.size());
  return k;
}

std::string JobKey::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes_) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

JobKey::Mac JobKey::mac(const void* data, std::size_t n) const {
  if (bytes_.empty()) throw Error(ErrorCode::InvalidArgument, "JobKey::mac: no job key");
  Mac out{};
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()), static_cast<const unsigned char*>(data), n,
            out.data(), &len) ||
      len != out.size())
    throw Error(ErrorCode::Internal, "JobKey::mac: HMAC-SHA256 failed in libcrypto");
  return out;
}

bool macEqual(const JobKey::Mac& a, const JobKey::Mac& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void randomBytes(void* out, std::size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t r = ::getrandom(p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(ErrorCode::IoError, std::string("getrandom failed: ") + std::strerror(errno));
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

std::string missingJobKeyText(int processes) {
  return "a job of " + std::to_string(processes) +
         " processes needs a job key, the same on every rank, so that no stranger can join it: set MK_JOB_KEY "
         "(e.g. export MK_JOB_KEY=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')) or MK_JOB_KEY_FILE before "
         "torchrun / mpirun, and pass it to every node (docs/inter-node.md, \"Who may join a job\")";
}

JobKey readJobKey() {
  const char* hex = envOrNull("MK_JOB_KEY");
  const char* file = envOrNull("MK_JOB_KEY_FILE");
  if (hex && file)
    throw Error(ErrorCode::InvalidArgument,
                "both MK_JOB_KEY and MK_JOB_KEY_FILE are set: give the job key one way (unset one of them)");
  if (hex) return JobKey::fromHex(hex, "environment variable MK_JOB_KEY");
  if (file) return JobKey::fromFile(file);
  return {};
}

}  // namespace mk
