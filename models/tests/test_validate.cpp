// Tests of the schedule validator: one test per rule, deadlocks, races and scale.
#include <doctest/doctest.h>

#include <ctime>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/schedule/validate.hpp"

namespace {

using namespace mk;

BufRef at(uint32_t rank, uint16_t buffer, uint64_t offset) {
  BufRef r;
  r.rank = rank;
  r.buffer = buffer;
  r.offset = offset;
  return r;
}

/// A tiny hand builder (the real generators are tested elsewhere and are not used here on purpose).
struct Hand {
  Schedule s;

  explicit Hand(std::vector<uint32_t> nodeOf, uint32_t nFlags = 0, uint32_t nBarriers = 0) {
    s.nRanks = static_cast<uint32_t>(nodeOf.size());
    s.nodeOf = std::move(nodeOf);
    s.nFlags = nFlags;
    s.nBarriers = nBarriers;
    s.lanes.resize(s.nRanks);
  }
  uint16_t buffer(const std::string& name, uint64_t count, DType dtype = DType::Float32,
                  BufferKind kind = BufferKind::Scratch) {
    BufferDecl d;
    d.name = name;
    d.dtype = dtype;
    d.kind = kind;
    d.count.assign(s.nRanks, count);
    s.buffers.push_back(d);
    return static_cast<uint16_t>(s.buffers.size() - 1);
  }
  uint32_t lane(uint32_t rank, LaneRole role = LaneRole::Intra) {
    Lane l;
    l.role = role;
    s.lanes[rank].push_back(l);
    return static_cast<uint32_t>(s.lanes[rank].size() - 1);
  }
  Step& step(uint32_t rank, uint32_t lane, StepKind kind) {
    auto& steps = s.lanes.at(rank).at(lane).steps;
    steps.emplace_back();
    steps.back().kind = kind;
    return steps.back();
  }
  Step& copy(uint32_t r, uint32_t l, BufRef dst, BufRef a, uint64_t count) {
    Step& st = step(r, l, StepKind::Copy);
    st.dst = dst;
    st.a = a;
    st.count = count;
    return st;
  }
  Step& reduce(uint32_t r, uint32_t l, BufRef dst, BufRef a, BufRef b, uint64_t count) {
    Step& st = copy(r, l, dst, a, count);
    st.kind = StepKind::Reduce;
    st.b = b;
    return st;
  }
  /// A Put (or ProxyPut with `proxy`), signalling flag (flagRank, flagId) when flagRank >= 0.
  Step& put(uint32_t r, uint32_t l, BufRef dst, BufRef a, uint64_t count, int64_t flagRank = -1, uint32_t flagId = 0,
            bool proxy = false) {
    Step& st = copy(r, l, dst, a, count);
    st.kind = proxy ? StepKind::ProxyPut : StepKind::Put;
    if (flagRank >= 0) {
      st.flags = kStepSignal;
      st.flag = FlagRef{static_cast<uint32_t>(flagRank), flagId};
      st.value = 1;
    }
    return st;
  }
  Step& signal(uint32_t r, uint32_t l, uint32_t target, uint32_t id, uint64_t value = 1) {
    Step& st = step(r, l, StepKind::Signal);
    st.flag = FlagRef{target, id};
    st.value = value;
    return st;
  }
  Step& wait(uint32_t r, uint32_t l, uint32_t id, uint64_t value) {
    Step& st = step(r, l, StepKind::Wait);
    st.flag = FlagRef{r, id};
    st.value = value;
    return st;
  }
  Step& gemm(uint32_t r, uint32_t l, uint32_t shape, BufRef c, BufRef a, BufRef b, uint8_t flags = 0) {
    Step& st = step(r, l, StepKind::Gemm);
    st.aux = shape;
    st.dst = c;
    st.a = a;
    st.b = b;
    st.flags = flags;
    return st;
  }
  Step& barrier(uint32_t r, uint32_t l, uint32_t id) {
    Step& st = step(r, l, StepKind::Barrier);
    st.aux = id;
    return st;
  }
  Schedule done() {
    fillCostAttributes(s);
    return s;
  }
};

std::string listIssues(const std::vector<ValidationIssue>& issues) {
  std::ostringstream os;
  for (const auto& is : issues)
    os << "  [" << is.rank << "," << is.lane << "," << is.step << "] " << is.message << "\n";
  return os.str();
}

void expectValid(const Schedule& s, const ValidateOptions& opt = {}) {
  const auto issues = validateAll(s, opt);
  INFO("issues:\n" << listIssues(issues));
  CHECK(issues.empty());
  CHECK_NOTHROW(validate(s, opt));
}

/// Some issue contains every fragment; returns it (for checking rank/lane/step).
ValidationIssue expectIssue(const Schedule& s, std::initializer_list<std::string> fragments,
                            const ValidateOptions& opt = {}) {
  const auto issues = validateAll(s, opt);
  for (const auto& is : issues) {
    bool all = true;
    for (const auto& f : fragments) all = all && is.message.find(f) != std::string::npos;
    if (all) return is;
  }
  std::string want;
  for (const auto& f : fragments) want += "'" + f + "' ";
  INFO("wanted an issue with " << want << "\nissues:\n" << listIssues(issues));
  CHECK(false);
  return {};
}

/// The 2-rank one-shot allreduce of docs/schedule-format.md: each rank puts its input into the peer's
/// scratch, signals, waits for the peer's data and reduces. `n` elements.
Hand oneShot(uint64_t n = 5) {
  Hand h({0, 0}, 1);
  const uint16_t in = h.buffer("in", n, DType::Float32, BufferKind::Input);
  const uint16_t out = h.buffer("out", n, DType::Float32, BufferKind::Output);
  const uint16_t recv = h.buffer("recv", n);
  for (uint32_t r = 0; r < 2; ++r) {
    const uint32_t peer = 1 - r;
    const uint32_t l = h.lane(r);
    h.put(r, l, at(peer, recv, 0), at(r, in, 0), n, peer, 0);
    h.wait(r, l, 0, 1);
    h.reduce(r, l, at(r, out, 0), at(r, in, 0), at(r, recv, 0), n);
  }
  return h;
}

// Time limits hold for optimised builds; unoptimised and sanitizer builds (which may define NDEBUG) get ten times as
// long.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr double kTimeSlack = 10.0;
#else
constexpr double kTimeSlack = 1.0;
#endif

double cpuSeconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

}  // namespace

