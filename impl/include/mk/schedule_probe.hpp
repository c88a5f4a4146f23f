// mkernel — upload a packed schedule image to a GPU and decode it there.
//
// The resident kernel (impl/src/kernels) reads PackedStep records compiled by nvcc from the same
// header g++ uses for pack(); this probe proves both compilers agree on every field's offset by
// decoding on the device and comparing with the host's own decoding.
#pragma once

#include <cstdint>
#include <vector>

namespace mk {

/// Per-image digest: step count per StepKind and sums over count / value / operand offsets.
struct PackedDigest {
  uint64_t stepsPerKind[8] = {};
  uint64_t countSum = 0;
  uint64_t valueSum = 0;
  uint64_t offsetSum = 0;
  uint64_t laneSteps = 0;  ///< sum of PackedLane::nSteps
  bool operator==(const PackedDigest& o) const noexcept;
};

/// Digest computed on the host from a packed image.
PackedDigest digestOnHost(const std::vector<uint8_t>& image);
/// Same digest computed by a kernel on `device` from a device copy of the image. Throws Error(CudaError).
PackedDigest digestOnDevice(const std::vector<uint8_t>& image, int device);

}  // namespace mk
