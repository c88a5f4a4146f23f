// mkernel — the one error type every layer throws.
#pragma once

#include <stdexcept>
#include <string>

namespace mk {

/// What went wrong, coarse enough for a caller to branch on.
enum class ErrorCode {
  InvalidArgument,  ///< a caller passed a value outside the documented domain
  InvalidSchedule,  ///< a schedule failed validation (message names rank, lane, step)
  ParseError,       ///< malformed or truncated JSON / binary input
  NotFound,         ///< unknown preset, algorithm, file, buffer name
  Unsupported,      ///< valid request this build or machine cannot serve
  Timeout,          ///< a bounded wait expired (message names who waited for what)
  Deadlock,         ///< no participant can make progress
  IoError,          ///< a file could not be read or written
  CudaError,        ///< a CUDA runtime or driver call failed
  NoDevice,         ///< no GPU: no NVIDIA driver on the machine, or the driver sees no device
  DriverTooOld,     ///< the NVIDIA driver is older than the CUDA runtime this build was linked with
  Internal,         ///< a broken invariant inside mkernel (a bug: please report)
};

/// Stable lowercase name of an error code ("invalid-argument", ...).
const char* toString(ErrorCode code) noexcept;

/// The exception thrown by mkernel host code. `what()` is "<code>: <message>".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  /// The coarse category of the failure.
  ErrorCode code() const noexcept { return code_; }
  /// The message without the code prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

/// What a failing CUDA runtime call at start-up means: cudaErrorNoDevice (100), or cudaErrorInsufficientDriver
/// (35) with no driver library to load, is NoDevice; cudaErrorInsufficientDriver with a driver present is
/// DriverTooOld; anything else is CudaError. Takes the runtime's numeric code so that it needs no CUDA header
/// (impl/src/device/ static_asserts the values).
ErrorCode cudaStartupErrorCode(int cudaRuntimeError, bool driverLoadable) noexcept;

/// The one check of a rate, size or count that must be positive: throws Error(InvalidArgument)
/// "<field> must be > 0 (got <v>)", followed by " for <purpose>" when `purpose` is given, unless `v` is finite
/// and > 0.
void requirePositive(const std::string& field, double v, const std::string& purpose = {});
/// The one check of a latency or offset that may be 0: throws Error(InvalidArgument)
/// "<field> must be >= 0 and finite (got <v>)" unless `v` is finite and >= 0.
void requireNonNegative(const std::string& field, double v);

}  // namespace mk