// ---- valid schedules ----------------------------------------------------------------------------------

TEST_CASE("validate: the hand-built two-rank one-shot allreduce is valid") {
  expectValid(oneShot().done());
  expectValid(oneShot(1).done());
}

TEST_CASE("validate: a valid schedule also passes after a pack and unpack round trip") {
  const Schedule s = oneShot(7).done();
  expectValid(unpack(pack(s)));
}

TEST_CASE("validate: the annotated example of docs/schedule-format.md parses and is valid") {
  // Keep in sync with the example in docs/schedule-format.md.
  const Schedule doc = scheduleFromJson(R"JSON({
  "schema": "mkernel.schedule.v1",
  "info": {"op": "allreduce", "algo": "one-shot", "dtype": "float32", "redop": "sum",
           "count": 4, "root": 0, "chunks": 1, "channels": 1},
  "nRanks": 2,
  "nodeOf": [0, 0],
  "nFlags": 1,
  "nBarriers": 0,
  "buffers": [
    {"name": "in",   "dtype": "float32", "kind": "input",   "count": 4},
    {"name": "out",  "dtype": "float32", "kind": "output",  "count": 4},
    {"name": "recv", "dtype": "float32", "kind": "scratch", "count": 4}
  ],
  "gemms": [],
  "ranks": [
    {"lanes": [
      {"role": "intra", "ctas": 1, "steps": [
        {"kind": "put", "count": 4, "dst": [1, "recv", 0], "a": [0, "in", 0],
         "signal": true, "flag": [1, 0], "value": 1},
        {"kind": "wait", "flag": [0, 0], "value": 1},
        {"kind": "reduce", "count": 4, "op": "sum",
         "dst": [0, "out", 0], "a": [0, "in", 0], "b": [0, "recv", 0]}
      ]}
    ]},
    {"lanes": [
      {"role": "intra", "ctas": 1, "steps": [
        {"kind": "put", "count": 4, "dst": [0, "recv", 0], "a": [1, "in", 0],
         "signal": true, "flag": [0, 0], "value": 1},
        {"kind": "wait", "flag": [1, 0], "value": 1},
        {"kind": "reduce", "count": 4, "op": "sum",
         "dst": [1, "out", 0], "a": [1, "in", 0], "b": [1, "recv", 0]}
      ]}
    ]}
  ]
})JSON");
  expectValid(doc);
  const Schedule hand = oneShot(4).done();
  REQUIRE(doc.lanes.size() == hand.lanes.size());
  for (uint32_t r = 0; r < 2; ++r) {
    REQUIRE(doc.lanes[r][0].steps.size() == hand.lanes[r][0].steps.size());
    for (std::size_t i = 0; i < hand.lanes[r][0].steps.size(); ++i) {
      const Step& a = doc.lanes[r][0].steps[i];
      const Step& b = hand.lanes[r][0].steps[i];
      CHECK(a.kind == b.kind);
      CHECK(a.dst.rank == b.dst.rank);
      CHECK(a.dst.buffer == b.dst.buffer);
      CHECK(a.flag.rank == b.flag.rank);
      CHECK(a.bytes == b.bytes);
    }
  }
  CHECK(doc.info.algo == "one-shot");
}

// ---- structure ----------------------------------------------------------------------------------------

TEST_CASE("validate: zero ranks and mis-sized nodeOf or lanes are structural errors") {
  Schedule empty;
  expectIssue(empty, {"nRanks must be > 0"});
  Schedule s = oneShot().done();
  s.nodeOf.push_back(0);
  expectIssue(s, {"nodeOf has 3 entries, expected nRanks = 2"});
  s = oneShot().done();
  s.lanes.pop_back();
  expectIssue(s, {"lanes has 1 ranks, expected nRanks = 2"});
}

TEST_CASE("validate: buffer count arrays need one entry per rank") {
  Schedule s = oneShot().done();
  s.buffers[2].count.push_back(5);
  const auto is = expectIssue(s, {"buffers[2] 'recv'", "3 per-rank counts, expected nRanks = 2"});
  CHECK(is.rank == -1);
}

TEST_CASE("validate: a zero-cta lane and a duplicate buffer name are reported") {
  Schedule s = oneShot().done();
  s.lanes[1][0].ctas = 0;
  s.buffers[1].name = "in";
  expectIssue(s, {"rank 1 lane 0: ctas must be >= 1"});
  expectIssue(s, {"buffers[1] 'in'", "duplicate buffer name"});
}

