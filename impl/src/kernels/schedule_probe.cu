// Decode a packed schedule image on the GPU (see mk/schedule_probe.hpp for why).
#include <cstring>

#include "mk/cuda_check.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule_probe.hpp"

namespace mk {
namespace {

using ull = unsigned long long;

struct DeviceDigest {
  ull stepsPerKind[8];
  ull countSum, valueSum, offsetSum, laneSteps;
};

// One grid-stride pass over lanes and steps; 64-bit atomics are plenty for a test-sized image.
__global__ void digestKernel(const uint8_t* image, DeviceDigest* out) {
  const auto* hdr = reinterpret_cast<const PackedHeader*>(image);
  const uint8_t* p = image + sizeof(PackedHeader) + hdr->nBuffers * sizeof(PackedBuffer);
  const auto* lanes = reinterpret_cast<const PackedLane*>(p);
  const auto* steps = reinterpret_cast<const PackedStep*>(p + hdr->nLanes * sizeof(PackedLane));
  const uint64_t tid = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t l = tid; l < hdr->nLanes; l += stride) atomicAdd(&out->laneSteps, static_cast<ull>(lanes[l].nSteps));
  for (uint64_t s = tid; s < hdr->nSteps; s += stride) {
    const PackedStep& st = steps[s];
    atomicAdd(&out->stepsPerKind[st.kind & 7], 1ull);
    atomicAdd(&out->countSum, static_cast<ull>(st.count));
    atomicAdd(&out->valueSum, static_cast<ull>(st.value));
    atomicAdd(&out->offsetSum, static_cast<ull>(st.dst.offset + st.a.offset + st.b.offset));
  }
}

}  // namespace

bool PackedDigest::operator==(const PackedDigest& o) const noexcept {
  return std::memcmp(stepsPerKind, o.stepsPerKind, sizeof stepsPerKind) == 0 && countSum == o.countSum &&
         valueSum == o.valueSum && offsetSum == o.offsetSum && laneSteps == o.laneSteps;
}

PackedDigest digestOnHost(const std::vector<uint8_t>& image) {
  if (image.size() < sizeof(PackedHeader)) throw Error(ErrorCode::ParseError, "packed image shorter than its header");
  PackedHeader hdr;
  std::memcpy(&hdr, image.data(), sizeof hdr);
  const std::size_t lanesAt = sizeof(PackedHeader) + hdr.nBuffers * sizeof(PackedBuffer);
  const std::size_t stepsAt = lanesAt + hdr.nLanes * sizeof(PackedLane);
  if (image.size() < stepsAt + hdr.nSteps * sizeof(PackedStep))
    throw Error(ErrorCode::ParseError, "packed image truncated before the end of its steps");
  PackedDigest d;
  for (uint32_t l = 0; l < hdr.nLanes; ++l) {
    PackedLane lane;
    std::memcpy(&lane, image.data() + lanesAt + l * sizeof(PackedLane), sizeof lane);
    d.laneSteps += lane.nSteps;
  }
  for (uint64_t s = 0; s < hdr.nSteps; ++s) {
    PackedStep st;
    std::memcpy(&st, image.data() + stepsAt + s * sizeof(PackedStep), sizeof st);
    d.stepsPerKind[st.kind & 7] += 1;
    d.countSum += st.count;
    d.valueSum += st.value;
    d.offsetSum += st.dst.offset + st.a.offset + st.b.offset;
  }
  return d;
}

PackedDigest digestOnDevice(const std::vector<uint8_t>& image, int device) {
  digestOnHost(image);  // same bounds checks before anything touches the GPU
  MK_CUDA_CHECK(cudaSetDevice(device));
  uint8_t* dImage = nullptr;
  DeviceDigest* dDigest = nullptr;
  MK_CUDA_CHECK(cudaMalloc(&dImage, image.size()));
  MK_CUDA_CHECK(cudaMalloc(&dDigest, sizeof(DeviceDigest)));
  DeviceDigest h{};
  try {
    MK_CUDA_CHECK(cudaMemcpy(dImage, image.data(), image.size(), cudaMemcpyHostToDevice));
    MK_CUDA_CHECK(cudaMemset(dDigest, 0, sizeof(DeviceDigest)));
    digestKernel<<<8, 256>>>(dImage, dDigest);
    MK_CUDA_CHECK(cudaGetLastError());
    MK_CUDA_CHECK(cudaMemcpy(&h, dDigest, sizeof h, cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaFree(dImage);
    cudaFree(dDigest);
    throw;
  }
  MK_CUDA_CHECK(cudaFree(dImage));
  MK_CUDA_CHECK(cudaFree(dDigest));
  PackedDigest d;
  for (int k = 0; k < 8; ++k) d.stepsPerKind[k] = h.stepsPerKind[k];
  d.countSum = h.countSum;
  d.valueSum = h.valueSum;
  d.offsetSum = h.offsetSum;
  d.laneSteps = h.laneSteps;
  return d;
}

}  // namespace mk
