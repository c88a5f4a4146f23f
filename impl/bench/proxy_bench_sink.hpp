// mkernel — internal to mk-proxy-bench: the sink its receiving process gives the transport. A header of its own so
// the proxy's unit tests check it too (a put outside its buffer is refused, also where offset + bytes wraps).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/proxy/transport.hpp"
#include "mk/util/range.hpp"

namespace mk::bench {

/// Counts what lands; a waiter sleeps until a count is reached. Writes go to one buffer (every put of a size to the
/// same place: the benchmark measures movement, the tests check content).
class CountingSink final : public proxy::ProxySink {
 public:
  /// A sink whose buffer holds `bytes` (at least 1).
  explicit CountingSink(uint64_t bytes) : buffer_(std::max<uint64_t>(bytes, 1)) {}
  void* putDestination(const proxy::PutArrival& a) override {
    if (!rangeInside(a.info.dstOffset, a.info.bytes, buffer_.size()))
      throw Error(ErrorCode::InvalidArgument, "put of bytes " + rangeText(a.info.dstOffset, a.info.bytes) +
                                                  " is outside the benchmark's buffer of " +
                                                  std::to_string(buffer_.size()) + " bytes");
    return buffer_.data() + a.info.dstOffset;
  }
  void putLanded(const proxy::PutArrival&) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++landed_;
    if (landed_ >= target_) cv_.notify_all();
  }
  void control(const proxy::ControlMessage& m) override {
    std::lock_guard<std::mutex> lock(mu_);
    acks_.push_back(m.value);
    cv_.notify_all();
  }
  void failed(const Error& e) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = e.what();
    cv_.notify_all();
  }
  /// Wait until `count` puts landed since the last reset (throws the transport's failure, or a timeout).
  void waitLanded(uint64_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    target_ = count;
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return landed_ >= count || !error_.empty(); }))
      throw Error(ErrorCode::Timeout,
                  "only " + std::to_string(landed_) + " of " + std::to_string(count) + " puts landed within 60 s");
    if (!error_.empty()) throw Error(ErrorCode::IoError, error_);
    landed_ -= count;
  }
  /// Wait for the next ack (a control message) and return its value.
  uint64_t waitAck() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return !acks_.empty() || !error_.empty(); }))
      throw Error(ErrorCode::Timeout, "no acknowledgement within 60 s");
    if (!error_.empty()) throw Error(ErrorCode::IoError, error_);
    const uint64_t v = acks_.front();
    acks_.erase(acks_.begin());
    return v;
  }

 private:
  std::vector<std::byte> buffer_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t landed_ = 0, target_ = UINT64_MAX;
  std::vector<uint64_t> acks_;
  std::string error_;
};

}  // namespace mk::bench