// ---- operands -----------------------------------------------------------------------------------------

TEST_CASE("validate: an operand naming a missing buffer or rank is reported with rank lane and step") {
  Schedule s = oneShot().done();
  s.lanes[1][0].steps[2].b.buffer = 7;
  const auto is = expectIssue(s, {"rank 1 lane 0 (intra) step 2 (reduce): b buffer id 7 out of range (3 buffers)"});
  CHECK(is.rank == 1);
  CHECK(is.lane == 0);
  CHECK(is.step == 2);
  s = oneShot().done();
  s.lanes[0][0].steps[0].dst.rank = 9;
  expectIssue(s, {"rank 0 lane 0 (intra) step 0 (put): dst rank 9 out of range (nRanks 2)"});
}

TEST_CASE("validate: offset plus count beyond the buffer is reported even when the sum overflows") {
  Schedule s = oneShot(6).done();
  s.lanes[0][0].steps[2].count = 7;
  expectIssue(
      s, {"rank 0 lane 0 (intra) step 2 (reduce): dst elements [0, 7) exceed buffer 'out' on rank 0 (6 elements)"});
  s = oneShot(6).done();
  s.lanes[1][0].steps[0].a.offset = ~uint64_t{0} - 1;
  expectIssue(s, {"rank 1 lane 0 (intra) step 0 (put): a elements [", "overflow) exceed buffer 'in'"});
}

TEST_CASE("validate: per-rank buffer sizes are checked against the operand's own rank") {
  Hand h = oneShot(8);
  h.s.buffers[2].count = {8, 4};  // rank 1's scratch is smaller
  expectIssue(h.done(),
              {"rank 0 lane 0 (intra) step 0 (put): dst elements [0, 8) exceed buffer 'recv' on rank 1 (4 elements)"});
}

TEST_CASE("validate: a put to another node or to its own rank is rejected") {
  Hand h({0, 1}, 1);
  const uint16_t b = h.buffer("b", 4);
  const uint32_t l0 = h.lane(0);
  const uint32_t l1 = h.lane(1);
  h.put(0, l0, at(1, b, 0), at(0, b, 0), 4);
  h.put(1, l1, at(1, b, 0), at(1, b, 0), 4);
  const Schedule s = h.done();
  expectIssue(s, {"rank 0 lane 0 (intra) step 0 (put): dst rank 1 is on node 1, not this rank's node 0: use proxyput"});
  expectIssue(s, {"rank 1 lane 0 (intra) step 0 (put): dst is on the executing rank 1"});
}

TEST_CASE("validate: a put must read from the executing rank") {
  Hand h({0, 0, 0});
  const uint16_t b = h.buffer("b", 4);
  const uint32_t l = h.lane(0);
  h.put(0, l, at(1, b, 0), at(2, b, 0), 4);
  expectIssue(h.done(), {"rank 0 lane 0 (intra) step 0 (put): source a is on rank 2, expected the executing rank 0"});
}

TEST_CASE("validate: a proxyput inside one node is rejected and across nodes accepted") {
  Hand h({0, 0, 1}, 1);
  const uint16_t b = h.buffer("b", 4);
  const uint32_t l = h.lane(0, LaneRole::InterSend);
  h.put(0, l, at(1, b, 0), at(0, b, 0), 4, -1, 0, true);
  expectIssue(h.done(), {"rank 0 lane 0 (inter-send) step 0 (proxyput): dst rank 1 is on this rank's node 0"});

  Hand ok({0, 0, 1}, 1);
  const uint16_t d = ok.buffer("d", 4);
  ok.put(0, ok.lane(0, LaneRole::InterSend), at(2, d, 0), at(0, d, 0), 4, 2, 0, true);
  ok.wait(2, ok.lane(2, LaneRole::InterRecv), 0, 1);
  expectValid(ok.done());
}

TEST_CASE("validate: a zero-count proxyput must signal") {
  Hand h({0, 1}, 1);
  const uint16_t b = h.buffer("b", 4);
  h.put(0, h.lane(0), at(1, b, 0), at(0, b, 0), 0, -1, 0, true);
  expectIssue(h.done(), {"rank 0 lane 0 (intra) step 0 (proxyput): count 0 without kStepSignal does nothing"});
}

TEST_CASE("validate: signal flags of puts must be reachable by the transfer") {
  Hand h({0, 0, 1}, 1);
  const uint16_t b = h.buffer("b", 4);
  const uint32_t l0 = h.lane(0);
  h.put(0, l0, at(1, b, 0), at(0, b, 0), 4, 2, 0);        // NVLink put signalling a rank on another node
  h.put(0, l0, at(2, b, 0), at(0, b, 0), 4, 1, 0, true);  // proxyput signalling a rank other than dst
  const Schedule s = h.done();
  expectIssue(s, {"rank 0 lane 0 (intra) step 0 (put): signals flag 0 of rank 2 on another node"});
  expectIssue(s, {"rank 0 lane 0 (intra) step 1 (proxyput): signals flag 0 of rank 1", "to dst rank 2"});
}

