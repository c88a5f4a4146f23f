// mkernel — the element-type table and the reduction-operator table of the Schedule IR.
//
// An entry says what a type or operator is (its JSON name, size, encoding, what it accumulates in, how it is
// laid out); code that needs such a fact asks dtypeInfo / redOpInfo instead of naming types. The enumerator's
// value is the packed code (pack.hpp) and the device kernel's: never renumber, append.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mk {

/// Element type of a buffer.
enum class DType : uint8_t { Float32 = 0, BFloat16 = 1, Float16 = 2, Float8E4M3 = 3, Float8E5M2 = 4, Int32 = 5 };

/// How the stored elements of a scaled type relate to the values they stand for: value = element x scale, with
/// one float32 scale per tensor or one per block of elements (the block shape belongs to the operator that
/// writes the tensor). The IR moves and reduces stored elements; a scale travels as a buffer of its own.
enum class ScaleKind : uint8_t { None = 0, PerTensor = 1, PerBlock = 2 };

/// The bit of `k` in DTypeInfo::scales.
constexpr uint8_t scaleBit(ScaleKind k) noexcept { return static_cast<uint8_t>(1u << static_cast<unsigned>(k)); }

/// One row of the element-type table.
struct DTypeInfo {
  DType type;
  const char* name;      ///< JSON, CLI and trace spelling (docs/schedule-format.md); never rename
  uint8_t size;          ///< bytes per element
  DType accumulate;      ///< what arithmetic on it (Reduce, GEMM accumulators) is computed in
  uint8_t scales;        ///< the ScaleKinds it is used with (scaleBit mask); None: the elements are the values
  uint8_t exponentBits;  ///< the encoding: sign, exponent, mantissa (IEEE-style unless noted; int32: 31 value bits)
  uint8_t mantissaBits;
  uint8_t bias;      ///< exponent bias
  bool infinities;   ///< has +-inf; float8_e4m3 has none (OCP FP8: S.1111.111 is its only NaN)
  double maxFinite;  ///< largest finite value
  /// Two's-complement integers (expert ids, counts, token indices): moved, gathered and read as runtime extent
  /// values, never reduced or multiplied (Reduce, GEMM operands and the collectives refuse them).
  bool integer;
};

// clang-format off
/// The table, indexed by the type's value. Encodings: IEEE 754 binary32 / binary16, bfloat16 (binary32's top
/// half), the OCP 8-bit Floating Point Specification (OFP8) rev 1.0 for E4M3 and E5M2, the formats of
/// Hopper's FP8 tensor cores, and int32 (two's complement, C++20's and CUDA's int32_t) for routing data.
inline constexpr DTypeInfo kDTypes[] = {
  // type              name           size accumulate       scales                                                            exp mant bias  inf    maxFinite               integer
  {DType::Float32,    "float32",     4,   DType::Float32,  scaleBit(ScaleKind::None),                                         8,  23,  127, true,  3.4028234663852886e38,  false},
  {DType::BFloat16,   "bfloat16",    2,   DType::Float32,  scaleBit(ScaleKind::None),                                         8,  7,   127, true,  3.3895313892515355e38,  false},
  {DType::Float16,    "float16",     2,   DType::Float32,  scaleBit(ScaleKind::None),                                         5,  10,  15,  true,  65504.0,                false},
  {DType::Float8E4M3, "float8_e4m3", 1,   DType::Float32,  scaleBit(ScaleKind::PerTensor) | scaleBit(ScaleKind::PerBlock),    4,  3,   7,   false, 448.0,                  false},
  {DType::Float8E5M2, "float8_e5m2", 1,   DType::Float32,  scaleBit(ScaleKind::PerTensor) | scaleBit(ScaleKind::PerBlock),    5,  2,   15,  true,  57344.0,                false},
  {DType::Int32,      "int32",       4,   DType::Int32,    scaleBit(ScaleKind::None),                                         0,  31,  0,   false, 2147483647.0,           true},
};
// clang-format on

