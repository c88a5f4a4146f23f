// mkernel — the mixture-of-experts operators as generators: moe-dispatch-gemm (issue 39 item 4), a MoE dispatch
// whose routing the schedule computes from the router's expert ids (routing as data, mk/schedule/route.hpp)
// followed by each receiver's expert GEMMs (docs/schedule-format.md, "Routing as data"), and moe-ffn, the whole
// expert FFN of a MoE layer: that dispatch, the SwiGLU FFN per expert and the combine back to the tokens' ranks.
//
// R ranks (placed on nodes by nodeOf), E experts on every rank (G = R x E global experts, expert j on rank j / E,
// its local index j % E), T tokens of H features on every rank, each routed to topk experts. Every (source rank,
// expert) block holds at most `capacity` tokens. Buffers of the schedule (per rank):
//   "ids"    Input int32, T x topk: the global expert ids of each token (the router's top-k)
//   "x"      Input bf16, T x H: the tokens
//   "w"      Input bf16, E x H x Nout: the rank's experts' weights, expert e at e x H x Nout (row-major H x Nout)
//   "layout" Scratch int32, G x (1 + capacity): the route's counts per global expert, then each expert's list
//   "send"   Scratch bf16, G x capacity x H: per global expert j the executing rank's tokens for j, packed
//   "counts" Scratch int32, G: on rank d, counts[s x E + e] = tokens rank s routes to d's expert e (the notify)
//   "recv"   Scratch bf16, G x capacity x H: on rank d, a capacity-row block per (source s, expert e)
//   "out"    Output f32, G x capacity x Nout: on rank d, block (s, e) row i = token t_i of rank s times w_e, t_0 <
//            t_1 < ... the tokens of rank s that name expert d x E + e; rows past that count are not written.
// Across nodes (per-node deduplication; only when the ranks span more than one node; node ids must be below G):
//   "nodeLayout"  Scratch int32, G x (1 + T): the route's node lists (list n: the tokens naming an expert on n)
//   "nodeSend"    Scratch bf16, nodes x T x H and "nodeIds" int32, nodes x T x topk: per other node its tokens and
//                 their ids, packed in token order
//   "relayCounts" Scratch int32, R: on a relay, element s = the tokens source s sent it
//   "relayRecv"   Scratch bf16, R x T x H and "relayIds" int32, R x T x topk: on a relay, what source s sent
//   "relayLayout" Scratch int32, R x G x (1 + capacity): on a relay, per source its route over the node's experts
//   "relaySend"   Scratch bf16, R x (most ranks of a node) x E x capacity x H: per (source, rank, expert) a block
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

/// What moe-dispatch-gemm computes (ranks and nodes come from the placement).
struct MoeDispatchGemmSpec {
  uint32_t experts = 0;  ///< E: experts on every rank
  uint32_t topk = 0;     ///< experts per token, at most R x E
  uint32_t tokens = 0;   ///< T: tokens on every rank
  uint32_t hidden = 0;   ///< H: features of a token (the GEMM's k), a multiple of 8
  uint32_t outCols = 0;  ///< Nout: columns of an expert's output (the GEMM's n), a multiple of 8
  /// Most tokens one source rank may send one expert (the GEMM's m at its bound); unset: T (never drops: a token
  /// names an expert at most once in a well-formed routing). A routing over it is refused when the route runs.
  std::optional<uint32_t> capacity;
  /// The cost model's expected tokens per (source, expert) block are the uniform T x topk / (R x E) times this
  /// factor (>= 1; capped at the capacity): how much the hottest experts exceed the mean.
  double imbalance = 1.0;
  /// Lane::ctas of the compute lane, a weight against every other lane's 1: the cost model splits a rank's SMs among
  /// its lanes by these weights (timeline rule 2b), so a caller that knows the GPU chooses the split (1: an equal
  /// share; RingAttentionSpec::computeCtas is the same knob).
  uint32_t computeCtas = 1;

  /// The capacity in effect: capacity, or T when unset.
  uint32_t capacityOr() const noexcept { return capacity ? *capacity : tokens; }
};

/// Check `spec` on `nRanks` ranks: experts, topk, tokens, hidden, outCols and computeCtas >= 1; topk <= nRanks x
/// experts; capacity >= 1 when set; hidden and outCols multiples of 8 (the grouped GEMM's A and C rows are whole
/// 16-byte units for the GPU engine's TMA); imbalance finite and >= 1; every buffer within kMaxElements. Throws
/// Error(InvalidArgument) naming the field, what it must be and what it is.
void validateMoeDispatchGemmSpec(const MoeDispatchGemmSpec& spec, uint32_t nRanks);

