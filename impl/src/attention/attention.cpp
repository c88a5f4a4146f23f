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

namespace mk {
namespace {

constexpr uint64_t kMaxPosition = uint64_t{1} << 62;  // qPos - kvPos stays a signed 64-bit difference

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

/// A 4-D bf16 map {headDim, heads, tokens, batch} over [batch][ld tokens][heads][headDim], box {64, 1, 128, 1}.
device::GemmTensorMap encodeMap(const void* base, uint32_t headDim, uint32_t heads, uint32_t tokens, uint32_t batch,
                                uint64_t ld, const char* name) {
  static_assert(sizeof(CUtensorMap) == sizeof(device::GemmTensorMap), "CUtensorMap is 128 bytes");
  CUtensorMap map;
  const cuuint64_t dims[4] = {headDim, heads, tokens, batch};
  const cuuint64_t row = uint64_t{heads} * headDim * 2;  // bytes between two tokens
  const cuuint64_t strides[3] = {uint64_t{headDim} * 2, row, ld * row};
  const cuuint32_t box[4] = {64, 1, 128, 1};
  const cuuint32_t elemStrides[4] = {1, 1, 1, 1};
  const CUresult r =
      runtime::tensorMapEncodeTiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides,
                                      box, elemStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  runtime::checkDriver(r, (std::string("cuTensorMapEncodeTiled (attention ") + name + ")").c_str());
  device::GemmTensorMap out;
  std::memcpy(&out, &map, sizeof(out));
  return out;
}

}  // namespace

std::string attentionForwardProblem(const AttentionShape& sh, DType dtype) {
  std::string why = attentionShapeProblem(sh);
  if (!why.empty()) return why;
  auto s = [](uint64_t v) { return std::to_string(v); };
  if (sh.headDim != 64 && sh.headDim != 128)
    return "headDim " + s(sh.headDim) + " is not supported by the GPU attention engine (64 or 128)";
  if (dtype != DType::BFloat16) return "dtype: the GPU attention engine reads bf16 Q, K and V only";
  if (sh.vOffset % 8 != 0)
    return "vOffset " + s(sh.vOffset) + " is not a multiple of 8 elements (TMA needs V 16-byte aligned)";
  // TMA: coordinates are int32 (a tile may start up to 127 rows before the end), strides below 2^40 bytes.
  if (sh.sq > (1u << 30) || sh.skv > (1u << 30)) return "sq and skv must be <= 2^30 (TMA coordinates)";
  const uint64_t maxLd = sh.ldq > sh.ldkv ? sh.ldq : sh.ldkv;
  if (maxLd * uint64_t{sh.qHeads} * sh.headDim * 2 >= (uint64_t{1} << 40))
    return "ldq / ldkv x heads x headDim x 2 bytes must be < 2^40 (TMA strides)";
  if (sh.qPos >= kMaxPosition || sh.kvPos >= kMaxPosition) return "qPos and kvPos must be < 2^62";
  const uint64_t units = uint64_t{sh.batch} * sh.qHeads * ((uint64_t{sh.sq} + 127) / 128);
  if (units >= (uint64_t{1} << 31)) return "batch x qHeads x ceil(sq / 128) must be < 2^31 (work units)";
  return "";
}

device::AttentionParams attentionWorkParams(const AttentionShape& sh) {
  device::AttentionParams p;
  p.batch = sh.batch;
  p.qHeads = sh.qHeads;
  p.kvHeads = sh.kvHeads;
  p.headDim = sh.headDim;
  p.sq = sh.sq;
  p.skv = sh.skv;
  p.ldo = sh.ldo;
  p.qTiles = (sh.sq + 127) / 128;
  p.units = sh.batch * sh.qHeads * p.qTiles;
  p.causal = sh.causal ? 1 : 0;
  p.causalDelta = static_cast<int64_t>(sh.qPos) - static_cast<int64_t>(sh.kvPos);
  p.scale = sh.scale;
  p.scaleLog2 = static_cast<float>(static_cast<double>(sh.scale) * 1.4426950408889634);
  return p;
}

void attentionForward(const AttentionShape& sh, DType dtype, const void* q, const void* kv, float* out,
                      cudaStream_t stream, const AttentionOptions& options) {
  const std::string why = attentionForwardProblem(sh, dtype);
  if (!why.empty()) throw Error(ErrorCode::InvalidArgument, "attentionForward: " + why);
  if (q == nullptr || kv == nullptr || out == nullptr)
    throw Error(ErrorCode::InvalidArgument, "attentionForward: q, kv and out must not be null");
  if (reinterpret_cast<uintptr_t>(q) % 16 != 0 || reinterpret_cast<uintptr_t>(kv) % 16 != 0)
    throw Error(ErrorCode::InvalidArgument, "attentionForward: q and kv must be 16-byte aligned (TMA)");
  device::AttentionParams p = attentionWorkParams(sh);
  p.mapQ = encodeMap(q, sh.headDim, sh.qHeads, sh.sq, sh.batch, sh.ldq, "Q");
  p.mapK = encodeMap(kv, sh.headDim, sh.kvHeads, sh.skv, sh.batch, sh.ldkv, "K");
  p.mapV =
      encodeMap(static_cast<const uint16_t*>(kv) + sh.vOffset, sh.headDim, sh.kvHeads, sh.skv, sh.batch, sh.ldkv, "V");
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

}  // namespace mk
