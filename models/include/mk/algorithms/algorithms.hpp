// mkernel — schedule generators: the only place that knows algorithms.
//
// Count conventions (element counts, as NCCL's API):
//   allreduce      input count, output count
//   allgather      input count (per rank), output count * nRanks
//   reducescatter  input count * nRanks, output count (per rank)
//   broadcast      input count (read on root only), output count
//   alltoall       input count * nRanks (block j goes to rank j), output count * nRanks (block j came from rank j)
// Buffer names: "input", "output" and, where an algorithm needs one, "scratch".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

enum class CollOp : uint8_t { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll };

const char* toString(CollOp op) noexcept;  ///< "allreduce", ...
std::optional<CollOp> parseCollOp(std::string_view s) noexcept;
/// parseCollOp, or Error(InvalidArgument) "unknown <what> '<s>' (expected allreduce, allgather, ...)": the one
/// spelling of a bad collective name, for tools (what = "--op") and readers (what = "op").
CollOp requireCollOp(std::string_view s, std::string_view what = "op");

/// The schedule generators by name. A generator exists for some (op, algorithm) pairs only (algorithmsFor()).
/// NcclRing, NcclTree and NcclP2p are the layered baseline (what NCCL does; mk/algorithms/nccl.hpp): they model
/// another library, so algorithmsFor() (the candidates of `auto`) never lists them.
enum class Algorithm : uint8_t { OneShot, TwoShot, Ring, Hierarchical, Direct, NcclRing, NcclTree, NcclP2p };

/// "one-shot", "two-shot", "ring", "hierarchical", "direct", "nccl-ring", "nccl-tree", "nccl-p2p"
const char* toString(Algorithm a) noexcept;
std::optional<Algorithm> parseAlgorithm(std::string_view s) noexcept;
/// The generator `s` names for `op`, or Error(NotFound) "unknown algorithm '<s>' for <op> (expected <the
/// algorithmsFor(op) list>)": the one spelling for a name that is not an algorithm and for an algorithm that
/// has no generator for `op`.
Algorithm requireAlgorithm(CollOp op, std::string_view s);

/// Inter-node phase of the hierarchical all-reduce (every other generator ignores it): a ring over the M
/// nodes of each rail (2(M-1) steps per chunk), recursive halving + doubling (2 log2(M) steps per chunk; a
/// non-power-of-two M folds its extra nodes into partners first), Bruck's dissemination reduce-scatter and
/// all-gather (2 ceil(log2 M) rounds per chunk on any M, every node busy, bandwidth-optimal, every node sending
/// the same messages so that the nodes stay in step), the same with rounds that each move half of the blocks still
/// live (BruckHalf: the first round floor(M/2) blocks, as recursive halving on a power of two), or Auto: the
/// variant with the lowest closed form (resolveInter()).
enum class InterPhase : uint8_t { Auto, Ring, Rhd, Bruck, BruckHalf };

const char* toString(InterPhase p) noexcept;  ///< "auto", "ring", "rhd", "bruck", "bruck-half"
std::optional<InterPhase> parseInterPhase(std::string_view s) noexcept;

/// Protocol of the puts of the layered (nccl-*) algorithms, NCCL's three: Simple (a plain Put, then its flag),
/// LL and LL128 (data and flag in the same stores: kStepLL, kStepLL128). Auto: the cheapest under the profile
/// (resolveProtocol). One-shot and two-shot all-reduce and direct all-gather send their puts as LL packets when
/// asked (Protocol::LL, one node; the GPU engine runs them as data+flag stores); the other generators ignore it.
enum class Protocol : uint8_t { Auto, Simple, LL, LL128 };

const char* toString(Protocol p) noexcept;  ///< "auto", "simple", "ll", "ll128"
std::optional<Protocol> parseProtocol(std::string_view s) noexcept;

/// What to compute.
struct CollectiveSpec {
  CollOp op = CollOp::AllReduce;
  Algorithm algo = Algorithm::Ring;  ///< see algorithmsFor()
  DType dtype = DType::Float32;
  RedOp redop = RedOp::Sum;
  uint64_t count = 0;  ///< see the count conventions above; > 0
  uint32_t root = 0;   ///< broadcast only
};