TEST_CASE("validate: a signal reaches NVLink peers only, across nodes a zero-count proxyput carries it") {
  Hand h({0, 0, 1}, 1);
  h.buffer("b", 4);
  const uint32_t l0 = h.lane(0);
  h.signal(0, l0, 1, 0);  // a same-node peer: fine
  h.signal(0, l0, 2, 0);  // another node: refused
  h.wait(1, h.lane(1), 0, 1);
  h.wait(2, h.lane(2), 0, 1);
  expectIssue(h.done(), {"rank 0 lane 0 (intra) step 1 (signal): signals flag 0 of rank 2 on node 1, not this rank's "
                         "node 0: a signal reaches NVLink peers only"});

  Hand ok({0, 0, 1}, 1);
  const uint16_t d = ok.buffer("d", 4);
  ok.put(0, ok.lane(0, LaneRole::InterSend), at(2, d, 0), at(0, d, 0), 0, 2, 0, true);
  ok.wait(2, ok.lane(2, LaneRole::InterRecv), 0, 1);
  expectValid(ok.done());
}

TEST_CASE("validate: a copy touching another node is rejected but same-node peers are allowed") {
  Hand h({0, 0, 1});
  const uint16_t b = h.buffer("b", 8);
  const uint32_t l = h.lane(0);
  h.copy(0, l, at(1, b, 0), at(0, b, 0), 4);  // write into an NVLink peer: fine
  h.copy(0, l, at(0, b, 4), at(1, b, 4), 4);  // read from an NVLink peer: fine
  expectValid(h.s);
  h.copy(0, l, at(0, b, 0), at(2, b, 0), 4);
  expectIssue(h.done(), {"rank 0 lane 0 (intra) step 2 (copy): a is on rank 2 (node 1), not on this rank's node 0"});
}

TEST_CASE("validate: a wait on another rank's flag is rejected") {
  Hand h({0, 0}, 1);
  const uint32_t l0 = h.lane(0);
  h.signal(0, l0, 1, 0);
  Step& w = h.wait(0, l0, 0, 1);
  w.flag.rank = 1;
  expectIssue(h.done(), {"rank 0 lane 0 (intra) step 1 (wait): waits on flag 0 of rank 1", "own rank's (0) flags"});
}

TEST_CASE("validate: operand dtypes of copy put and reduce must agree") {
  Hand h({0, 0});
  const uint16_t f = h.buffer("f", 4);
  const uint16_t bf = h.buffer("bf", 4, DType::BFloat16);
  const uint32_t l = h.lane(0);
  h.copy(0, l, at(0, bf, 0), at(0, f, 0), 4);
  h.put(0, l, at(1, f, 0), at(0, bf, 0), 4);
  h.reduce(0, l, at(0, f, 0), at(0, f, 0), at(0, bf, 0), 4);
  const Schedule s = h.done();
  expectIssue(s, {"step 0 (copy): operand dtypes differ: dst 'bf' is bfloat16, a 'f' is float32"});
  expectIssue(s, {"step 1 (put): operand dtypes differ"});
  expectIssue(s, {"step 2 (reduce): operand dtypes differ: dst 'f' is float32, b 'bf' is bfloat16"});
}

TEST_CASE("validate: zero counts thresholds and increments are rejected") {
  Hand h({0, 0}, 1);
  const uint16_t b = h.buffer("b", 4);
  const uint32_t l = h.lane(0);
  h.copy(0, l, at(0, b, 0), at(0, b, 0), 0);
  h.put(0, l, at(1, b, 0), at(0, b, 0), 0);
  h.signal(0, l, 0, 0, 0);
  h.wait(0, l, 0, 0);
  const Schedule s = h.done();
  expectIssue(s, {"step 0 (copy): count must be > 0"});
  expectIssue(s, {"step 1 (put): count must be > 0"});
  expectIssue(s, {"step 2 (signal): signal increment must be >= 1 (got 0)"});
  expectIssue(s, {"step 3 (wait): wait threshold must be >= 1 (got 0)"});
}

TEST_CASE("validate: flag and barrier ids out of range are rejected") {
  Hand h({0, 0}, 2, 1);
  const uint32_t l = h.lane(0);
  h.signal(0, l, 0, 2);
  h.barrier(0, l, 1);
  h.signal(0, l, 5, 0);
  const Schedule s = h.done();
  expectIssue(s, {"rank 0 lane 0 (intra) step 0 (signal): target flag id 2 out of range (nFlags 2)"});
  expectIssue(s, {"rank 0 lane 0 (intra) step 1 (barrier): barrier id 1 out of range (nBarriers 1)"});
  expectIssue(s, {"rank 0 lane 0 (intra) step 2 (signal): target flag rank 5 out of range (nRanks 2)"});
}

TEST_CASE("validate: an in-place reduce is fine but a partial overlap is rejected") {
  Hand h({0});
  const uint16_t b = h.buffer("b", 16);
  const uint32_t l = h.lane(0);
  h.reduce(0, l, at(0, b, 0), at(0, b, 0), at(0, b, 8), 8);
  expectValid(h.s);
  h.copy(0, l, at(0, b, 2), at(0, b, 0), 8);
  expectIssue(h.done(), {"step 1 (copy): dst [2, 10) partially overlaps a [0, 8) in buffer 'b'"});
}

// ---- gemm ---------------------------------------------------------------------------------------------

