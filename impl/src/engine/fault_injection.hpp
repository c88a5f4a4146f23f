// mkernel — internal, for the engine's tests only: faults injected on purpose, so that the tests can show what the
// kernel and the host do with them (an mk::Error on every rank, no hang, the GPU usable afterwards). Nothing outside
// impl/tests includes this header; an engine no test touched never takes these paths.
#pragma once

#include "mk/communicator.hpp"
#include "mk/device/engine_device.hpp"

namespace mk::runtime {

struct TestHooks {
  /// The next op descriptor this communicator's process writes is corrupted for rank comm.rank()'s entry after its
  /// check word was computed (CheckWord: one bit of the rank's program address flipped), or written wrong with a
  /// matching check word, as a host bug would (Bindings: more bindings than the table holds; ProgramAddress: a
  /// misaligned program address; ProgramHeader: the address of memory that is not a program, the rank's own engine
  /// state). The kernel must refuse it with Status::BadDescriptor.
  static void injectDescriptorFault(Communicator& comm, device::DescriptorFault fault);
};

}  // namespace mk::runtime