/// Deepest pipeline a generator accepts: NCCL pipelines a transfer in 8 steps; 4096 chunks of even a 64 GiB
/// message are 16 MiB each, so more only multiplies steps (and memory) without modelling anything new.
inline constexpr uint32_t kMaxChunks = 4096;
/// Most channels a generator accepts: NCCL uses at most 32 (64 on newest builds); lanes grow quadratically
/// with channels in some generators.
inline constexpr uint32_t kMaxChannels = 256;

/// How to shape the schedule.
struct GenOptions {
  uint32_t chunks = 1;    ///< pipeline depth: each transfer split into this many chunks (1..kMaxChunks)
  uint32_t channels = 1;  ///< independent parallel lanes, each on a slice of the data (1..kMaxChannels)
  /// Inter-node phase of the hierarchical all-reduce. Auto is decided under the datasheet DGX-H100 profile in
  /// generate(); tools that price with another profile resolve it themselves with resolveInter().
  InterPhase inter = InterPhase::Auto;
  /// Protocol of the nccl-* algorithms (ignored by the others). Auto is decided in generate() under the datasheet
  /// DGX-H100 profile; tools that price with another profile resolve it with resolveProtocol() (nccl.hpp).
  Protocol protocol = Protocol::Auto;
};

/// Every field equal: two specs (options) that generate the same schedule. With the ordering below, the pair
/// (CollectiveSpec, GenOptions) can key a schedule cache.
bool operator==(const CollectiveSpec& a, const CollectiveSpec& b) noexcept;
bool operator!=(const CollectiveSpec& a, const CollectiveSpec& b) noexcept;
/// A strict weak ordering over every field (for std::map keys).
bool operator<(const CollectiveSpec& a, const CollectiveSpec& b) noexcept;
bool operator==(const GenOptions& a, const GenOptions& b) noexcept;
bool operator!=(const GenOptions& a, const GenOptions& b) noexcept;
bool operator<(const GenOptions& a, const GenOptions& b) noexcept;

/// Algorithms a generator exists for, in the order `auto` considers them (the first wins a tie).
std::vector<Algorithm> algorithmsFor(CollOp op);

/// Generate the schedule of `spec` on ranks placed on nodes as `nodeOf` says (size = nRanks, 1..1024+;
/// any layout, nodes may hold different numbers of ranks). Throws Error(InvalidArgument / NotFound)
/// for bad input (NotFound: no generator of spec.algo for spec.op). The result passes validate() and has cost
/// attributes filled.
Schedule generate(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt = {});

struct Profile;       // mk/cost/cost.hpp
struct CostEstimate;  // mk/cost/cost.hpp
struct Topology;      // mk/topology/topology.hpp

/// Closed-form cost of generate(spec, topo.layout(nRanks), opt) under `profile`, from the generator's own
/// formula (docs/cost-model.md), without building the schedule. "auto" for the inter-node phase is priced as
/// the variant resolveInter() picks under `profile`. Throws Error(NotFound) for an unknown algorithm,
/// Error(Unsupported) for a generator without a closed form, Error(InvalidArgument) for bad input.
CostEstimate closedForm(const CollectiveSpec& spec, const GenOptions& opt, const Topology& topo, uint32_t nRanks,
                        const Profile& profile);

/// The concrete inter-node variant (Ring, Rhd, Bruck or BruckHalf) that `opt.inter` stands for when `spec` is
/// generated on `nodeOf`: itself when concrete, else the one whose closed form is lowest under `profile` (the
/// earlier of Ring, Rhd, Bruck, BruckHalf on ties; Ring for every case without a network phase or another generator).
/// Rhd is a candidate only on a power-of-two node count: its fold contends for the NICs, which no closed form sees.
InterPhase resolveInter(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                        const Profile& profile);

/// Element counts of the "input" and "output" buffers per rank for `spec` on nRanks ranks.
uint64_t inputCount(const CollectiveSpec& spec, uint32_t nRanks) noexcept;
uint64_t outputCount(const CollectiveSpec& spec, uint32_t nRanks) noexcept;

}  // namespace mk
