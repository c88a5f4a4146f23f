// mkernel — the lowering's GEMMs, FP8 casts and other kernels with their FLOPs and HBM bytes (docs/planner.md,
// "Kernel census").
#include "lowering_internal.hpp"

#include <string>

#include "mk/error.hpp"

namespace mk::detail {

uint32_t StageBuilder::addGemm(const std::string& name, Pass pass, uint64_t m, uint64_t n, uint64_t k, uint64_t batch,
                               uint32_t times, bool recompute, bool linearLayer) {
  if (recompute && !rerun(name)) return UINT32_MAX;
  ComputeOp op;
  op.name = name;
  op.kind = ComputeKind::Gemm;
  op.cls = KernelClass::Gemm;
  op.kernel = name;
  op.pass = pass;
  op.dtype = w_.training.dtype;
  op.fp8 = fp8Gemm(name);
  op.m = m;
  op.n = n;
  op.k = k;
  op.batch = batch;
  op.flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch);
  const bool wgrad = name.size() > 6 && name.compare(name.size() - 6, 6, ".wgrad") == 0;
  // FP8: one-byte operands, the output in bf16 (Transformer Engine's GEMMs). A linear layer's weight-gradient
  // GEMM under gradient-accumulation fusion adds into the fp32 main gradient: its output is read and written in
  // fp32. The router is no such layer (ComputeOp::linearLayer).
  const double in = op.fp8 ? 1.0 : elemBytes_;
  op.linearLayer = linearLayer;
  op.accumulateFp32 = wgrad && fusedGradAccum() && linearLayer;
  const double outBytes = op.accumulateFp32 ? 8.0 : elemBytes_;
  op.bytes = dbl(batch) * (in * (dbl(m) * dbl(k) + dbl(k) * dbl(n)) + outBytes * dbl(m) * dbl(n));
  op.times = times;
  op.recompute = recompute;
  out_.compute.push_back(op);
  const uint32_t idx = static_cast<uint32_t>(out_.compute.size() - 1);
  // The A operand of a forward or data-gradient GEMM (the activation, the output gradient) is cast to FP8
  // per micro-batch, after an amax for its per-tensor scale; the weight-gradient GEMM reuses both casts (the
  // input saved in FP8, the output gradient's transposed copy from the same cast), the weights are cast once per
  // step (addStepKernels).
  if (op.fp8 && !wgrad) addCast(name, pass, dbl(m) * dbl(k) * dbl(batch) / spGathered(name), times, recompute);
  return idx;
}

double StageBuilder::spGathered(const std::string& name) const {
  if (!w_.layout.sp || r_.tp == 1) return 1;
  const std::string base = name.substr(0, name.find('.'));
  const bool dgrad = name.find(".dgrad") != std::string::npos;
  return (!dgrad && isColumnInput(base)) || (dgrad && (base == "attn-out" || base == "mlp-down"))
             ? static_cast<double>(r_.tp)
             : 1;
}

bool StageBuilder::fp8Gemm(const std::string& name) const {
  if (!w_.training.fp8) return false;
  const std::string base = name.substr(0, name.find('.'));
  return base != "lm-head" && base != "router";
}

void StageBuilder::addCast(const std::string& prefix, Pass pass, double elements, uint32_t times, bool recompute) {
  ComputeOp a;
  a.cls = KernelClass::Cast;
  a.kernel = "amax";
  a.elements = static_cast<uint64_t>(elements);
  addKernel(a, prefix + ".amax", pass, times, recompute);
  a.kernel = "cast-fp8";
  a.fp8 = true;
  addKernel(a, prefix + ".cast", pass, times, recompute);
}

