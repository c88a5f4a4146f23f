#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <vector>

#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"

TEST_CASE("multigpu: two devices map each other and a peer copy is exact") {
  REQUIRE(mk::peerAccessPossible(0, 1));
  const size_t n = (1u << 20) + 3;
  std::vector<float> host(n), back(n, 0.f);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 977) - 488.5f;
  float *a = nullptr, *b = nullptr;
  MK_CUDA_CHECK(cudaSetDevice(0));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&a), n * sizeof(float)));
  MK_CUDA_CHECK(cudaSetDevice(1));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b), n * sizeof(float)));
  MK_CUDA_CHECK(cudaMemcpy(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpyPeer(b, 1, a, 0, n * sizeof(float)));
  MK_CUDA_CHECK(cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(back == host);
  MK_CUDA_CHECK(cudaFree(b));
  MK_CUDA_CHECK(cudaSetDevice(0));
  MK_CUDA_CHECK(cudaFree(a));
}
