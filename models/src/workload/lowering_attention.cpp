// mkernel — the lowering's attention: the input projections (MLA's too), the attention kernel and the
// context-parallel exchanges around it (docs/planner.md, "Context parallelism").
#include "lowering_internal.hpp"

#include <algorithm>
#include <string>

#include "lowering_groups.hpp"
#include "mk/workload/model_shape.hpp"

namespace mk::detail {

void StageBuilder::addContextParallel(bool forward, Pass pass, uint32_t times, const std::string& sfx) {
  // Called right after the attention: a recomputation that does not run the attention again needs no K/V.
  if (out_.compute.empty() || out_.compute.back().kind != ComputeKind::Attention) return;
  const uint64_t q = w_.model.heads / r_.tp;
  for (const detail::CpExchange& x : detail::cpExchanges(w_.layout, tokens_, q, kvLocal_, d_)) {
    if ((x.pass == Pass::Forward) != forward) continue;
    const uint32_t c = addComm(x.name + sfx, Phase::Cp, x.kind, pass, x.timing, x.count, w_.training.dtype,
                               times * x.perLayer, x.ring ? cpRingGroups_ : cpGroups_);
    if (x.ring) addRingBlock(forward, pass, times, c);
  }
}

void StageBuilder::addRingBlock(bool forward, Pass pass, uint32_t times, uint32_t ringComm) {
  // The attention kernels the ring's sends overlap: the run of attention ops just before it (the forward's full
  // and sliding-window layers share one ring op; the backward has one per attention op).
  FusedBlock b;
  b.kind = FusedBlockKind::RingAttention;
  b.pass = pass;
  b.mirror = !forward;
  b.times = times;
  b.groups = cpRingRanksGroups_;
  b.comm = {ringComm};
  for (std::size_t i = out_.compute.size(); i > 0 && out_.compute[i - 1].kind == ComputeKind::Attention; --i)
    b.compute.insert(b.compute.begin(), static_cast<uint32_t>(i - 1));
  // The shape addAttention gives the rank: all of a group's tokens of heads / a after the Ulysses all-to-all.
  const uint64_t a = detail::cpA2aRanks(w_.layout);
  b.batch = w_.training.microBatch;
  b.heads = w_.model.heads / r_.tp / a;
  b.kvHeads = std::max<uint64_t>(1, kvLocal_ / a);
  b.headDim = dqk_;
  b.seq = w_.training.seq;
  b.dtype = w_.training.dtype;
  for (uint32_t i : b.compute)
    if (out_.compute[i].n < b.seq)
      b.unfusable = "sliding-window attention (model.slidingWindow " + std::to_string(w_.model.slidingWindow) +
                    "): ring-attention computes every key a causal query sees";
  if (dqk_ != dv_)
    b.unfusable = "queries and keys of " + std::to_string(dqk_) + " and values of " + std::to_string(dv_) +
                  " per head (MLA): ring-attention takes one head dim";
  out_.fusedBlocks.push_back(std::move(b));
}

void StageBuilder::addAttention(Pass pass, uint32_t times, bool recompute, bool backward, bool windowed) {
  if (times == 0 || (recompute && !rerun("attention"))) return;
  // Context parallelism: a Ulysses all-to-all over a ranks leaves each rank all of a group's tokens for 1 / a of
  // its heads; a ring (p2p, all-gather) of the remaining cp / a ranks leaves it s / ring query rows against all
  // s keys, 1 / ring of the causal work with zigzag load balancing (each rank holds chunks i and 2 ring - 1 - i),
  // and reads every K/V block once.
  const uint64_t s = w_.training.seq;
  const uint64_t a = detail::cpA2aRanks(w_.layout), ring = r_.cp / a;
  const uint64_t heads = w_.model.heads / r_.tp / a, kv = std::max<uint64_t>(1, kvLocal_ / a);
  const uint64_t rowsQ = s / ring;
  const uint64_t batch = uint64_t{w_.training.microBatch} * heads;
  const uint64_t window = windowed ? w_.model.slidingWindow : 0;
  ComputeOp op;
  op.name = std::string(windowed ? "attention-swa" : "attention") + (backward ? ".bwd" : recompute ? ".recompute" : "");
  op.kind = ComputeKind::Attention;
  op.cls = KernelClass::Attention;
  op.kernel = backward ? "attention.bwd" : "attention";
  op.pass = pass;
  op.dtype = w_.training.dtype;
  op.m = rowsQ;
  op.n = window ? std::min(s, window) : s;  // the keys one query sees
  op.k = dqk_;
  op.batch = batch;
  op.seqs = w_.training.microBatch;
  op.seq = s;
  op.heads = heads;
  op.kvHeads = kv;
  op.headDim = dqk_;
  op.causal = true;
  // QK^T over dqk and PV over dv dimensions for the keys each query sees (s / 2 on average without a window).
  const double keysPerQuery = causalKeys(s, window) / dbl(s);
  const double fwdFlops = 2.0 * dbl(dqk_ + dv_) * dbl(rowsQ) * keysPerQuery * dbl(batch);
  const double rows = dbl(op.seqs) * dbl(rowsQ);
  const double qo = rows * dbl(heads) * dbl(dqk_ + dv_) / 2 * elemBytes_;
  const double kvBytes = dbl(op.seqs) * dbl(s) * dbl(kv) * dbl(dqk_ + dv_) / 2 * elemBytes_;
  const double lse = rows * dbl(heads) * 4;
  // FlashAttention's backward runs five of these matrix products (QK^T again, dV, dP, dQ, dK) against two
  // forward; it reads Q, K, V, O, dO and the log-sum-exp and writes dQ, dK, dV.
  op.flops = backward ? 2.5 * fwdFlops : fwdFlops;
  op.bytes = backward ? 4.0 * qo + 4.0 * kvBytes + lse : 2.0 * qo + 2.0 * kvBytes + lse;
  op.times = times;
  op.recompute = recompute;
  out_.compute.push_back(op);
}

bool StageBuilder::isColumnInput(const std::string& base) {
  return base == "qkv" || base == "mlp-up" || base == "q-down" || base == "q" || base == "shared-up";
}

void StageBuilder::addProjections(Pass pass, bool recompute, const std::string& sfx) {
  const ModelShape& m = w_.model;
  const uint32_t L = out_.layers;
  const uint64_t h = m.hidden, heads = m.heads / r_.tp;
  ComputeOp rope = shape(KernelClass::Rotary, "rope", tokens_, 0);
  std::string first = "qkv";
  uint32_t firstGemm = 0;
  if (!m.mla) {
    firstGemm = addGemm("qkv" + sfx, pass, tokens_, qkvN_, h, 1, L, recompute);
    rope.heads = heads + kvLocal_;  // q and k heads of the rank, one launch
    rope.kvHeads = kvLocal_;
    rope.headDim = d_;
  } else {
    const MlaSpec& x = *m.mla;
    if (x.qLoraRank) {
      first = "q-down";
      firstGemm = addGemm("q-down" + sfx, pass, tokens_, x.qLoraRank, h, 1, L, recompute);
      addKernel(shape(KernelClass::Norm, "rmsnorm", tokens_, x.qLoraRank), "q-norm" + sfx, pass, L, recompute);
      addGemm("q-up" + sfx, pass, tokens_, heads * dqk_, x.qLoraRank, 1, L, recompute);
    } else {
      first = "q";
      firstGemm = addGemm("q" + sfx, pass, tokens_, heads * dqk_, h, 1, L, recompute);
    }
    addGemm("kv-down" + sfx, pass, tokens_, x.kvLoraRank + x.qkRopeHeadDim, h, 1, L, recompute);
    addKernel(shape(KernelClass::Norm, "rmsnorm", tokens_, x.kvLoraRank), "kv-norm" + sfx, pass, L, recompute);
    addGemm("kv-up" + sfx, pass, tokens_, heads * (x.qkNopeHeadDim + x.vHeadDim), x.kvLoraRank, 1, L, recompute);
    rope.heads = heads + 1;  // the rank's query heads and the one rope key head the heads share
    rope.kvHeads = 1;
    rope.headDim = x.qkRopeHeadDim;
  }
  if (w_.layout.sp) tpBoundary("tp.ag." + first + sfx, CommKind::AllGather, pass, firstGemm, L);
  addKernel(rope, "rope" + sfx, pass, L, recompute);
}

}  // namespace mk::detail