namespace {

/// C[m x n] f32 = A[m x k] bf16 x B[k x n] bf16, each matrix dense in its own buffer.
Hand gemmHand(DType aType = DType::BFloat16, DType bType = DType::BFloat16) {
  Hand h({0});
  h.buffer("A", 6 * 8, aType, BufferKind::Input);
  h.buffer("B", 8 * 5, bType, BufferKind::Input);
  h.buffer("C", 6 * 5, DType::Float32, BufferKind::Output);
  h.s.gemms.push_back(GemmShape{6, 5, 8, 8, 5, 5});
  h.lane(0, LaneRole::Compute);
  return h;
}

}  // namespace

TEST_CASE("validate: a dense gemm step with bf16 inputs and f32 output is valid") {
  Hand h = gemmHand();
  h.gemm(0, 0, 0, at(0, 2, 0), at(0, 0, 0), at(0, 1, 0), kStepAccumulate);
  expectValid(h.done());
}

TEST_CASE("validate: gemm A and B must share a 16-bit dtype") {
  Hand f32 = gemmHand(DType::Float32, DType::Float32);
  f32.gemm(0, 0, 0, at(0, 2, 0), at(0, 0, 0), at(0, 1, 0));
  expectIssue(f32.done(),
              {"rank 0 lane 0 (compute) step 0 (gemm): A and B must share one 16-bit dtype", "A 'A' is float32"});
  Hand mixed = gemmHand(DType::BFloat16, DType::Float16);
  mixed.gemm(0, 0, 0, at(0, 2, 0), at(0, 0, 0), at(0, 1, 0));
  expectIssue(mixed.done(), {"step 0 (gemm): A and B must share", "B 'B' is float16"});
}

TEST_CASE("validate: gemm extents beyond the buffers are rejected") {
  Hand h = gemmHand();
  h.gemm(0, 0, 0, at(0, 2, 1), at(0, 0, 0), at(0, 1, 0));
  expectIssue(h.done(), {"step 0 (gemm): C (dst) elements [1, 31) exceed buffer 'C' on rank 0 (30 elements)"});
  Hand h2 = gemmHand();
  h2.s.gemms[0].lda = 9;  // (6-1)*9 + 8 = 53 > 48
  h2.gemm(0, 0, 0, at(0, 2, 0), at(0, 0, 0), at(0, 1, 0));
  expectIssue(h2.done(), {"step 0 (gemm): A (a) elements [0, 53) exceed buffer 'A'"});
}

TEST_CASE("validate: gemm leading dimensions and index are checked for both B layouts") {
  Hand h = gemmHand();
  h.s.gemms.push_back(GemmShape{6, 5, 8, 7, 5, 4});  // lda < k and ldc < n
  h.gemm(0, 0, 1, at(0, 2, 0), at(0, 0, 0), at(0, 1, 0));
  h.gemm(0, 0, 0, at(0, 2, 0), at(0, 0, 0), at(0, 1, 0), kStepBColMajor);  // col-major B needs ldb >= k = 8
  h.gemm(0, 0, 3, at(0, 2, 0), at(0, 0, 0), at(0, 1, 0));
  const Schedule s = h.done();
  expectIssue(s, {"gemms[1]: lda 7 < k 8"});
  expectIssue(s, {"gemms[1]: ldc 4 < n 5"});
  expectIssue(s, {"step 1 (gemm): gemms[0].ldb 5 < k 8 (B is column-major)"});
  expectIssue(s, {"step 2 (gemm): gemm index 3 out of range (2 gemm shapes)"});
}

TEST_CASE("validate: gemm tiles of one C matrix in two unsynchronised lanes do not race") {
  // C is 4 x 8 (ldc 8); lane 0 writes columns 0..3, lane 1 columns 4..7: interleaved rows, disjoint elements.
  Hand h({0});
  const uint16_t a = h.buffer("A", 4 * 4, DType::BFloat16);
  const uint16_t b = h.buffer("B", 4 * 8, DType::BFloat16);
  const uint16_t c = h.buffer("C", 4 * 8);
  h.s.gemms.push_back(GemmShape{4, 4, 4, 4, 8, 8});
  h.gemm(0, h.lane(0, LaneRole::Compute), 0, at(0, c, 0), at(0, a, 0), at(0, b, 0));
  h.gemm(0, h.lane(0, LaneRole::Compute), 0, at(0, c, 4), at(0, a, 0), at(0, b, 4));
  expectValid(h.s);
  h.s.lanes[0][1].steps[0].dst.offset = 2;  // now the tiles overlap in columns 2..3
  expectIssue(h.done(), {"race on rank 0 buffer 'C' elements [2, 4)", "are not ordered by flags"});
}

// ---- flag accounting ----------------------------------------------------------------------------------

TEST_CASE("validate: a wait on a flag nobody signals is reported as dangling with rank lane and step") {
  Hand h = oneShot();
  h.s.lanes[0][0].steps[0].flags = 0;  // rank 0 no longer signals rank 1
  const auto is = expectIssue(h.done(), {"rank 1 lane 0 (intra) step 1 (wait): waits on flag 0 of rank 1",
                                         "no step ever signals it (dangling wait)"});
  CHECK(is.rank == 1);
  CHECK(is.step == 1);
}