/// Number of element types; a packed code at or above it is unknown.
inline constexpr std::size_t kDTypeCount = sizeof(kDTypes) / sizeof(kDTypes[0]);

namespace detail {
/// Whether row i of `table` is about the enumerator of value i (`key`: the row's enumerator field).
template <typename Row, std::size_t N, typename E>
constexpr bool rowsInEnumOrder(const Row (&table)[N], E Row::*key) noexcept {
  for (std::size_t i = 0; i < N; ++i)
    if (static_cast<std::size_t>(table[i].*key) != i) return false;
  return true;
}
}  // namespace detail
static_assert(detail::rowsInEnumOrder(kDTypes, &DTypeInfo::type), "kDTypes must list every DType in enumerator order");

/// Whether `code` (a packed or cast value) names an element type.
constexpr bool isDType(uint8_t code) noexcept { return code < kDTypeCount; }

/// The table entry of `t` (which must be a type: check isDType on untrusted values first).
constexpr const DTypeInfo& dtypeInfo(DType t) noexcept { return kDTypes[static_cast<std::size_t>(t)]; }

/// Bytes per element; 0 for a value cast from bad input.
constexpr std::size_t dtypeSize(DType t) noexcept { return isDType(static_cast<uint8_t>(t)) ? dtypeInfo(t).size : 0; }

/// The element sizes packed four bits per type (type d's size at bits 4d .. 4d+3), for device code, which
/// cannot read the table (a constexpr scalar is usable there, a constexpr array of structs is not).
inline constexpr uint64_t kDTypeSizeNibbles = [] {
  uint64_t packed = 0;
  for (std::size_t i = 0; i < kDTypeCount; ++i) packed |= uint64_t{kDTypes[i].size} << (4 * i);
  return packed;
}();
static_assert(kDTypeCount <= 16, "kDTypeSizeNibbles holds 16 types");

/// Reduction operator of a Reduce step (and, the element-wise ones, of a collective).
enum class RedOp : uint8_t { Sum = 0, Max = 1, Min = 2, LseMerge = 3 };

/// How a reduction operator reads its operands.
enum class RedOpShape : uint8_t {
  Elementwise = 0,  ///< dst[i] = op(a[i], b[i]) for each of `count` elements
  LseRows = 1,      ///< rows of `aux` values followed by their log-sum-exp: count = rows x (aux + 1)
};

/// One row of the reduction-operator table.
struct RedOpInfo {
  RedOp op;
  const char* name;  ///< JSON, CLI and trace spelling; never rename
  RedOpShape shape;
  bool collective;  ///< a collective (allreduce, reducescatter) may use it; row operators need a row width
};

// clang-format off
/// The table, indexed by the operator's value.
inline constexpr RedOpInfo kRedOps[] = {
  // op              name         shape                     collective
  {RedOp::Sum,      "sum",       RedOpShape::Elementwise,  true},
  {RedOp::Max,      "max",       RedOpShape::Elementwise,  true},
  {RedOp::Min,      "min",       RedOpShape::Elementwise,  true},
  {RedOp::LseMerge, "lse-merge", RedOpShape::LseRows,      false},
};
// clang-format on

/// Number of reduction operators; a packed code at or above it is unknown.
inline constexpr std::size_t kRedOpCount = sizeof(kRedOps) / sizeof(kRedOps[0]);

static_assert(detail::rowsInEnumOrder(kRedOps, &RedOpInfo::op), "kRedOps must list every RedOp in enumerator order");

/// Whether `code` (a packed or cast value) names a reduction operator.
constexpr bool isRedOp(uint8_t code) noexcept { return code < kRedOpCount; }

/// The table entry of `op` (which must be an operator: check isRedOp on untrusted values first).
constexpr const RedOpInfo& redOpInfo(RedOp op) noexcept { return kRedOps[static_cast<std::size_t>(op)]; }

}  // namespace mk
