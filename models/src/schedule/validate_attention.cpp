// mkernel — the schedule validator's rules for attention (attention.hpp): the shapes (phase A) and the steps that
// name them (phase B); the class is in validator.hpp.
#include <iterator>
#include <string>
#include <tuple>

#include "mk/schedule/attention.hpp"
#include "validator.hpp"

namespace mk::validation {

void Validator::checkAttentionShapes() {
  for (std::size_t k = 0; k < s_.attentions.size(); ++k)
    if (std::string problem = attentionShapeProblem(s_.attentions[k]); !problem.empty())
      add(-1, -1, -1, "attentions[" + str(k) + "]: " + problem);
}

void Validator::checkAttention(uint32_t g, uint32_t i, const Step& st) {
  bool ok = true;
  if (st.aux >= s_.attentions.size()) {
    addStep(g, i, "attention index " + str(st.aux) + " out of range (" + str(s_.attentions.size()) + " shapes)");
    indexError_ = true;
    ok = false;
  }
  if (!operandsOnNode(g, i, st, {"out (dst)", "Q (a)", "K/V (b)"}, "attention")) return;
  const DType dq = s_.buffers[st.a.buffer].dtype, dkv = s_.buffers[st.b.buffer].dtype;
  const DType dOut = s_.buffers[st.dst.buffer].dtype;
  auto attentionInput = [](DType t) { return t == DType::Float32 || t == DType::BFloat16 || t == DType::Float16; };
  if (dq != dkv || !attentionInput(dq))
    addStep(g, i,
            std::string("Q and K/V must share one dtype of float32, bfloat16, float16: Q ") + bufName(st.a.buffer) +
                " is " + toString(dq) + ", K/V " + bufName(st.b.buffer) + " is " + toString(dkv));
  if (dOut != DType::Float32)
    addStep(g, i,
            "out (dst) " + bufName(st.dst.buffer) + " is " + toString(dOut) +
                ", expected float32 (its rows end with a log-sum-exp that lse-merge reads back)");
  if (!ok) return;
  const AttentionShape& sh = s_.attentions[st.aux];
  if (!attentionShapeProblem(sh).empty()) return;  // reported once for the shape
  const AttentionElements n = attentionElements(sh);
  rangeOk(g, i, st.a, "Q (a)", n.q);
  rangeOk(g, i, st.b, "K/V (b)", n.kv);
  rangeOk(g, i, st.dst, "out (dst)", n.out);
  for (const auto& [name, ref, len] :
       {std::tuple<const char*, const BufRef*, uint64_t>{"Q (a)", &st.a, n.q}, {"K/V (b)", &st.b, n.kv}}) {
    if (ref->rank != st.dst.rank || ref->buffer != st.dst.buffer) continue;
    if (st.dst.offset < addSat(ref->offset, len) && ref->offset < addSat(st.dst.offset, n.out))
      addStep(g, i,
              std::string("out (dst) [") + str(st.dst.offset) + ", " + str(addSat(st.dst.offset, n.out)) +
                  ") overlaps " + name + " [" + str(ref->offset) + ", " + str(addSat(ref->offset, len)) +
                  ") in buffer " + bufName(st.dst.buffer) + ": write the rows to another region");
  }
}

void Validator::checkAttentionGrad(uint32_t g, uint32_t i, const Step& st) {
  if (st.aux >= s_.attentions.size()) {
    addStep(g, i, "attention index " + str(st.aux) + " out of range (" + str(s_.attentions.size()) + " shapes)");
    indexError_ = true;
    return;
  }
  if (!operandsOnNode(g, i, st, {"dK/dV (dst)", "Q/dO (a)", "K/V (b)"}, "attention-grad")) return;
  const DType dq = s_.buffers[st.a.buffer].dtype, dkv = s_.buffers[st.b.buffer].dtype;
  const DType dGrad = s_.buffers[st.dst.buffer].dtype;
  if (dq != dkv || !(dq == DType::Float32 || dq == DType::BFloat16 || dq == DType::Float16))
    addStep(g, i,
            std::string("Q/dO and K/V must share one dtype of float32, bfloat16, float16: Q/dO ") +
                bufName(st.a.buffer) + " is " + toString(dq) + ", K/V " + bufName(st.b.buffer) + " is " +
                toString(dkv));
  if (dGrad != DType::Float32)
    addStep(g, i,
            "dK/dV (dst) " + bufName(st.dst.buffer) + " is " + toString(dGrad) +
                ", expected float32 (the gradients accumulate there, with the forward's rows and dQ)");
  const AttentionShape& sh = s_.attentions[st.aux];
  if (!attentionShapeProblem(sh).empty()) return;  // reported once for the shape
  if (const std::string problem = attentionGradShapeProblem(sh); !problem.empty()) {
    addStep(g, i, "attention " + str(st.aux) + " as attention-grad: " + problem);
    return;
  }
  const AttentionGradElements n = attentionGradElements(sh);
  BufRef rows = st.dst, dqRef = st.dst;
  rows.offset = sh.rowsAt;
  dqRef.offset = sh.dqAt;
  rangeOk(g, i, st.a, "Q/dO (a)", n.qdo);
  rangeOk(g, i, st.b, "K/V (b)", n.kv);
  rangeOk(g, i, st.dst, "dK/dV (dst)", n.dkv);
  rangeOk(g, i, rows, "forward rows (rowsAt)", n.rows);
  rangeOk(g, i, dqRef, "dQ (dqAt)", n.dq);
  const std::tuple<const char*, const BufRef*, uint64_t> regions[] = {{"dK/dV (dst)", &st.dst, n.dkv},
                                                                      {"dQ (dqAt)", &dqRef, n.dq},
                                                                      {"forward rows (rowsAt)", &rows, n.rows},
                                                                      {"Q/dO (a)", &st.a, n.qdo},
                                                                      {"K/V (b)", &st.b, n.kv}};
  for (std::size_t w = 0; w < 2; ++w)  // the two written regions against every other one
    for (std::size_t o = w + 1; o < std::size(regions); ++o) {
      const auto& [wName, wRef, wLen] = regions[w];
      const auto& [oName, oRef, oLen] = regions[o];
      if (wRef->rank != oRef->rank || wRef->buffer != oRef->buffer) continue;
      if (wRef->offset < addSat(oRef->offset, oLen) && oRef->offset < addSat(wRef->offset, wLen))
        addStep(g, i,
                std::string(wName) + " [" + str(wRef->offset) + ", " + str(addSat(wRef->offset, wLen)) + ") overlaps " +
                    oName + " [" + str(oRef->offset) + ", " + str(addSat(oRef->offset, oLen)) + ") in buffer " +
                    bufName(wRef->buffer));
    }
}

}  // namespace mk::validation
