// mkernel — the job key: the secret every process of one multi-process job is given by its launcher, and that a
// stranger never sees. The TCP rendezvous (mk/bootstrap.hpp) admits a process only after it proved, by an HMAC
// over fresh nonces, that it holds the key; the key itself never crosses the network. Threat model and set-up:
// docs/inter-node.md, "Who may join a job".
//
// A launcher gives the key as MK_JOB_KEY (hex) in every rank's environment, or as MK_JOB_KEY_FILE, a file of
// hex digits that only the job's user may read. The environment of a process is readable only by its user
// (/proc/<pid>/environ is mode 0400), so both keep the key from other users of the machine.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mk {

/// A per-job secret of 16 to 64 bytes. Empty when no key was given. Never printed: messages name where a key came
/// from, never its digits.
class JobKey {
 public:
  static constexpr std::size_t kMinBytes = 16;  ///< 128 bits: below that a key could be guessed
  static constexpr std::size_t kMaxBytes = 64;  ///< the HMAC-SHA256 block: longer keys add nothing
  static constexpr std::size_t kMacBytes = 32;  ///< HMAC-SHA256
  /// An HMAC-SHA256 tag.
  using Mac = std::array<uint8_t, kMacBytes>;

  /// No key.
  JobKey() = default;
  /// The key spelled by `hex` (2 * kMinBytes to 2 * kMaxBytes hex digits, either case; surrounding white space
  /// ignored). Throws Error(InvalidArgument) naming `source` (e.g. "MK_JOB_KEY") and what is wrong, never the text.
  static JobKey fromHex(const std::string& hex, const std::string& source);
  /// The key in the file at `path` (hex, as fromHex). The file must be a regular file owned by this process's user
  /// and readable by nobody else (mode 0600 or 0400), as ssh demands of a private key. Throws Error(InvalidArgument
  /// or IoError) naming the path.
  static JobKey fromFile(const std::string& path);
  /// 32 fresh random bytes from the operating system (getrandom): for a launcher that makes the job's key.
  static JobKey generate();

  /// Whether no key was given.
  bool empty() const noexcept { return bytes_.empty(); }
  /// The key as lowercase hex, for a launcher handing it to its children. Never log it.
  std::string hex() const;
  /// HMAC-SHA256 of `n` bytes at `data` under this key. Throws Error(InvalidArgument) when the key is empty.
  Mac mac(const void* data, std::size_t n) const;

 private:
  std::vector<uint8_t> bytes_;
};

/// Whether two tags are equal, in time independent of where they differ (a timing side channel must not reveal a
/// tag byte by byte).
bool macEqual(const JobKey::Mac& a, const JobKey::Mac& b) noexcept;

/// `n` fresh random bytes from the operating system (getrandom). Throws Error(IoError) when it fails.
void randomBytes(void* out, std::size_t n);

/// "a job of <processes> processes needs a job key, ... how to make and give one": the one explanation of a missing
/// key, for every place that refuses a job without one.
std::string missingJobKeyText(int processes);

/// The job key of this process's launch: MK_JOB_KEY (hex) or MK_JOB_KEY_FILE (a path), empty when neither is set.
/// Throws Error(InvalidArgument) when both are set, or when the one that is set is malformed (naming it).
JobKey readJobKey();

}  // namespace mk
