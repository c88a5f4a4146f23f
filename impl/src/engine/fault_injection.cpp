// mkernel — descriptor faults injected by the engine's tests (fault_injection.hpp): the only writer of
// EngineSubmission::injectFault_, and the corruption itself, applied by finalizeLocked after the check word.
#include "engine/fault_injection.hpp"

#include <mutex>

#include "engine/engine.hpp"

namespace mk::runtime {

void TestHooks::injectDescriptorFault(Communicator& comm, device::DescriptorFault fault) {
  comm.engine_->injectDescriptorFault(comm.rank(), fault);
}

void EngineSubmission::injectDescriptorFault(int rank, device::DescriptorFault fault) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  injectFault_ = fault;
  injectRank_ = rank;
}

void EngineSubmission::applyInjectedFaultLocked(device::OpDescriptor& d, uint32_t seq) {
  const auto r = static_cast<size_t>(injectRank_);
  switch (injectFault_) {
    case device::DescriptorFault::CheckWord: d.program[r] ^= uint64_t{1} << 12; break;  // after the check
    case device::DescriptorFault::Bindings: d.nBindings = device::kMaxBindings + 1; break;
    case device::DescriptorFault::ProgramAddress: d.program[r] += 8; break;
    case device::DescriptorFault::ProgramHeader: d.program[r] = reinterpret_cast<uint64_t>(ctx_.ranks[r].state); break;
  }
  if (injectFault_ != device::DescriptorFault::CheckWord) d.check = device::descriptorCheck(d, seq + 1);
  injectFault_ = device::DescriptorFault{};
}

}  // namespace mk::runtime
