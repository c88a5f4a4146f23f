// mkernel — the CPU executor's operands and the steps that only compute on them (step_operands.hpp).
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention_exec.hpp"
#include "combine_exec.hpp"
#include "gemm_exec.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/check.hpp"
#include "mk/util/range.hpp"
#include "operand_overlap.hpp"
#include "route_exec.hpp"
#include "step_operands.hpp"

namespace mk::detail {
namespace {

template <class Load, class Store>
void reduceLoop(RedOp op, uint64_t n, uint16_t* d, const uint16_t* x, const uint16_t* y, Load load, Store store) {
  // d may alias x or y exactly: both are read before d[i] is written.
  if (op == RedOp::Sum) {
    for (uint64_t i = 0; i < n; ++i) d[i] = store(load(x[i]) + load(y[i]));
  } else {
    for (uint64_t i = 0; i < n; ++i) d[i] = store(applyRedOp(op, load(x[i]), load(y[i])));
  }
}

/// The attention shape an Attention / AttentionGrad step names, after the index check.
const AttentionShape& attentionShapeOf(const StepOperands& o, const StepAt& at, const Step& st) {
  const Schedule& s = o.schedule();
  if (st.aux >= s.attentions.size())
    o.invalid(at, "attention index " + std::to_string(st.aux) + " is out of range (" +
                      std::to_string(s.attentions.size()) + " shapes)");
  return s.attentions[st.aux];
}

}  // namespace

void StepOperands::bind(HostMemory& mem) {
  nBuffers_ = s_.buffers.size();
  bound_.resize(static_cast<std::size_t>(s_.nRanks) * nBuffers_);
  for (uint32_t rank = 0; rank < s_.nRanks; ++rank)
    for (std::size_t b = 0; b < nBuffers_; ++b) {
      BoundBuffer& bb = bound_[rank * nBuffers_ + b];
      bb.data = mem.bytes[rank].empty() ? nullptr : mem.bytes[rank][b].data();
      bb.count = s_.buffers[b].count[rank];
      bb.dtype = s_.buffers[b].dtype;
    }
}

void StepOperands::invalid(const StepAt& at, const std::string& what) const {
  throw Error(ErrorCode::InvalidSchedule, describeStep(s_, at.rank, at.lane, at.step) + ": " + what);
}

const BoundBuffer& StepOperands::operand(const StepAt& at, const char* name, const BufRef& ref, uint64_t extent) const {
  if (ref.rank >= s_.nRanks)
    invalid(at, std::string("operand ") + name + " names rank " + std::to_string(ref.rank) +
                    ", expected < nRanks = " + std::to_string(s_.nRanks));
  if (ref.buffer >= nBuffers_)
    invalid(at, std::string("operand ") + name + " names buffer " + std::to_string(ref.buffer) + ", expected < " +
                    std::to_string(nBuffers_) + " declared buffers");
  const BoundBuffer& bb = bound_[ref.rank * nBuffers_ + ref.buffer];
  if (!rangeInside(ref.offset, extent, bb.count))
    invalid(at, std::string("operand ") + name + " " + rangeText(ref.offset, extent) + " is outside buffer '" +
                    s_.buffers[ref.buffer].name + "' of rank " + std::to_string(ref.rank) + " (" +
                    std::to_string(bb.count) + " elements)");
  return bb;
}

uint64_t StepOperands::extentAt(const StepAt& at, uint32_t e) const {
  const ExtentDecl& d = s_.extents[e];
  if (!d.sourced()) return extentValue(s_, extents_, at.rank, e);
  const std::string what = "source of extent '" + d.name + "'";
  const BoundBuffer& src = operand(at, what.c_str(), bufRef(at.rank, d.sourceBuffer, d.sourceElement), 1);
  if (!dtypeInfo(src.dtype).integer) invalid(at, what + " is " + toString(src.dtype) + ", expected int32");
  int32_t v;
  std::memcpy(&v, src.data + d.sourceElement * sizeof v, sizeof v);
  if (v < 0 || static_cast<uint64_t>(v) > d.bound)
    throw Error(ErrorCode::InvalidArgument,
                describeStep(s_, at.rank, at.lane, at.step) + ": extent '" + d.name + "' of rank " +
                    std::to_string(at.rank) + " is " + std::to_string(v) + " (element " +
                    std::to_string(d.sourceElement) + " of buffer '" + s_.buffers[d.sourceBuffer].name +
                    "'), outside [0, its bound " + std::to_string(d.bound) +
                    "]: the routing overflows this capacity (generate the schedule for a larger bound)");
  return static_cast<uint64_t>(v);
}

void reduceStep(const StepOperands& o, const StepAt& at, const Step& st) {
  if (st.count == 0) return;
  const BoundBuffer& dst = o.operand(at, "dst", st.dst, st.count);
  const BoundBuffer& a = o.operand(at, "a", st.a, st.count);
  const BoundBuffer& b = o.operand(at, "b", st.b, st.count);
  if (partialOverlap(st.dst, st.count, st.a, st.count) || partialOverlap(st.dst, st.count, st.b, st.count))
    o.invalid(at, "dst partially overlaps an input (only exact aliasing is allowed)");
  if (!isRedOp(static_cast<uint8_t>(st.op)))
    o.invalid(at, "unknown reduction op " + std::to_string(static_cast<int>(st.op)));
  if (dtypeInfo(dst.dtype).integer || dtypeInfo(a.dtype).integer || dtypeInfo(b.dtype).integer)
    o.invalid(at, "a reduce does not take int32 operands (integers are routing data, never reduced)");
  const uint64_t n = st.count;
  if (redOpInfo(st.op).shape == RedOpShape::LseRows) {
    if (st.aux == 0 || n % (uint64_t{st.aux} + 1) != 0)
      o.invalid(at, std::string(toString(st.op)) + " needs count " + std::to_string(n) + " = rows x (row " +
                        std::to_string(st.aux) + " + 1) with row > 0");
    lseMergeRows({dst.dtype, dst.data, st.dst.offset}, {a.dtype, a.data, st.a.offset}, {b.dtype, b.data, st.b.offset},
                 n / (uint64_t{st.aux} + 1), st.aux);
    return;
  }
  if (dst.dtype == DType::Float32 && a.dtype == DType::Float32 && b.dtype == DType::Float32 && st.op == RedOp::Sum) {
    // Exact aliasing of d with x or y is fine: each element is read before it is written.
    float* d = reinterpret_cast<float*>(dst.data) + st.dst.offset;
    const float* x = reinterpret_cast<const float*>(a.data) + st.a.offset;
    const float* y = reinterpret_cast<const float*>(b.data) + st.b.offset;
    for (uint64_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
    return;
  }
  if (dtypeSize(dst.dtype) == 2 && dst.dtype == a.dtype && dst.dtype == b.dtype) {
    // One 16-bit dtype throughout (the common case): the dtype and Sum tests are hoisted out of the
    // element loop. Same rounding as the generic path (one conversion per element, one store).
    uint16_t* d = reinterpret_cast<uint16_t*>(dst.data) + st.dst.offset;
    const uint16_t* x = reinterpret_cast<const uint16_t*>(a.data) + st.a.offset;
    const uint16_t* y = reinterpret_cast<const uint16_t*>(b.data) + st.b.offset;
    if (dst.dtype == DType::BFloat16)
      reduceLoop(st.op, n, d, x, y, bf16ToFloat, floatToBf16);
    else
      reduceLoop(st.op, n, d, x, y, halfToFloat, floatToHalf);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    const float x = loadElement(a.dtype, a.data, st.a.offset + i);
    const float y = loadElement(b.dtype, b.data, st.b.offset + i);
    storeElement(dst.dtype, dst.data, st.dst.offset + i, applyRedOp(st.op, x, y));
  }
}

void gemmStep(const StepOperands& o, const StepAt& at, const Step& st, std::vector<float>& scratchA,
              std::vector<float>& scratchB) {
  const Schedule& s = o.schedule();
  if (st.aux >= s.gemms.size())
    o.invalid(at, "gemm index " + std::to_string(st.aux) + " is out of range (" + std::to_string(s.gemms.size()) +
                      " shapes)");
  const GemmShape& g = s.gemms[st.aux];
  const uint64_t m =
      g.extent < s.extents.size() ? scaleToExtent(g.m, s.extents[g.extent].bound, o.extentAt(at, g.extent)) : g.m;
  const uint64_t n = g.n, k = g.k, cols = gemmOutCols(g, st.flags);
  if (m == 0 || n == 0) return;
  const bool bColMajor = (st.flags & kStepBColMajor) != 0;
  const bool gated = (st.flags & kStepSwiGLU) != 0;
  if (gated && (n % 2 != 0 || (st.flags & kStepAccumulate)))
    o.invalid(at, "a SwiGLU epilogue needs an even n and no accumulate (n " + std::to_string(n) + ")");
  if (g.ldc < cols) o.invalid(at, "ldc " + std::to_string(g.ldc) + " < C's columns " + std::to_string(cols));
  if (k > 0 && g.lda < k) o.invalid(at, "lda " + std::to_string(g.lda) + " < k " + std::to_string(k));
  if (k > 0 && g.ldb < (bColMajor ? k : n))
    o.invalid(at,
              "ldb " + std::to_string(g.ldb) + " < " + (bColMajor ? "k " : "n ") + std::to_string(bColMajor ? k : n));
  const uint64_t cExtent = (m - 1) * g.ldc + cols;
  const BoundBuffer& c = o.operand(at, "dst (C)", st.dst, cExtent);
  if (dtypeInfo(c.dtype).integer)
    o.invalid(at, std::string("C is ") + toString(c.dtype) + ": a gemm writes a floating-point type");
  const bool accumulate = (st.flags & kStepAccumulate) != 0;
  if (k == 0) {
    if (!accumulate)
      for (uint64_t i = 0; i < m; ++i)
        for (uint64_t j = 0; j < cols; ++j) storeElement(c.dtype, c.data, st.dst.offset + i * g.ldc + j, 0.0f);
    return;
  }
  const uint64_t aExtent = (m - 1) * g.lda + k;
  const uint64_t bExtent = bColMajor ? (n - 1) * g.ldb + k : (k - 1) * g.ldb + n;
  const BoundBuffer& a = o.operand(at, "a (A)", st.a, aExtent);
  const BoundBuffer& b = o.operand(at, "b (B)", st.b, bExtent);
  if (anyOverlap(st.dst, cExtent, st.a, aExtent) || anyOverlap(st.dst, cExtent, st.b, bExtent))
    o.invalid(at, "the C tile overlaps the A or B tile");
  const GemmTileArgs t{m, n, k, g.lda, g.ldb, g.ldc, bColMajor, gated, accumulate};
  runGemm(t, {c.dtype, c.data, st.dst.offset}, {a.dtype, a.data, st.a.offset}, {b.dtype, b.data, st.b.offset}, scratchA,
          scratchB);
}

void routeStep(const StepOperands& o, const StepAt& at, const Step& st) {
  const Schedule& s = o.schedule();
  const RouteShape rs = routeShape(st);
  if (rs.topk == 0 || rs.experts == 0 || rs.capacity == 0 || st.count % rs.topk != 0)
    o.invalid(at, "topk, experts and capacity must be >= 1 and count a multiple of topk");
  const IndexedElements n = indexedElements(st);
  const BoundBuffer& dst = o.operand(at, "dst", st.dst, n.dst);
  const BoundBuffer& a = o.operand(at, "a", st.a, n.a);
  if (!dtypeInfo(dst.dtype).integer || !dtypeInfo(a.dtype).integer)
    o.invalid(at, "a route reads int32 ids and writes an int32 layout");
  if (anyOverlap(st.dst, n.dst, st.a, n.a)) o.invalid(at, "the layout overlaps the ids");
  if (const char* why = routeBucketsProblem(s, st)) o.invalid(at, why);
  runRoute(rs, a.data + st.a.offset * sizeof(int32_t), dst.data + st.dst.offset * sizeof(int32_t), at.rank, s.nodeOf,
           describeStep(s, at.rank, at.lane, at.step));
}

void gatherStep(const StepOperands& o, const StepAt& at, const Step& st) {
  const Schedule& s = o.schedule();
  if (st.aux == 0 || st.count % st.aux != 0) o.invalid(at, "count must be a whole number of rows >= 1");
  if (st.count == 0) return;  // a runtime extent of 0
  const IndexedElements n = indexedElements(st);
  const BoundBuffer& dst = o.operand(at, "dst", st.dst, n.dst);
  const BoundBuffer& a = o.operand(at, "a", st.a, n.a);
  const BoundBuffer& b = o.operand(at, "b", st.b, n.b);
  if (dst.dtype != a.dtype || !dtypeInfo(b.dtype).integer)
    o.invalid(at, "a gather moves rows of one dtype through int32 indices");
  if (anyOverlap(st.dst, n.dst, st.a, n.a) || anyOverlap(st.dst, n.dst, st.b, n.b))
    o.invalid(at, "dst overlaps its source rows or its indices");
  const std::size_t esize = dtypeSize(dst.dtype);
  runGather(dst.data + st.dst.offset * esize, a.data + st.a.offset * esize, b.data + st.b.offset * sizeof(int32_t), n.b,
            st.aux * esize, st.value, at.rank, describeStep(s, at.rank, at.lane, at.step));
}

void combineStep(const StepOperands& o, const StepAt& at, const Step& st, uint64_t live) {
  const Schedule& s = o.schedule();
  const CombineShape c = combineShape(st);
  if (c.topk == 0 || c.experts == 0 || c.row == 0 || st.count == 0 || st.count % c.row != 0)
    o.invalid(at, "topk, experts and row must be >= 1 and count a positive multiple of row");
  const IndexedElements n = indexedElements(st);
  const BoundBuffer& dst = o.operand(at, "dst", st.dst, n.dst);
  const BoundBuffer& a = o.operand(at, "a", st.a, n.a);
  const BoundBuffer& b = o.operand(at, "b", st.b, n.b);
  if (dst.dtype != DType::Float32 || a.dtype != DType::Float32 || !dtypeInfo(b.dtype).integer)
    o.invalid(at, "a combine reads float32 weights and rows and int32 ids and writes float32 rows");
  if (anyOverlap(st.dst, n.dst, st.a, n.a) || anyOverlap(st.dst, n.dst, st.b, n.b))
    o.invalid(at, "dst overlaps the rows, the weights or the ids");
  if (const char* why = routeBucketsProblem(s, st)) o.invalid(at, why);
  runCombine(c, live, dst.data + st.dst.offset * sizeof(float), a.data + st.a.offset * sizeof(float),
             b.data + st.b.offset * sizeof(int32_t), at.rank, s.nodeOf, describeStep(s, at.rank, at.lane, at.step));
}

void attentionStep(const StepOperands& o, const StepAt& at, const Step& st) {
  const AttentionShape& sh = attentionShapeOf(o, at, st);
  if (const std::string problem = attentionShapeProblem(sh); !problem.empty()) o.invalid(at, problem);
  const AttentionElements n = attentionElements(sh);
  const BoundBuffer& out = o.operand(at, "out (dst)", st.dst, n.out);
  const BoundBuffer& q = o.operand(at, "Q (a)", st.a, n.q);
  const BoundBuffer& kv = o.operand(at, "K/V (b)", st.b, n.kv);
  if (out.dtype != DType::Float32 || dtypeInfo(q.dtype).integer || q.dtype != kv.dtype)
    o.invalid(at, "attention reads Q and K/V of one float dtype and writes float32 rows");
  if (anyOverlap(st.dst, n.out, st.a, n.q) || anyOverlap(st.dst, n.out, st.b, n.kv))
    o.invalid(at, "out overlaps Q or K/V");
  runAttention(sh, {out.dtype, out.data, st.dst.offset}, {q.dtype, q.data, st.a.offset},
               {kv.dtype, kv.data, st.b.offset});
}

void attentionGradStep(const StepOperands& o, const StepAt& at, const Step& st) {
  const AttentionShape& sh = attentionShapeOf(o, at, st);
  if (const std::string problem = attentionGradShapeProblem(sh); !problem.empty()) o.invalid(at, problem);
  const AttentionGradElements n = attentionGradElements(sh);
  const BoundBuffer& dkv = o.operand(at, "dK/dV (dst)", st.dst, n.dkv);
  const BoundBuffer& qdo = o.operand(at, "Q/dO (a)", st.a, n.qdo);
  const BoundBuffer& kv = o.operand(at, "K/V (b)", st.b, n.kv);
  BufRef rows = st.dst, dq = st.dst;
  rows.offset = sh.rowsAt;
  dq.offset = sh.dqAt;
  o.operand(at, "forward rows (rowsAt in dst's buffer)", rows, n.rows);
  o.operand(at, "dQ (dqAt in dst's buffer)", dq, n.dq);
  if (dkv.dtype != DType::Float32 || dtypeInfo(qdo.dtype).integer || qdo.dtype != kv.dtype)
    o.invalid(at, "attention-grad reads Q/dO and K/V of one float dtype and adds into float32 dK/dV, dQ");
  if (anyOverlap(st.dst, n.dkv, rows, n.rows) || anyOverlap(st.dst, n.dkv, dq, n.dq) ||
      anyOverlap(rows, n.rows, dq, n.dq))
    o.invalid(at, "dK/dV, the forward rows and dQ overlap in dst's buffer");
  for (const auto& [w, wn] : {std::pair<const BufRef&, uint64_t>{st.dst, n.dkv}, {dq, n.dq}})
    if (anyOverlap(w, wn, st.a, n.qdo) || anyOverlap(w, wn, st.b, n.kv))
      o.invalid(at, "dK/dV or dQ overlaps Q/dO or K/V");
  runAttentionGrad(sh, {dkv.dtype, dkv.data, st.dst.offset}, {qdo.dtype, qdo.data, st.a.offset},
                   {kv.dtype, kv.data, st.b.offset}, {dkv.dtype, dkv.data, rows.offset},
                   {dkv.dtype, dkv.data, dq.offset});
}

}  // namespace mk::detail
