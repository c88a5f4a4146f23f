// mkernel — the command-line block of the operators that are not a collective or a fused GEMM + collective:
// moe-dispatch-gemm and moe-ffn (mk/algorithms/moe.hpp) and ring-attention (mk/algorithms/attention.hpp), shared by
// mk-sim and mk-schedule so that "--op ring-attention --seq 4096" means the same thing in both. An option of one op
// given to another op is refused, naming the option; the two MoE ops share their routing options. Header-only and for
// tools: it needs CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/error.hpp"
#include "mk/util/cli.hpp"

namespace mk::cli {

/// The op names of the operators this block sizes.
inline constexpr const char* kMoeDispatchGemmOp = "moe-dispatch-gemm";
inline constexpr const char* kMoeFfnOp = "moe-ffn";
inline constexpr const char* kRingAttentionOp = "ring-attention";

/// Whether `op` is moe-dispatch-gemm, moe-ffn or ring-attention.
inline bool isOperatorOp(const std::string& op) {
  return op == kMoeDispatchGemmOp || op == kMoeFfnOp || op == kRingAttentionOp;
}

/// Whether `op` is one of the MoE operators (moe-dispatch-gemm, moe-ffn).
inline bool isMoeOp(const std::string& op) { return op == kMoeDispatchGemmOp || op == kMoeFfnOp; }

/// What the options of moe-dispatch-gemm and ring-attention say, as typed (0: not given).
struct OperatorArgs {
  // moe-dispatch-gemm (MoeDispatchGemmSpec)
  uint32_t experts = 0, topk = 0, tokens = 0, hidden = 0, outCols = 0;
  uint32_t ffn = 0;              ///< moe-ffn's F
  std::string combine = "auto";  ///< moe-ffn's return across nodes (MoeCombineReturn's names)
  uint32_t capacity = 0;         ///< 0: T
  double imbalance = 1.0;
  // ring-attention (RingAttentionSpec)
  uint64_t seq = 0;
  uint32_t heads = 0, kvHeads = 0, headDim = 0, batch = 1;
  bool causal = false;
  bool backward = false;           ///< ring-attention's backward (generateRingAttentionBackward) instead of the forward
  std::vector<std::string> given;  ///< the options of this block named on the command line
};

/// Every option of the block and the op it belongs to (moe-dispatch-gemm's routing options are moe-ffn's too:
/// optionApplies).
inline const std::vector<std::pair<const char*, const char*>>& operatorOptionOps() {
  static const std::vector<std::pair<const char*, const char*>> options = {{"--experts", kMoeDispatchGemmOp},
                                                                           {"--topk", kMoeDispatchGemmOp},
                                                                           {"--tokens", kMoeDispatchGemmOp},
                                                                           {"--hidden", kMoeDispatchGemmOp},
                                                                           {"--out-cols", kMoeDispatchGemmOp},
                                                                           {"--capacity", kMoeDispatchGemmOp},
                                                                           {"--imbalance", kMoeDispatchGemmOp},
                                                                           {"--seq", kRingAttentionOp},
                                                                           {"--heads", kRingAttentionOp},
                                                                           {"--kv-heads", kRingAttentionOp},
                                                                           {"--head-dim", kRingAttentionOp},
                                                                           {"--batch", kRingAttentionOp},
                                                                           {"--causal", kRingAttentionOp},
                                                                           {"--backward", kRingAttentionOp},
                                                                           {"--ffn", kMoeFfnOp},
                                                                           {"--combine", kMoeFfnOp}};
  return options;
}

/// Whether option `name` of owner `owner` (operatorOptionOps) applies to `op`: its owner's, and for moe-ffn also
/// moe-dispatch-gemm's options but --out-cols (moe-ffn's GEMMs are sized by --ffn and --hidden).
inline bool optionApplies(const std::string& name, const std::string& owner, const std::string& op) {
  return owner == op || (op == kMoeFfnOp && owner == kMoeDispatchGemmOp && name != "--out-cols");
}

/// The ops option `name` of owner `owner` applies to, in words.
inline std::string optionOwners(const std::string& name, const std::string& owner) {
  return owner == kMoeDispatchGemmOp && name != "--out-cols" ? owner + " and " + kMoeFfnOp : owner;
}

/// Add the options of moe-dispatch-gemm and ring-attention to `app`, bound to `a`.
inline void addOperatorOptions(CLI::App& app, OperatorArgs& a) {
  app.add_option("--experts", a.experts, "moe-dispatch-gemm, moe-ffn: experts on every rank (E)");
  app.add_option("--topk", a.topk, "moe-dispatch-gemm, moe-ffn: experts each token is routed to (at most ranks x E)");
  app.add_option("--tokens", a.tokens, "moe-dispatch-gemm, moe-ffn: tokens on every rank (T)");
  app.add_option("--hidden", a.hidden,
                 "moe-dispatch-gemm, moe-ffn: features of a token, the (first) expert GEMM's k; a multiple of 8");
  app.add_option("--ffn", a.ffn,
                 "moe-ffn: the experts' intermediate size F (gate and up: 2F columns, SwiGLU, then F -> hidden); a "
                 "multiple of 8");
  app.add_option("--combine", a.combine,
                 "moe-ffn: how expert rows come back across nodes: per-block (a row per token and expert), node-sum "
                 "(summed per token and node on the dispatch's relays) or auto (default; mk-sim: the shorter SimGrid "
                 "replay of the two at the expected loads, as mk-plan chooses; mk-schedule, which replays nothing, "
                 "needs one named across nodes); one schedule on one node");
  app.add_option("--out-cols", a.outCols,
                 "moe-dispatch-gemm: columns of an expert's output, the expert GEMM's n; a multiple of 8");
  app.add_option("--capacity", a.capacity,
                 "moe-dispatch-gemm, moe-ffn: most tokens one rank may send one expert (default: --tokens, never "
                 "drops; moe-ffn: at most --tokens)");
  app.add_option("--imbalance", a.imbalance,
                 "moe-dispatch-gemm, moe-ffn: the expected tokens per (rank, expert) are the uniform T x topk / "
                 "(ranks x E) "
                 "times this (>= 1, capped at the capacity; default 1); --extents prices a given routing instead");
  app.add_option("--seq", a.seq,
                 "ring-attention: tokens of the whole sequence, a multiple of the ranks (of 2 x ranks with --causal)");
  app.add_option("--heads", a.heads, "ring-attention: query heads (Hq)");
  app.add_option("--kv-heads", a.kvHeads, "ring-attention: key / value heads, Hq a multiple of it (default: --heads)");
  app.add_option("--head-dim", a.headDim, "ring-attention: features per head (D)");
  app.add_option("--batch", a.batch, "ring-attention: sequences (B; default 1)");
  app.add_flag("--causal", a.causal, "ring-attention: mask later keys, tokens placed in zigzag order for balance");
  app.add_flag("--backward", a.backward,
               "ring-attention: the backward pass (dQ stays, K/V travel with their dK/dV accumulators) instead of the "
               "forward");
}

/// After parse(): `a.given` names the block's options on the command line, and the counting ones must not be 0.
/// Returns kContinue or the exit code.
inline int finishOperatorOptions(const CLI::App& app, const char* tool, OperatorArgs& a) {
  a.given.clear();
  for (const auto& [name, op] : operatorOptionOps())
    if (app.count(name) > 0) a.given.emplace_back(name);
  return requirePositive(app, tool,
                         {{"--experts", a.experts},
                          {"--topk", a.topk},
                          {"--tokens", a.tokens},
                          {"--hidden", a.hidden},
                          {"--out-cols", a.outCols},
                          {"--ffn", a.ffn},
                          {"--capacity", a.capacity},
                          {"--seq", a.seq},
                          {"--heads", a.heads},
                          {"--kv-heads", a.kvHeads},
                          {"--head-dim", a.headDim},
                          {"--batch", a.batch}});
}

/// Refuse an option of this block given to an op it does not belong to ("--experts applies to moe-dispatch-gemm and
/// moe-ffn, not to allreduce"), and for moe-dispatch-gemm, moe-ffn or ring-attention an option of the collectives or
/// the fused ops other than --op, --cluster, --nodes, --ranks, --profile (and --dtype for ring-attention). Throws
/// Error(InvalidArgument).
inline void checkOperatorOptions(const std::string& op, const OperatorArgs& a, const CollectiveArgs& coll) {
  for (const auto& [name, owner] : operatorOptionOps())
    if (!optionApplies(name, owner, op) && std::find(a.given.begin(), a.given.end(), name) != a.given.end())
      throw Error(ErrorCode::InvalidArgument,
                  std::string(name) + " applies to " + optionOwners(name, owner) + ", not to " + op);
  if (!isOperatorOp(op)) return;
  const std::vector<std::string> shared = {"--op", "--cluster", "--nodes", "--ranks", "--profile"};
  for (const std::string& name : coll.given)
    if (std::find(shared.begin(), shared.end(), name) == shared.end() && !(name == "--dtype" && op == kRingAttentionOp))
      throw Error(ErrorCode::InvalidArgument,
                  name + " does not apply to " + op + ": it is sized by " +
                      (op == kMoeDispatchGemmOp ? "--experts, --topk, --tokens, --hidden, --out-cols"
                       : op == kMoeFfnOp        ? "--experts, --topk, --tokens, --hidden, --ffn"
                                                : "--seq, --heads, --head-dim"));
}

namespace detail {
inline void requireGiven(const OperatorArgs& a, const char* op,
                         std::initializer_list<std::pair<const char*, const char*>> required) {
  for (const auto& [name, what] : required)
    if (std::find(a.given.begin(), a.given.end(), name) == a.given.end())
      throw Error(ErrorCode::InvalidArgument, std::string(name) + " is required for " + op + " (" + what + ")");
}
}  // namespace detail

namespace detail {
/// A MoE spec of either op from `a`: the options both ops share required (`last` names the op's own, sized by
/// `set`), then the routing fields copied.
template <class Spec, class Set>
Spec moeSpecFrom(const OperatorArgs& a, const char* op, std::pair<const char*, const char*> last, Set&& set) {
  requireGiven(a, op,
               {{"--experts", "experts per rank"},
                {"--topk", "experts per token"},
                {"--tokens", "tokens per rank"},
                {"--hidden", "features of a token"},
                last});
  Spec spec;
  spec.experts = a.experts;
  spec.topk = a.topk;
  spec.tokens = a.tokens;
  spec.hidden = a.hidden;
  if (a.capacity > 0) spec.capacity = a.capacity;
  spec.imbalance = a.imbalance;
  set(spec);
  return spec;
}
}  // namespace detail

/// The moe-dispatch-gemm spec `a` asks for: --experts, --topk, --tokens, --hidden and --out-cols required; the
/// shape rules are validateMoeDispatchGemmSpec's, checked once the rank count is known. Throws
/// Error(InvalidArgument).
inline MoeDispatchGemmSpec moeSpecOf(const OperatorArgs& a) {
  return detail::moeSpecFrom<MoeDispatchGemmSpec>(a, kMoeDispatchGemmOp,
                                                  {"--out-cols", "columns of an expert's output"},
                                                  [&](MoeDispatchGemmSpec& s) { s.outCols = a.outCols; });
}

/// The moe-ffn spec `a` asks for: --experts, --topk, --tokens, --hidden and --ffn required, --combine one of auto,
/// per-block, node-sum; the shape rules are validateMoeFfnSpec's, checked once the rank count is known. Throws
/// Error(InvalidArgument).
inline MoeFfnSpec moeFfnSpecOf(const OperatorArgs& a) {
  const auto combine = parseMoeCombineReturn(a.combine);
  if (!combine)
    throw Error(ErrorCode::InvalidArgument,
                "unknown --combine '" + a.combine + "' (expected auto, per-block, node-sum)");
  return detail::moeSpecFrom<MoeFfnSpec>(a, kMoeFfnOp, {"--ffn", "the experts' intermediate size"}, [&](MoeFfnSpec& s) {
    s.ffn = a.ffn;
    s.combineReturn = *combine;
  });
}

/// The ring-attention spec `a` asks for on a GPU with `sms` SMs: --seq, --heads and --head-dim required, --kv-heads
/// defaulting to --heads, `dtype` (bfloat16 unless --dtype is named in `coll.given`), and the compute lane weighted
/// with every SM the send lane does not use (sms - 1). The shape rules are validateRingAttentionSpec's. Throws
/// Error(InvalidArgument).
inline RingAttentionSpec attentionSpecOf(const OperatorArgs& a, const CollectiveArgs& coll, uint32_t sms) {
  detail::requireGiven(
      a, kRingAttentionOp,
      {{"--seq", "tokens of the whole sequence"}, {"--heads", "query heads"}, {"--head-dim", "features per head"}});
  RingAttentionSpec spec;
  spec.batch = a.batch;
  spec.qHeads = a.heads;
  spec.kvHeads = a.kvHeads > 0 ? a.kvHeads : a.heads;
  spec.headDim = a.headDim;
  spec.seq = a.seq;
  spec.causal = a.causal;
  const bool dtypeNamed = std::find(coll.given.begin(), coll.given.end(), "--dtype") != coll.given.end();
  spec.dtype = dtypeNamed ? requireDType(coll.dtype, "--dtype") : DType::BFloat16;
  spec.computeCtas = sms > 1 ? sms - 1 : 1;
  return spec;
}

}  // namespace mk::cli