/// Generate moe-dispatch-gemm on ranks placed as `nodeOf` says. Lanes of rank r:
///  * comm (intra): route; notify (its counts for each rank d of its node into d's "counts": a copy to itself,
///    puts inside the node); across nodes a node route and, per other node, a gather of the tokens naming one of its
///    experts and one of their ids, signalling r's own flag so the network lane may send them; per expert inside the
///    node a gather and a put (a copy to itself) of its block at the runtime extent;
///  * net (inter-send, only with other nodes): per other node n, to its relay, three ProxyPuts: the count of r's
///    distinct tokens for n, their rows and their ids, both sized by that count (a runtime extent);
///  * forward (inter-recv, on relays only): per source s it relays for, once the three arrived, a route of the ids
///    over the node's experts (sized by the count), then puts of the counts into every rank of the node and per
///    expert a gather and a put of its rows into the receiver's block (s, e), as s would have sent them;
///  * compute: wait for every rank's counts, then per source wait for its E blocks and run a grouped GEMM over them.
/// The relay of source s on node n is DeepEP's: the rank of n with s's index among its node's ranks, modulo n's size
/// (uneven nodes wrap). So a token crosses the network once per destination node, with its topk ids, plus one count
/// per (source, other node); inside a node nothing changes. The result passes validate() and has cost attributes
/// filled; the per-expert extents' expected value is the spec's (see imbalance), a node's is T x the chance a
/// token names one of its experts (uniform: 1 - C(G - g, topk) / C(G, topk) for the node's g experts) x imbalance,
/// capped at T. Throws what validateMoeDispatchGemmSpec throws, and Error(InvalidArgument) for a node id >= G.
Schedule generateMoeDispatchGemm(const MoeDispatchGemmSpec& spec, const std::vector<uint32_t>& nodeOf);

/// How moe-ffn returns the rows the experts of another node made for a rank's tokens (on one node there is one return:
/// every block straight to its source, whichever is asked):
///  * PerBlock: every (source, expert) block straight to the source, one float32 row per (token, k) naming an expert
///    of the other node (`info.algo` "node-dedup": the dispatch deduplicated per node, the return per block);
///  * NodeSum: summed per (token, node) on the dispatch's relays first, one float32 row per (token, other node) plus
///    the token's topk weights on the way out (`info.algo` "node-dedup-combine");
///  * Auto: the one whose schedule the SimGrid replay prices lower (mk::sim::planMoeFfn, mk/sim/moe.hpp: what mk-sim
///    and mk-plan run), for callers that know the cluster.
enum class MoeCombineReturn : uint8_t { Auto, PerBlock, NodeSum };
const char* toString(MoeCombineReturn r) noexcept;  ///< "auto", "per-block", "node-sum"
/// The return named `s` (toString's names), or nullopt.
std::optional<MoeCombineReturn> parseMoeCombineReturn(std::string_view s) noexcept;

/// What moe-ffn computes: moe-dispatch-gemm's routing (outCols is 2 x ffn) and the expert FFN's sizes. Per rank its
/// schedule has moe-dispatch-gemm's buffers, except that "w" is "w1" and "out" is "h", plus:
///   "w1"      Input bf16, E x H x 2F: expert e's first weights at e x H x 2F, row-major H x 2F, columns interleaved
///             (gate f, up f) at (2f, 2f + 1) (kStepSwiGLU)
///   "h"       Scratch bf16, G x capacity x F: block (s, e) row i = silu(gate) x up of the token in "recv"'s row
///   "weights" Input f32, T x topk: the router's weight of each (token, k)
///   "w2"      Input bf16, E x F x H: expert e's second weights at e x F x H, row-major F x H
///   "o"       Scratch f32, G x capacity x H: block (s, e) row i = that row of "h" times w2_e
///   "back"    Scratch f32, T x topk + G x T x H: the weights, then per global expert j a block of T rows: what j's
///             rank returned for the executing rank's tokens, in j's list order (CombineShape)
///   "y"       Output f32, T x H: row t = sum over k of weights[t][k] x expert ids[t][k]'s output for token t
/// Across nodes with the NodeSum return (the combine summed per node on the dispatch's relays) also, with S the most
/// sources a relay serves:
///   "nodeWeights" Scratch f32, nodes x T x topk: per other node the weights of the tokens sent there, packed
///   "relayBack"   Scratch f32, S x (T x topk + G x T x H): on a relay, per source it serves (in rank order) that
///                 source's weights, then per global expert j of the relay's node a block: j's rows for its tokens
///   "relayOut"    Scratch f32, S x T x H: on a relay, per source it serves a row per token: its node's weighted sum
/// and "back" holds, in the block of each other node's lowest expert, that node's summed rows in its list order.
struct MoeFfnSpec {
  uint32_t experts = 0;  ///< E: experts on every rank
  uint32_t topk = 0;     ///< experts per token, at most R x E
  uint32_t tokens = 0;   ///< T: tokens on every rank
  uint32_t hidden = 0;   ///< H: features of a token (GEMM 1's k, GEMM 2's n), a multiple of 8
  uint32_t ffn = 0;      ///< F: the expert's intermediate size (GEMM 1's n is 2F, GEMM 2's k), a multiple of 8
  std::optional<uint32_t> capacity;  ///< as MoeDispatchGemmSpec's; at most tokens (a returned block holds T rows)
  double imbalance = 1.0;            ///< as MoeDispatchGemmSpec's
  uint32_t computeCtas = 1;          ///< as MoeDispatchGemmSpec's
  /// The return across nodes; generateMoeFfn needs it concrete there (mk::sim::planMoeFfn resolves Auto).
  MoeCombineReturn combineReturn = MoeCombineReturn::Auto;

