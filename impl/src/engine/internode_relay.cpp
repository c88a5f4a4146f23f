// mkernel — the inter-node path's relay and failures (engine/internode.hpp): this rank's done and entered counts
// sent to the ranks of other nodes (on the proxy's consumer thread, ProxyOptions::poll), and a failure of any side
// turned into an error everywhere.
#include <string>
#include <tuple>

#include "engine/engine_context.hpp"
#include "engine/host_log.hpp"
#include "engine/host_sync.hpp"
#include "engine/internode.hpp"

namespace mk::runtime {

void InterNode::noteSubmitted() {
  submitted_.fetch_add(1, std::memory_order_release);
  if (proxy_) proxy_->wake();  // the relay runs on the proxy's thread: cut its idle sleep short
}

bool InterNode::relayOnce() {
  const int me = ctx_.me;
  const auto n = static_cast<uint32_t>(ctx_.ranks.size());
  const device::RankMailbox& mb = ctx_.mailboxes[me];
  const uint32_t done = loadHost(&mb.doneOut), entered = loadHost(&mb.enteredOut);
  for (const auto& [code, value, sent] : {std::make_tuple(RelayCode::Entered, entered, &sentEntered_),
                                          std::make_tuple(RelayCode::Done, done, &sentDone_)}) {
    if (value == *sent) continue;
    for (uint32_t q = 0; q < n; ++q) {
      if (ctx_.sameNode(static_cast<int>(q), me)) continue;
      proxy::ControlMessage m;
      m.code = static_cast<uint16_t>(code);
      m.srcRank = static_cast<uint32_t>(me);
      m.dstRank = q;
      m.value = value;
      proxy_->sendControl(m);
    }
    *sent = value;
  }
  // A failure of this rank's kernel (a bounded wait expired): the other nodes stop too, told why.
  if (loadHost(&ctx_.status->abort) != 0 && failure(nullptr).empty() && !failedSent_.load()) {
    const auto code = static_cast<device::Status>(ctx_.status->code);
    if (code != device::Status::HostAbort)
      fail(Error(ErrorCode::Timeout, "rank " + std::to_string(me) + ": " + describeDeviceFailure_()));
  }
  // Busy while an op this rank submitted is not done here: the proxy keeps spinning.
  return !seqGeq(sentDone_, submitted_.load(std::memory_order_acquire));
}

void InterNode::failed(const Error& error) noexcept {
  {
    std::lock_guard<std::mutex> lock(failMu_);
    if (!failure_.empty()) return;
    failure_ = error.message();
    failureCode_ = error.code();
  }
  MK_LOG_AT(Info, rankName(ctx_.me), "inter-node path failed: " + error.message());
  // Stop this process's kernels at their next poll (what Engine::poisonLocked does, without its mutex).
  device::StatusBlock* s = ctx_.status;
  if (s && loadHost(&s->abort) == 0) {
    s->code = static_cast<uint32_t>(device::Status::HostAbort);
    s->rank = static_cast<uint32_t>(ctx_.me);
    storeHost(&s->abort, 1);
  }
}

void InterNode::fail(const Error& error) noexcept {
  if (failedSent_.exchange(true)) return;
  if (proxy_) proxy_->abort(error);
}

std::string InterNode::failure(ErrorCode* code) const {
  std::lock_guard<std::mutex> lock(failMu_);
  if (code) *code = failureCode_;
  return failure_;
}

}  // namespace mk::runtime
