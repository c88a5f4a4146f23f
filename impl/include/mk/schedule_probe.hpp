// mkernel — decode a packed schedule image (mk/schedule/pack.hpp) on a GPU and compare with the host.
//
// The packed image is the Schedule's compact binary form (files, the engine's cache key, one rank's image
// for lowerPacked); the resident kernel does not read it: it runs the per-rank program that the lowering
// (impl/src/lowering) builds on the host (mk/device/engine_device.hpp). This probe checks that nvcc lays
// out pack.hpp's records as g++ does, by decoding an image on the device and comparing the digests.
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
