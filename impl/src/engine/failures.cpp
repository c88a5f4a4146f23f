// mkernel — engine failures: the first one poisons the engine and stops its kernels; a device-side report
// (status block) or a kernel that died becomes an mk::Error naming the rank, lane, step and op.
#include <cuda_runtime_api.h>

#include <sstream>
#include <string>

#include "engine/engine.hpp"
#include "engine/host_sync.hpp"
#include "engine/internode.hpp"
#include "gemm/gemm_lane.hpp"
#include "mk/error.hpp"
#include "mk/schedule/validate.hpp"

namespace mk::runtime {

namespace {

const char* statusName(device::Status s) {
  switch (s) {
    case device::Status::WaitTimeout: return "wait timed out";
    case device::Status::BarrierTimeout: return "barrier timed out";
    case device::Status::EntryTimeout: return "peer never entered the op";
    case device::Status::DescriptorTimeout: return "op descriptor never became valid";
    case device::Status::GateTimeout: return "earlier op never completed on every rank";
    case device::Status::LaneSyncTimeout: return "CTAs of a lane never met";
    case device::Status::BadProgram: return "bad program";
    case device::Status::HostAbort: return "aborted by the host";
    case device::Status::ProxyTimeout: return "the proxy never handled a command";
    case device::Status::BadDescriptor: return "op descriptor refused";
    case device::Status::BadExtent: return "runtime extent above its bound";
    case device::Status::BadIndex: return "routing index out of range";
    case device::Status::RouteOverflow: return "routing over a token list's capacity";
    default: return "unknown failure";
  }
}

/// The step a failure record names: describeStep when `sched` (what the op ran) has it, else its numbers.
std::string failedStep(const CachedSchedule* sched, const device::StatusBlock& s) {
  if (sched && s.rank < sched->schedule.lanes.size() && s.lane < sched->schedule.lanes[s.rank].size() &&
      s.step < sched->schedule.lanes[s.rank][s.lane].steps.size())
    return describeStep(sched->schedule, s.rank, s.lane, s.step);
  return "rank " + std::to_string(s.rank) + " lane " + std::to_string(s.lane) + " step " + std::to_string(s.step);
}

}  // namespace

std::string Engine::describeDeviceFailure() const {
  const device::StatusBlock s = *ctx_.status;
  const auto code = static_cast<device::Status>(s.code);
  std::ostringstream os;
  const CachedSchedule* sched = submission_.scheduleOf(s.op);
  const std::string what = sched ? " (" + sched->what + ")" : std::string();
  switch (code) {
    case device::Status::WaitTimeout:
    case device::Status::BarrierTimeout:
    case device::Status::EntryTimeout:
    case device::Status::LaneSyncTimeout: {
      os << failedStep(sched, s);
      os << " of op " << s.op << what << ": " << statusName(code) << " after " << fmtMs(double(s.elapsedNs) / 1e6)
         << ": ";
      if (code == device::Status::WaitTimeout)
        os << "flag " << s.flag << " expected >= " << s.expected << ", seen " << s.seen;
      else if (code == device::Status::BarrierTimeout)
        os << "barrier " << s.flag << " expected " << s.expected << " ranks, seen " << s.seen;
      else if (code == device::Status::EntryTimeout)
        os << "rank " << s.flag << " has entered " << s.seen << " ops, expected >= " << s.expected
           << " (its stream never reached this op?)";
      else
        os << "sync point " << s.flag << " expected " << s.expected << " CTAs, seen " << s.seen;
      break;
    }
    case device::Status::DescriptorTimeout:
      os << "rank " << s.rank << " op " << s.op << ": " << statusName(code) << " after "
         << fmtMs(double(s.elapsedNs) / 1e6) << " (seq seen " << s.seen << ", expected " << s.expected
         << "): did every rank submit op " << s.op << "?";
      if (ctx_.link) {
        const std::string missing = progress_.unpostedRanks(s.op);
        if (!missing.empty()) os << " (rank(s) " << missing << " never submitted it)";
      }
      break;
    case device::Status::ProxyTimeout:
      os << failedStep(sched, s);
      os << " of op " << s.op << what << ": " << statusName(code) << " within " << fmtMs(double(s.elapsedNs) / 1e6)
         << ": FIFO position " << s.expected - 1 << ", the proxy had handled " << s.seen
         << " command(s) (the proxy thread, or the process at the other end, stopped answering)";
      break;
    case device::Status::GateTimeout:
      os << "rank " << s.rank << " could not start op " << s.op << what << " within "
         << fmtMs(double(s.elapsedNs) / 1e6) << ": rank " << s.flag << " has completed " << s.seen
         << " ops, expected >= " << s.expected;
      break;
    case device::Status::BadDescriptor: {
      os << "rank " << s.rank << " op " << s.op << what << ": " << statusName(code) << ": ";
      switch (static_cast<device::DescriptorFault>(s.flag)) {
        case device::DescriptorFault::CheckWord:
          os << "its words do not match the check word the host wrote (0x" << std::hex << s.expected << ", folded 0x"
             << s.seen << std::dec << "): the descriptor ring was overwritten after the host published it";
          break;
        case device::DescriptorFault::Bindings:
          os << s.seen << " bindings, more than the table's " << device::kMaxBindings;
          break;
        case device::DescriptorFault::ProgramAddress:
          os << "program address 0x" << std::hex << s.seen << std::dec << " is null or not 16-byte aligned";
          break;
        case device::DescriptorFault::ProgramHeader:
          os << "the memory it names is not this rank's lowered program (magic 0x" << std::hex << s.seen
             << ", expected 0x" << s.expected << std::dec << ", or another rank's, rank count or CTA count)";
          break;
        default: os << "fault " << s.flag;
      }
      os << "; nothing of the op ran on rank " << s.rank;
      break;
    }
    case device::Status::BadExtent: {
      os << failedStep(sched, s) << " of op " << s.op << what << ": " << statusName(code) << ": extent ";
      // A sourced extent's report names its source, not the schedule's extent: the step's own extent says which.
      const bool sourced = (s.flag & device::kSourcedExtent) != 0;
      uint64_t e = s.flag;
      if (sourced && sched && s.rank < sched->schedule.lanes.size() && s.lane < sched->schedule.lanes[s.rank].size() &&
          s.step < sched->schedule.lanes[s.rank][s.lane].steps.size())
        e = sched->schedule.lanes[s.rank][s.lane].steps[s.step].extent;
      const bool named = sched && e < sched->schedule.extents.size();
      if (named)
        os << "'" << sched->schedule.extents[e].name << "'";
      else
        os << (s.flag & ~device::kSourcedExtent);
      os << " is " << (s.seen == ~uint64_t{0} ? std::string("negative") : std::to_string(s.seen)) << " on rank "
         << s.rank << ", its bound is " << s.expected;
      if (!sourced) {
        os << " (write at most the bound into the extent words passed to execute)";
      } else if (named) {
        const ExtentDecl& d = sched->schedule.extents[e];
        os << " (element " << d.sourceElement << " of buffer '"
           << (d.sourceBuffer < sched->schedule.buffers.size() ? sched->schedule.buffers[d.sourceBuffer].name : "?")
           << "', which the schedule fills: its inputs overflowed the bound)";
      }
      break;
    }
    case device::Status::BadIndex: {
      const bool route = sched && s.rank < sched->schedule.lanes.size() &&
                         s.lane < sched->schedule.lanes[s.rank].size() &&
                         s.step < sched->schedule.lanes[s.rank][s.lane].steps.size() &&
                         sched->schedule.lanes[s.rank][s.lane].steps[s.step].kind == StepKind::Route;
      const auto value = static_cast<int64_t>(s.seen);
      os << failedStep(sched, s) << " of op " << s.op << what << ": " << statusName(code) << ": on rank " << s.rank
         << (route ? " id " : " row ") << s.flag << (route ? " names expert " : " gathers source row ") << value
         << ", outside [0, " << s.expected << ")"
         << (route ? " (the router's ids must name one of the experts)" : " (sourceRows)");
      break;
    }
    case device::Status::RouteOverflow:
      os << failedStep(sched, s) << " of op " << s.op << what << ": " << statusName(code) << ": rank " << s.rank
         << " routes " << s.seen << " tokens to expert " << s.flag << ", above the capacity " << s.expected
         << " of its token list (the routing overflows the receive capacity; generate the schedule for a larger "
            "capacity)";
      break;
    case device::Status::HostAbort:
      os << "the communicator was stopped by the host after an earlier error";
      if (ctx_.link) os << " (in the process of rank " << s.rank << ")";
      break;
    default: os << "rank " << s.rank << ": " << statusName(code) << " (code " << s.code << ")";
  }
  os << goneNote();
  return os.str();
}

std::string Engine::goneNote() const {
  // A timeout, or a kernel killed by an illegal address, is often the trace of a peer process that died: its memory,
  // which this rank's kernel was reading or writing, went with it. Say so.
  const std::string gone = ctx_.link ? ctx_.link->goneRanks() : std::string();
  if (gone.empty()) return gone;
  return " (the process of " + gone +
         " has exited: its memory, which this rank's kernel may have been using, went "
         "with it)";
}

void Engine::poisonAndThrow(ErrorCode code, const std::string& message) {
  if (poison_.empty()) {
    poison_ = message;
    poisonCode_ = code;
  }
  if (ctx_.status && loadHost(&ctx_.status->abort) == 0) {
    ctx_.status->code = static_cast<uint32_t>(device::Status::HostAbort);
    ctx_.status->rank = static_cast<uint32_t>(ctx_.me);  // multi-process: whose process stopped the engine
    storeHost(&ctx_.status->abort, 1);
  }
  if (interNode_) interNode_->fail(Error(code, message));  // the ranks of other nodes stop too
  throw Error(code, message);
}

void Engine::throwIfFailedLocked(bool deep) {
  if (!poison_.empty()) throw Error(poisonCode_, "communicator unusable after an earlier error: " + poison_);
  if (interNode_) {  // a peer, a connection or a proxy thread failed
    ErrorCode code = ErrorCode::Internal;
    const std::string remote = interNode_->failure(&code);
    if (!remote.empty()) poisonAndThrow(code, remote);
  }
  if (loadHost(&ctx_.status->abort) != 0) {
    const auto code = static_cast<device::Status>(ctx_.status->code);
    const bool badInput =
        code == device::Status::BadExtent || code == device::Status::BadIndex || code == device::Status::RouteOverflow;
    const bool timedOut = code != device::Status::HostAbort && code != device::Status::BadDescriptor &&
                          code != device::Status::BadProgram && !badInput;
    poisonAndThrow(badInput   ? ErrorCode::InvalidArgument
                   : timedOut ? ErrorCode::Timeout
                              : ErrorCode::Internal,
                   describeDeviceFailure());
  }
  // A kernel that died (illegal address, ...) never raises `abort`: asked where the host waits anyway.
  for (const auto& rr : ctx_.ranks) {
    if (!deep) break;
    if (!rr.launched) continue;  // ranks of other processes
    const cudaError_t e = cudaStreamQuery(rr.kernelStream);
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      // Compute lanes: a Gemm step whose wait expired traps; say who waited for what.
      const std::string gemm = gemmLaneTimeoutReport(this, static_cast<uint32_t>(&rr - ctx_.ranks.data()));
      poisonAndThrow(ErrorCode::CudaError,
                     "the resident kernel on GPU " + std::to_string(rr.device) + " stopped: " +
                         (e == cudaSuccess ? std::string("exited")
                                           : std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)) +
                         (gemm.empty() ? std::string() : " (" + gemm + ")") + submission_.graphMisuseNote() +
                         goneNote());
    }
  }
}

void Engine::poisonLocked(ErrorCode code, const std::string& message) noexcept {
  if (poison_.empty()) {
    poison_ = message;
    poisonCode_ = code;
  }
  if (ctx_.status && loadHost(&ctx_.status->abort) == 0) {
    ctx_.status->code = static_cast<uint32_t>(device::Status::HostAbort);
    ctx_.status->rank = static_cast<uint32_t>(ctx_.me);
    storeHost(&ctx_.status->abort, 1);
  }
  if (interNode_) interNode_->fail(Error(code, message));
}

}  // namespace mk::runtime
