// mkernel — the attention forward engine's host side: refuse what it cannot run, encode the 4-D tensor maps of Q, K
// and V over the token-major layout of attention.hpp, fill AttentionParams and launch (kernels/attention.cu).
#include "mk/attention.hpp"

#include <cuda.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "attention/attention_launch.hpp"
#include "device/driver_api.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

/// A 4-D bf16 map {headDim, heads, tokens, batch} over [batch][ld tokens][heads][headDim], box {64, 1, 128, 1}.
device::GemmTensorMap encodeAttentionMap(const void* base, uint32_t headDim, uint32_t heads, uint32_t tokens,
                                         uint32_t batch, uint64_t ld, const char* name) {
  static_assert(sizeof(CUtensorMap) == sizeof(device::GemmTensorMap), "CUtensorMap is 128 bytes");
  CUtensorMap map;
  const cuuint64_t dims[4] = {headDim, heads, tokens, batch};
  const cuuint64_t row = uint64_t{heads} * headDim * 2;  // bytes between two tokens
  const cuuint64_t strides[3] = {uint64_t{headDim} * 2, row, ld * row};
  const cuuint32_t box[4] = {64, 1, 128, 1};
  const cuuint32_t elemStrides[4] = {1, 1, 1, 1};
  const CUresult r =
      tensorMapEncodeTiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box,
                             elemStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  checkDriver(r, (std::string("cuTensorMapEncodeTiled (attention ") + name + ")").c_str());
  device::GemmTensorMap out;
  std::memcpy(&out, &map, sizeof(out));
  return out;
}

}  // namespace mk::runtime

namespace mk {
namespace {

/// The unit counter of (current device, stream): calls on one stream run one after another and each leaves the word
/// zero, so they can share it. Allocated and zeroed on first use, kept for the process.
uint32_t* streamUnitCounter(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, uint32_t*> words;
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  uint32_t*& w = words[{dev, stream}];
  if (w == nullptr) {
    MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&w), sizeof(uint32_t)));
    MK_CUDA_CHECK(cudaMemset(w, 0, sizeof(uint32_t)));
  }
  return w;
}

}  // namespace

void attentionForward(const AttentionShape& sh, DType dtype, const void* q, const void* kv, float* out,
                      cudaStream_t stream, const AttentionOptions& options) {
  const std::string why = attentionForwardProblem(sh, dtype);
  if (!why.empty()) throw Error(ErrorCode::InvalidArgument, "attentionForward: " + why);
  if (q == nullptr || kv == nullptr || out == nullptr)
    throw Error(ErrorCode::InvalidArgument, "attentionForward: q, kv and out must not be null");
  if (reinterpret_cast<uintptr_t>(q) % 16 != 0 || reinterpret_cast<uintptr_t>(kv) % 16 != 0)
    throw Error(ErrorCode::InvalidArgument, "attentionForward: q and kv must be 16-byte aligned (TMA)");
  device::AttentionParams p = attentionWorkParams(sh);
  p.mapQ = runtime::encodeAttentionMap(q, sh.headDim, sh.qHeads, sh.sq, sh.batch, sh.ldq, "Q");
  p.mapK = runtime::encodeAttentionMap(kv, sh.headDim, sh.kvHeads, sh.skv, sh.batch, sh.ldkv, "K");
  p.mapV = runtime::encodeAttentionMap(static_cast<const uint16_t*>(kv) + sh.vOffset, sh.headDim, sh.kvHeads, sh.skv,
                                       sh.batch, sh.ldkv, "V");
  p.out = out;
  p.timeoutReport = options.timeoutReport;
  p.unitCounter = !options.dynamicUnits            ? nullptr
                  : options.unitCounter != nullptr ? options.unitCounter
                                                   : streamUnitCounter(stream);
  if (p.unitCounter != nullptr && reinterpret_cast<uintptr_t>(p.unitCounter) % 4 != 0)
    throw Error(ErrorCode::InvalidArgument, "attentionForward: options.unitCounter must be 4-byte aligned");
  uint32_t ctas = options.ctas;
  if (ctas == 0) {
    int dev = 0, sms = 0;
    MK_CUDA_CHECK(cudaGetDevice(&dev));
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    ctas = static_cast<uint32_t>(sms);
  }
  if (ctas > p.units) ctas = p.units;
  runtime::launchAttention(p, ctas, stream);
}

void lseMergeDevice(float* dst, const float* a, const float* b, uint64_t rows, uint32_t width, cudaStream_t stream) {
  if (width == 0) throw Error(ErrorCode::InvalidArgument, "lseMergeDevice: width must be >= 1");
  if (rows == 0) return;
  if (dst == nullptr || a == nullptr || b == nullptr)
    throw Error(ErrorCode::InvalidArgument, "lseMergeDevice: dst, a and b must not be null");
  runtime::launchLseMerge(dst, a, b, rows, width, stream);
}

}  // namespace mk
