// Why compute-sanitizer memcheck cannot check the resident kernel as it is (docs/gpu-engine.md, results.md).
//
// A kernel spins until the host hands it a pointer, then reads element 5 of a 592-byte cudaMalloc buffer.
//   ./probe            buffer allocated before the launch: memcheck clean
//   ./probe late       buffer allocated after the launch:  memcheck "Invalid __global__ read ... out of bounds
//                      and is inside the nearest allocation", the kernel dies (seen on H200, CUDA 13.0, driver 580)
//   ./probe late flush also launches an empty kernel on another stream: memcheck serialises kernels, so this
//                      one never starts while the spinning kernel runs (the run hangs until its timeout)
// Build and run on the GPU machine: nvcc -arch=sm_90 -o probe memcheck_late_alloc_probe.cu &&
//   compute-sanitizer --tool memcheck ./probe late
#include <cstdio>

__global__ void spinThenRead(int* volatile* slot, int* out) {
  int* p = nullptr;
  for (long spins = 0; !(p = *slot) && spins < (1l << 34); ++spins) {
  }
  if (p) *out = p[5];
}
__global__ void empty() {}

int main(int argc, char**) {
  int **slot, *out, *early, *late;
  cudaHostAlloc(&slot, sizeof(int*), cudaHostAllocMapped);
  *slot = nullptr;
  cudaMalloc(&out, sizeof(int));
  cudaMalloc(&early, 592);
  cudaStream_t s, other;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
  spinThenRead<<<1, 1, 0, s>>>(reinterpret_cast<int* volatile*>(slot), out);
  cudaMalloc(&late, 592);
  if (argc > 2) {
    empty<<<1, 1, 0, other>>>();
    cudaStreamSynchronize(other);
  }
  *reinterpret_cast<int* volatile*>(slot) = argc > 1 ? late : early;
  std::printf("%s\n", cudaGetErrorString(cudaStreamSynchronize(s)));
  return 0;
}
