// mkernel — reading an op descriptor in the resident kernel (the host-link warp), and the checks it must pass
// before the op is staged (docs/gpu-engine.md, "Descriptors the kernel refuses").
//
// A descriptor is 640 bytes of host-mapped memory, and a thread's loads there cost it a PCIe round trip each: the
// warp reads all of it in 16-byte pieces, at most two per lane, issued before any is used. Lane l holds words
// 2l, 2l + 1 and (l < 8) 64 + 2l, 65 + 2l. The check word folds words 0 .. kDescriptorWords - 1 the way
// descriptorCheck (engine_device.hpp) does on the host, per lane, XOR-reduced over the warp; word kDescriptorWords
// is the check itself.
#pragma once

#include <cstdint>

#include "mk/device/engine_device.hpp"
#include "mk/device/poll_device.hpp"

#if MK_HAVE_DEVICE_CODE
namespace mk::device {

/// What readDescriptor found: the seq word, this rank's program, the binding count and flags, and (fault != 0) why
/// the descriptor is refused, with the value seen and the one expected (StatusBlock::seen / expected). The same on
/// every lane.
struct DescriptorRead {
  uint64_t program;
  uint32_t seq, nBindings, flags;
  uint32_t fault;  ///< DescriptorFault, 0 = none
  uint64_t seen, want;
};

/// Read descriptor `d` with every lane of the warp (`lid` its lane): the binding table goes to `table` (kMaxBindings
/// entries, shared memory), the rest is returned and checked: the check word, at most kMaxBindings bindings, a
/// non-null 16-byte aligned program for `rank`. The read need not follow an acquire of `seq`: the check word covers
/// seq and every other word, so a read the host's writes tore (a new seq beside older words, or the reverse) fails
/// the check like a corrupted descriptor does (a false match of the 64-bit check is a ~2^-64 event per torn read).
MK_DEVICE_INLINE DescriptorRead readDescriptor(const OpDescriptor* d, uint32_t rank, uint32_t lid, uint64_t* table) {
  static_assert(
      sizeof(OpDescriptor) == 80 * sizeof(uint64_t) && kDescriptorWords == 74 && kMaxRanks == 8 && kMaxBindings == 64,
      "the word map above");
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const auto* words = reinterpret_cast<const uint64_t*>(d);
  uint64_t w[4] = {0, 0, 0, 0};
  loadRelaxed2(words + 2 * lid, &w[0], &w[1]);
  if (lid < 8) loadRelaxed2(words + 64 + 2 * lid, &w[2], &w[3]);
  uint64_t fold = 0;
  for (uint32_t k = 0; k < 4; ++k) {
    const uint32_t i = k < 2 ? 2 * lid + k : 64 + 2 * lid + (k - 2);
    if (k >= 2 && lid >= 8) break;
    if (i < kDescriptorWords) fold ^= descriptorWordMix(w[k], i);
    if (i >= 2 + kMaxRanks && i < kDescriptorWords) table[i - 2 - kMaxRanks] = w[k];
  }
  for (uint32_t o = 16; o != 0; o >>= 1) fold ^= __shfl_xor_sync(kAll, fold, o);
  const uint32_t progWord = 2 + rank;
  DescriptorRead r{};
  r.program = __shfl_sync(kAll, (progWord & 1u) ? w[1] : w[0], progWord / 2);
  r.want = __shfl_sync(kAll, w[2], (kDescriptorWords - 64) / 2);
  const uint64_t w0 = __shfl_sync(kAll, w[0], 0);  // word 0 is (seq, nBindings)
  r.seq = static_cast<uint32_t>(w0);
  r.nBindings = static_cast<uint32_t>(w0 >> 32);
  r.flags = static_cast<uint32_t>(__shfl_sync(kAll, w[1], 0));  // word 1 is (flags, reserved0)
  if (fold != r.want) {
    r.fault = static_cast<uint32_t>(DescriptorFault::CheckWord);
    r.seen = fold;
  } else if (r.nBindings > kMaxBindings) {
    r.fault = static_cast<uint32_t>(DescriptorFault::Bindings);
    r.seen = r.nBindings;
  } else if (r.program == 0 || (r.program & 15u) != 0) {
    r.fault = static_cast<uint32_t>(DescriptorFault::ProgramAddress);
    r.seen = r.program;
  }
  return r;
}

}  // namespace mk::device
#endif
