// mkernel — the schedule validator's rules for attention (attention.hpp): the shapes (phase A) and the steps that
// name them (phase B); the class is in validator.hpp.
#include <string>

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

}  // namespace mk::validation