void StageBuilder::kernelCost(ComputeOp& op, bool grad) const {
  const double e = elemBytes_, t = dbl(op.tokens), h = dbl(op.hidden), v = dbl(op.vocab);
  switch (op.cls) {
    case KernelClass::Norm: {
      const bool ln = op.kernel == "layernorm";
      const double affine = ln ? 2 : 1, stats = t * 4 * (ln ? 2 : 1);  // weight (and bias); rstd (and mean)
      op.flops = (grad ? 8 : 5) * t * h;
      op.bytes = grad ? 3 * e * t * h + 2 * e * affine * h + stats : 2 * e * t * h + e * affine * h + stats;
      return;
    }
    case KernelClass::Activation:
      if (op.kernel == "swiglu" || op.kernel == "geglu") {  // hidden = gate + up = 2 f
        const double f = h / 2;
        // geglu: gelu's 8 (12 backward) per gate element, and the product with up (2 more backward).
        op.flops = op.kernel == "swiglu" ? (grad ? 10 : 5) * t * f : (grad ? 14 : 9) * t * f;
        op.bytes = grad ? e * t * f + 2 * e * t * h : e * t * h + e * t * f;
      } else {
        // squared-relu: max and square (compare and two products backward); gelu: its tanh form.
        const bool sq = op.kernel == "squared-relu";
        op.flops = (grad ? (sq ? 3 : 12) : (sq ? 2 : 8)) * t * h;
        op.bytes = (grad ? 3 : 2) * e * t * h;
      }
      return;
    case KernelClass::Rotary:  // x in and out, cos and sin one row per token
      op.flops = 3 * t * dbl(op.heads) * dbl(op.headDim);
      op.bytes = 2 * e * t * dbl(op.heads) * dbl(op.headDim) + 2 * e * t * dbl(op.headDim);
      return;
    case KernelClass::Residual:
      op.flops = t * h;
      op.bytes = 3 * e * t * h;
      return;
    case KernelClass::Loss:  // logits; int64 labels, fp32 loss and log-sum-exp
      op.flops = (grad ? 3 : 4) * t * v;
      op.bytes = grad ? 2 * e * t * v + 12 * t : e * t * v + 16 * t;
      return;
    case KernelClass::Embedding:  // int64 ids; backward: a scatter-add into the rank's vocab x h gradient
      op.flops = grad ? t * h : 0;
      op.bytes = grad ? 8 * t + e * t * h + e * v * h : 8 * t + 2 * e * t * h;
      return;
    case KernelClass::Optimizer:
      if (op.kernel == "grad-accum") {  // a 16-bit gradient read, added into the fp32 main gradient
        op.flops = dbl(op.params);
        op.bytes = (e + 8) * dbl(op.params);
      } else if (op.kernel == "param-copy") {  // fp32 master read, the bf16 (model dtype) parameter written
        op.flops = dbl(op.params);
        op.bytes = (4 + e) * dbl(op.params);
      } else if (op.kernel == "zero-grad") {  // the fp32 main-gradient buffer set to zero
        op.flops = 0;
        op.bytes = 4 * dbl(op.params);
      } else {  // adam: fp32 param, grad, m, v read; param, m, v written
        op.flops = 12 * dbl(op.params);
        op.bytes = 28 * dbl(op.params);
      }
      return;
    case KernelClass::GradNorm:  // the norm reads every fp32 gradient, the clipping scale reads and writes them
      op.flops = 3 * dbl(op.params);
      op.bytes = 12 * dbl(op.params);
      return;
    case KernelClass::Cast:
      // amax reads the bf16 tensor; Transformer Engine's cast-transpose reads it and writes the fp8 copy and its
      // transpose (the layouts Hopper's FP8 GEMMs need).
      op.flops = dbl(op.elements);
      op.bytes = (op.kernel == "amax" ? 2 : 4) * dbl(op.elements);
      return;
    case KernelClass::Router: {  // logits in, fp32 weights and int64 indices of the top k out
      const double te = t * dbl(op.experts), tk = t * dbl(op.topk);
      op.flops = (grad ? 4 : 5) * te;
      op.bytes = grad ? 3 * e * te + 12 * tk : e * te + 12 * tk;
      return;
    }
    case KernelClass::Permute: {  // rows = tokens x top k; int32 row maps (and fp32 weights to unpermute)
      const double rows = t * dbl(op.topk);
      const bool un = op.kernel == "unpermute";
      op.flops = un ? 2 * rows * h : 0;
      op.bytes = un ? e * rows * h + e * t * h + 12 * rows : e * t * h + e * rows * h + 16 * rows;
      return;
    }
    case KernelClass::Gemm:
    case KernelClass::Attention: break;
  }
  throw Error(ErrorCode::Internal, "kernelCost: " + op.name + " is a GEMM or attention kernel");
}

uint32_t StageBuilder::addKernel(ComputeOp op, const std::string& name, Pass pass, uint32_t times, bool recompute,
                                 bool grad) {
  if (times == 0 || (recompute && !rerun(name))) return UINT32_MAX;
  op.name = name;
  op.kind = ComputeKind::Other;
  op.pass = pass;
  if (op.cls != KernelClass::Optimizer && op.cls != KernelClass::GradNorm) op.dtype = w_.training.dtype;
  op.times = times;
  op.recompute = recompute;
  kernelCost(op, grad);
  out_.compute.push_back(op);
  return static_cast<uint32_t>(out_.compute.size() - 1);
}

ComputeOp StageBuilder::shape(KernelClass cls, const char* kernel, uint64_t tokens, uint64_t hidden) {
  ComputeOp op;
  op.cls = cls;
  op.kernel = kernel;
  op.tokens = tokens;
  op.hidden = hidden;
  return op;
}

}  // namespace mk::detail