TEST_CASE("validate: increments never awaited are reported as unmatched") {
  Hand h = oneShot();
  h.signal(0, 0, 1, 0, 2);  // two extra increments to rank 1's flag 0
  const auto is = expectIssue(
      h.done(), {"flag 0 of rank 1: unmatched: 2 increments never awaited", "3 sent", "largest wait threshold 1"});
  CHECK(is.rank == 1);
  Hand h2({0, 0}, 1);
  h2.signal(0, h2.lane(0), 1, 0);
  expectIssue(h2.done(), {"flag 0 of rank 1: unmatched: 1 increments never awaited", "no lane waits on it"});
}

TEST_CASE("validate: a threshold above the total increments can never be satisfied") {
  Hand h = oneShot();
  h.s.lanes[1][0].steps[1].value = 3;
  expectIssue(h.done(), {"rank 1 lane 0 (intra) step 1 (wait): flag 0 of rank 1 can never be satisfied: waits for >= 3 "
                         "but only 1 increments are ever sent"});
}

// ---- barriers -----------------------------------------------------------------------------------------

TEST_CASE("validate: a barrier a rank skips or executes twice is reported") {
  Hand h({0, 0, 0}, 0, 1);
  for (uint32_t r = 0; r < 3; ++r) h.lane(r);
  h.barrier(0, 0, 0);
  h.barrier(1, 0, 0);
  h.barrier(1, 0, 0);
  const Schedule s = h.done();
  expectIssue(s, {"barrier 0: ranks [2] never execute it"});
  expectIssue(s, {"rank 1 lane 0 (intra) step 1 (barrier): executes barrier 0 again",
                  "already reached it at rank 1 lane 0 (intra) step 0 (barrier)"});
}

TEST_CASE("validate: a barrier orders writes before it against reads after it") {
  Hand h({0, 0}, 0, 1);
  const uint16_t b = h.buffer("b", 4);
  const uint16_t c = h.buffer("c", 4);
  const uint32_t l0 = h.lane(0), l1 = h.lane(1);
  h.put(0, l0, at(1, b, 0), at(0, c, 0), 4);
  h.barrier(0, l0, 0);
  h.barrier(1, l1, 0);
  h.copy(1, l1, at(1, c, 0), at(1, b, 0), 4);
  expectValid(h.s);
  // Without the barrier on rank 1's side (moved after the read) the copy races with the put.
  std::swap(h.s.lanes[1][0].steps[0], h.s.lanes[1][0].steps[1]);
  expectIssue(h.done(), {"race on rank 1 buffer 'b' elements [0, 4)"});
}

// ---- symbolic execution -------------------------------------------------------------------------------

TEST_CASE("validate: a deadlock cycle across two ranks reports both blocked lanes") {
  Hand h({0, 0}, 1);
  for (uint32_t r = 0; r < 2; ++r) {
    const uint32_t l = h.lane(r);
    h.wait(r, l, 0, 1);  // each waits for the other's signal, which comes after the other's wait
    h.signal(r, l, 1 - r, 0);
  }
  const Schedule s = h.done();
  const auto a = expectIssue(s, {"rank 0 lane 0 (intra) step 0 (wait): flag 0 >= 1 never reached (final value 0)",
                                 "rank 1 lane 0 (intra) step 1 (signal)"});
  const auto b = expectIssue(s, {"rank 1 lane 0 (intra) step 0 (wait): flag 0 >= 1 never reached (final value 0)"});
  CHECK(a.rank == 0);
  CHECK(b.rank == 1);
  CHECK_THROWS_AS(validate(s), Error);
}

TEST_CASE("validate: a deadlock between two lanes of one rank is reported") {
  Hand h({0}, 2);
  const uint32_t l0 = h.lane(0, LaneRole::Compute), l1 = h.lane(0, LaneRole::Intra);
  h.wait(0, l0, 0, 2);  // needs both increments, the second of which comes after l1's wait
  h.signal(0, l0, 0, 1);
  h.signal(0, l1, 0, 0);
  h.wait(0, l1, 1, 1);
  h.signal(0, l1, 0, 0);
  expectIssue(h.done(), {"rank 0 lane 0 (compute) step 0 (wait): flag 0 >= 2 never reached (final value 1)"});
}

TEST_CASE("validate: a lane blocked at a barrier names the ranks that never arrive") {
  Hand h({0, 0}, 1, 1);
  const uint32_t l0 = h.lane(0), l1 = h.lane(1);
  h.barrier(0, l0, 0);
  h.signal(0, l0, 1, 0);
  h.wait(1, l1, 0, 1);  // waits for rank 0's signal, which comes after a barrier rank 1 has not reached
  h.barrier(1, l1, 0);
  const Schedule s = h.done();
  expectIssue(s, {"rank 0 lane 0 (intra) step 0 (barrier): waits at barrier 0: ranks [1] never arrive"});
  expectIssue(s, {"rank 1 lane 0 (intra) step 0 (wait): flag 0 >= 1 never reached"});
}

TEST_CASE("validate: increasing thresholds on one flag pass in order") {
  Hand h({0, 0}, 1);
  const uint32_t l0 = h.lane(0), l1 = h.lane(1);
  for (int i = 0; i < 5; ++i) h.signal(0, l0, 1, 0, 2);
  for (uint64_t t : {1u, 4u, 5u, 10u}) h.wait(1, l1, 0, t);
  expectValid(h.done());
}

// ---- races --------------------------------------------------------------------------------------------