  uint32_t capacityOr() const noexcept { return capacity ? *capacity : tokens; }
  /// The dispatch it starts with: outCols = 2 x ffn.
  MoeDispatchGemmSpec dispatch() const;
};

/// Check `spec` on `nRanks` ranks: ffn >= 1 and a multiple of 8 (GEMM 2's A rows and GEMM 1's C rows are whole
/// 16-byte units for the GPU engine's TMA), capacity at most tokens, combineReturn one of the enum's values, then
/// validateMoeDispatchGemmSpec's rules with the dispatch's; the combine's buffers within kMaxElements. Throws
/// Error(InvalidArgument) "moe-ffn: ..." naming the field.
void validateMoeFfnSpec(const MoeFfnSpec& spec, uint32_t nRanks);

/// Generate moe-ffn on ranks placed as `nodeOf` says: moe-dispatch-gemm's lanes (generateMoeDispatchGemm) with its
/// grouped GEMM run with the SwiGLU epilogue into "h", then
///  * compute: after each source's first grouped GEMM, the second (h x w2 into "o", the same runtime extents) and a
///    signal of its own "ffn done" flag;
///  * combine (a new intra lane): copy the weights into "back", then per source s once its FFN is done, per expert e
///    the block (s, e) of "o" at its runtime extent to s's "back" block j = r x E + e: a copy for itself, a put
///    inside the node, each signalling s; last, once all are back, the combine step into "y".
/// Across nodes with the PerBlock return (`info.algo` "node-dedup") the blocks of a source on another node go to it
/// the same way, as proxyputs: a row per (token, k). With the NodeSum return (`info.algo` "node-dedup-combine";
/// DeepEP's internode combine) the combine is summed per node on the dispatch's relays, so a token's rows cross the
/// network once per node, not once per expert:
///  * combine lane of s: first, per other node n, a gather of the weights of the tokens in its node list n and a
///    proxyput of them (the "node<n>" extent) to the relay's "relayBack"; the blocks (s', e) of a source s' of another
///    node go to the slot of s' in its relay's "relayBack" instead (a put, a copy on the relay), signalling its
///    "summed" flag of s'; the final combine has buckets `nodes` (route.hpp, CombineShape): s's own node's rows
///    weighted, each other node's summed row once per token;
///  * inter-recv lane of a relay, after its forwarding: per source it serves, once the weights and every block of
///    its node arrived, a combine with buckets `own-node` over the ids the source sent it (the "relay<s>.<n>" extent)
///    into "relayOut", and one proxyput of those rows (the same extent) into the source's "back".
/// On one node every return gives the same schedule (no buffer, flag or step more; `info.algo` the dispatch's
/// "direct"). Throws what validateMoeFfnSpec and generateMoeDispatchGemm throw (with "moe-ffn: " in front), and
/// Error(InvalidArgument) for combineReturn Auto across nodes (the generator has no cost model: mk::sim::planMoeFfn)
/// and for a relay buffer over kMaxElements.
Schedule generateMoeFfn(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf);

/// moe-ffn as a framework runs it without fusion (mk-bench moe-ffn's layered baseline): the fused schedule's own
/// communication in two ops around the expert GEMMs, which the caller runs as standalone kernels between them, so the
/// baseline moves the same bytes with the same steps and only the overlap is gone.
struct MoeFfnLayered {
  /// The dispatch: the route, notify, gathers and puts of generateMoeFfn's schedule, and waits until every count and
  /// block arrived. Inputs "ids", "x"; outputs "counts" (int32, G: counts[s x E + e] = the rows source s sent local
  /// expert e) and "recv" (bf16, G x capacity x H: block (s, e) holds those rows, the rest untouched), in that order.
  Schedule dispatch;
  /// The return and combine: per source, the blocks of "o" sized by "counts" back to it, then its combine into "y".
  /// Inputs "ids", "counts" (the dispatch's), "weights", "o" (float32, G x capacity x H: block (s, e) row i = expert
  /// e's FFN of recv's row, rounded as the fused op's GEMMs: h = SwiGLU(recv x w1_e) in bf16, o = h x w2_e), in that
  /// order; output "y".
  Schedule combine;
};

/// The two ops of moe-ffn's layered baseline on ranks of one node (moe-ffn's buffer layouts above; `info.algo`
/// "layered-dispatch" / "layered-combine"). Between them the caller computes, per rank and group g = s x E + e with
/// counts[g] rows: h_g = SwiGLU(recv_g x w1_e), o_g = h_g x w2_e (the fused op's grouped GEMMs, as standalone
/// kernels). Throws what generateMoeFfn throws, and Error(Unsupported) for ranks on more than one node.
MoeFfnLayered generateMoeFfnLayered(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf);

}  // namespace mk
