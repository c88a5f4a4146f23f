// mkernel — the one gate for device code in headers shared by nvcc and g++.
//
// Device headers (`*_device.hpp`) hold wire formats and small device functions. Their device bodies sit
// behind MK_DEVICE_INLINE so the same header compiles in host-only translation units (g++ sees the
// declarations and the structs, never a __device__ body).
#pragma once

#if defined(__CUDACC__)
/// Marks an inline device function; only defined (and only usable) when nvcc compiles the file.
#define MK_DEVICE_INLINE __device__ __forceinline__
/// True in translation units compiled by nvcc.
#define MK_HAVE_DEVICE_CODE 1
/// A small function both the host (lowering, tests) and the kernel call: one definition, two compilers.
#define MK_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define MK_HAVE_DEVICE_CODE 0
#define MK_HOST_DEVICE_INLINE inline
#endif