namespace {

/// Ranks 0 and 1 each put 6 elements into rank 2's `dst` at offsets 0 and `secondOffset`; rank 2 waits for
/// both and reads. With `ordered`, rank 1 first waits for a signal rank 0 sends after its put.
Hand twoPuts(bool ordered, uint64_t secondOffset = 3) {
  Hand h({0, 0, 0}, 2);
  const uint16_t src = h.buffer("src", 16);
  const uint16_t dst = h.buffer("dst", 16);
  const uint32_t l0 = h.lane(0), l1 = h.lane(1), l2 = h.lane(2);
  h.put(0, l0, at(2, dst, 0), at(0, src, 0), 6, 2, 0);
  if (ordered) {
    h.signal(0, l0, 1, 1);
    h.wait(1, l1, 1, 1);
  }
  h.put(1, l1, at(2, dst, secondOffset), at(1, src, 0), 6, 2, 0);
  h.wait(2, l2, 0, 2);
  h.copy(2, l2, at(2, src, 0), at(2, dst, 0), 9);
  return h;
}

}  // namespace

TEST_CASE("validate: two unordered puts into one region are reported as a race") {
  const auto is = expectIssue(twoPuts(false).done(),
                              {"race on rank 2 buffer 'dst' elements [3, 6): ", "rank 0 lane 0 (intra) step 0 (put)",
                               "rank 1 lane 0 (intra) step 0 (put)", "are not ordered by flags"});
  CHECK(is.rank >= 0);
}

TEST_CASE("validate: flag-ordered puts into one region do not race") { expectValid(twoPuts(true).done()); }

TEST_CASE("validate: unordered puts into disjoint regions do not race") { expectValid(twoPuts(false, 6).done()); }

TEST_CASE("validate: a wait for part of the increments is not ordered after any one signaller") {
  // Rank 2 waits for >= 1 of the two increments and reads rank 0's region: rank 1's increment may be the
  // one that satisfied it, so the read is not ordered after rank 0's put (the rule must stay sound).
  Hand h({0, 0, 0}, 1);
  const uint16_t src = h.buffer("src", 8);
  const uint16_t dst = h.buffer("dst", 8);
  const uint32_t l0 = h.lane(0), l1 = h.lane(1), l2 = h.lane(2);
  h.put(0, l0, at(2, dst, 0), at(0, src, 0), 4, 2, 0);
  h.put(1, l1, at(2, dst, 4), at(1, src, 0), 4, 2, 0);
  h.wait(2, l2, 0, 1);
  h.copy(2, l2, at(2, src, 0), at(2, dst, 0), 4);
  h.wait(2, l2, 0, 2);
  expectIssue(h.s, {"race on rank 2 buffer 'dst' elements [0, 4)", "rank 0 lane 0 (intra) step 0 (put)",
                    "rank 2 lane 0 (intra) step 1 (copy)"});
  // Waiting for both before reading fixes it.
  std::swap(h.s.lanes[2][0].steps[0], h.s.lanes[2][0].steps[2]);
  expectValid(h.done());
}

TEST_CASE("validate: increments of one lane land in program order so a partial wait orders after the first") {
  // Rank 0 puts region [0,4) then region [4,8), signalling after each; rank 1 waits >= 1 and reads [0,4):
  // the first increment necessarily landed first. Reading [4,8) after the same wait is a race.
  Hand h({0, 0}, 1);
  const uint16_t src = h.buffer("src", 8);
  const uint16_t dst = h.buffer("dst", 8);
  const uint32_t l0 = h.lane(0), l1 = h.lane(1);
  h.put(0, l0, at(1, dst, 0), at(0, src, 0), 4, 1, 0);
  h.put(0, l0, at(1, dst, 4), at(0, src, 4), 4, 1, 0);
  h.wait(1, l1, 0, 1);
  h.copy(1, l1, at(1, src, 0), at(1, dst, 0), 4);
  h.wait(1, l1, 0, 2);
  expectValid(h.s);
  h.s.lanes[1][0].steps[1].a.offset = 4;
  h.s.lanes[1][0].steps[1].dst.offset = 4;
  expectIssue(h.done(), {"race on rank 1 buffer 'dst' elements [4, 8)", "rank 0 lane 0 (intra) step 1 (put)"});
}

TEST_CASE("validate: ordering through a chain of flags across three ranks is transitive") {
  // rank 0 writes rank 1's buffer then signals rank 1; rank 1 signals rank 2; rank 2 reads rank 1's buffer.
  Hand h({0, 0, 0}, 1);
  const uint16_t b = h.buffer("b", 4);
  const uint16_t c = h.buffer("c", 4);
  const uint32_t l0 = h.lane(0), l1 = h.lane(1), l2 = h.lane(2);
  h.put(0, l0, at(1, b, 0), at(0, c, 0), 4, 1, 0);
  h.wait(1, l1, 0, 1);
  h.signal(1, l1, 2, 0);
  h.wait(2, l2, 0, 1);
  h.copy(2, l2, at(2, c, 0), at(1, b, 0), 4);
  expectValid(h.s);
  std::swap(h.s.lanes[2][0].steps[0], h.s.lanes[2][0].steps[1]);  // rank 2 reads before it waits
  expectIssue(h.done(), {"race on rank 1 buffer 'b' elements [0, 4)", "rank 0 lane 0 (intra) step 0 (put)",
                         "rank 2 lane 0 (intra) step 0 (copy)"});
}

