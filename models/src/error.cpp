#include "mk/error.hpp"

#include <cmath>

#include "mk/util/size.hpp"

namespace mk {

const char* toString(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument: return "invalid-argument";
    case ErrorCode::InvalidSchedule: return "invalid-schedule";
    case ErrorCode::ParseError: return "parse-error";
    case ErrorCode::NotFound: return "not-found";
    case ErrorCode::Unsupported: return "unsupported";
    case ErrorCode::Timeout: return "timeout";
    case ErrorCode::Deadlock: return "deadlock";
    case ErrorCode::IoError: return "io-error";
    case ErrorCode::CudaError: return "cuda-error";
    case ErrorCode::NoDevice: return "no-gpu";
    case ErrorCode::DriverTooOld: return "driver-too-old";
    case ErrorCode::Internal: return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(std::string(toString(code)) + ": " + message), code_(code), message_(message) {}

ErrorCode cudaStartupErrorCode(int cudaRuntimeError, bool driverLoadable) noexcept {
  constexpr int kInsufficientDriver = 35;  // cudaErrorInsufficientDriver
  constexpr int kNoDevice = 100;           // cudaErrorNoDevice
  if (cudaRuntimeError == kNoDevice) return ErrorCode::NoDevice;
  if (cudaRuntimeError == kInsufficientDriver) return driverLoadable ? ErrorCode::DriverTooOld : ErrorCode::NoDevice;
  return ErrorCode::CudaError;
}

void requirePositive(const std::string& field, double v, const std::string& purpose) {
  if (!std::isfinite(v) || !(v > 0))
    throw Error(ErrorCode::InvalidArgument, field + " must be > 0 (got " + formatNumber(v) + ")" +
                                                (purpose.empty() ? std::string() : " for " + purpose));
}

void requireNonNegative(const std::string& field, double v) {
  if (!std::isfinite(v) || v < 0)
    throw Error(ErrorCode::InvalidArgument, field + " must be >= 0 and finite (got " + formatNumber(v) + ")");
}

}  // namespace mk