TEST_CASE("validate: the race check is skipped when disabled or above raceCheckMaxSteps") {
  const Schedule racy = twoPuts(false).done();
  CHECK_FALSE(validateAll(racy).empty());
  ValidateOptions off;
  off.checkRaces = false;
  expectValid(racy, off);
  ValidateOptions small;
  small.raceCheckMaxSteps = racy.stepCount() - 1;
  expectValid(racy, small);
  // validate() says that it did not run, and why, so no caller can report a skipped check as passed.
  CHECK(validate(racy, off) == "turned off");
  CHECK(validate(racy, small) == std::to_string(racy.stepCount()) + " steps > " + std::to_string(racy.stepCount() - 1));
  const Schedule ordered = twoPuts(true).done();
  CHECK(validate(ordered).empty());
}

// ---- reporting and scale ------------------------------------------------------------------------------

TEST_CASE("validate: validate throws InvalidSchedule with the first issue and a count of the rest") {
  Hand h({0});
  const uint16_t b = h.buffer("b", 4);
  const uint32_t l = h.lane(0);
  for (int i = 0; i < 3; ++i) h.copy(0, l, at(0, b, 0), at(0, b, 0), 0);
  try {
    validate(h.done());
    FAIL("expected InvalidSchedule");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidSchedule);
    CHECK(e.message().rfind("rank 0 lane 0 (intra) step 0 (copy): count must be > 0", 0) == 0);
    CHECK(e.message().find("(+2 more)") != std::string::npos);
  }
}

TEST_CASE("validate: thousands of issues are capped and the rest counted") {
  Hand h({0});
  const uint16_t b = h.buffer("b", 4);
  const uint32_t l = h.lane(0);
  for (int i = 0; i < 1501; ++i) h.copy(0, l, at(0, b, 0), at(0, b, 0), 0);
  const auto issues = validateAll(h.done());
  REQUIRE(issues.size() == 1001);
  CHECK(issues.back().message.find("501 further issues not listed") != std::string::npos);
  try {
    validate(h.s);
    FAIL("expected InvalidSchedule");
  } catch (const Error& e) {
    CHECK(e.message().find("(+1500 more)") != std::string::npos);
  }
}

TEST_CASE("validate: one million steps over 3072 lanes validate in well under a second") {
  // 384 nodes x 8 ranks, one lane each: 108 rounds of put-to-neighbour-with-signal, wait, local copy.
  const uint32_t nRanks = 3072, rounds = 108, n = 64;
  std::vector<uint32_t> nodeOf(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) nodeOf[r] = r / 8;
  Hand h(nodeOf, 1);
  const uint16_t data = h.buffer("data", n * rounds);
  const uint16_t out = h.buffer("out", n * rounds);
  for (uint32_t r = 0; r < nRanks; ++r) {
    const uint32_t l = h.lane(r);
    const uint32_t next = (r / 8) * 8 + (r % 8 + 1) % 8;
    auto& steps = h.s.lanes[r][l].steps;
    steps.reserve(3 * rounds + 1);
    for (uint32_t i = 0; i < rounds; ++i) {
      h.put(r, l, at(next, data, uint64_t{i} * n), at(r, out, uint64_t{i} * n), n, next, 0);
      h.wait(r, l, 0, i + 1);
      h.copy(r, l, at(r, out, uint64_t{i} * n), at(r, data, uint64_t{i} * n), n);
    }
  }
  const Schedule s = h.done();
  REQUIRE(s.stepCount() >= 995000);
  const double t0 = cpuSeconds();
  const auto issues = validateAll(s);
  const double secs = cpuSeconds() - t0;
  MESSAGE("validateAll of " << s.stepCount() << " steps over 3072 lanes: " << secs << " s");
  INFO(listIssues(issues));
  CHECK(issues.empty());
  CHECK(secs < 1.0 * kTimeSlack);
}

TEST_CASE("validate: the race check handles a few thousand steps over many lanes quickly") {
  // 64 ranks on 8 nodes, ring of puts with signals: ~6000 steps, races checked.
  const uint32_t nRanks = 64, rounds = 31, n = 17;
  std::vector<uint32_t> nodeOf(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) nodeOf[r] = r / 8;
  Hand h(nodeOf, 1);
  const uint16_t data = h.buffer("data", n * rounds);
  const uint16_t out = h.buffer("out", n * rounds);
  for (uint32_t r = 0; r < nRanks; ++r) {
    const uint32_t l = h.lane(r);
    const uint32_t next = (r / 8) * 8 + (r % 8 + 1) % 8;
    for (uint32_t i = 0; i < rounds; ++i) {
      h.put(r, l, at(next, data, uint64_t{i} * n), at(r, out, uint64_t{i} * n), n, next, 0);
      h.wait(r, l, 0, i + 1);
      h.copy(r, l, at(r, out, uint64_t{i} * n), at(r, data, uint64_t{i} * n), n);
    }
  }
  const Schedule s = h.done();
  const double t0 = cpuSeconds();
  expectValid(s);
  CHECK(cpuSeconds() - t0 < 2.0 * kTimeSlack);
  // Breaking one wait of one round to a lower threshold makes that round's copy race with the next put.
  Schedule broken = s;
  broken.lanes[5][0].steps[3 * 7 + 1].value = 7;  // round 7 waits for >= 7 instead of >= 8
  expectIssue(broken, {"race on rank 5 buffer 'data' elements [119, 136)"});
}
