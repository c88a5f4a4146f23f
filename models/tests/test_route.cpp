// Routing as data (route.hpp): a MoE dispatch + expert GEMM whose routing the schedule computes from the router's
// expert ids (route -> notify -> gather -> puts -> grouped GEMM, every size a runtime extent read from a count), run
// by the CPU executor against an FP32 reference computed from the ids; the refusals, the JSON and packed forms, the
// validator and the int32 element type.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;

namespace {

/// R ranks with E experts each (G = R x E global experts, expert j on rank j / E), T[r] tokens of H features on rank
/// r, each routed to K distinct experts; every (source, expert) block holds at most C tokens.
///  * ids (Input, int32, T x K), x (Input, bf16, T x H), w (Input, bf16, E x H x N: rank r's experts);
///  * layout (Scratch, int32): the route's counts per global expert, then each expert's token list (C entries);
///  * send (Scratch, bf16): per global expert j, its tokens packed by a gather, C x H;
///  * counts (Scratch, int32): on rank d, count[s x E + e] = tokens rank s routes to d's expert e (the notify);
///  * recv (Scratch, bf16) and out (Output, f32): on rank d, a C-row block per (source s, expert e).
/// Extents, all with bound C and a source: "to<j>" = layout[j] (what the executing rank sends to expert j) and
/// "from<s>.<e>" = counts[s x E + e] (what it receives).
/// Lanes per rank: comm (route; notify: put its counts for rank d's experts into d's counts, signal flag 0; per
/// expert j a gather and a put of C x H elements at extent "to<j>", signal flag 1 + r of the receiver) and
/// compute (wait for every rank's counts, then per source s wait for its E blocks and run a grouped GEMM).
struct MoeRoute {
  uint32_t R = 3, E = 2, K = 2, H = 24, N = 8, C = 0;
  std::vector<uint32_t> T;
  Schedule s;
  uint16_t ids = 0, x = 1, w = 2, layout = 3, send = 4, counts = 5, recv = 6, out = 7;

  MoeRoute(std::vector<uint32_t> tokens, uint32_t capacity) : C(capacity), T(std::move(tokens)) {
    const uint32_t G = R * E;
    const uint64_t block = uint64_t{C} * H;
    s.nRanks = R;
    s.nodeOf.assign(R, 0);
    s.nFlags = 1 + R;
    auto perRank = [&](uint64_t perToken) {
      std::vector<uint64_t> v;
      for (uint32_t t : T) v.push_back(t * perToken);
      return v;
    };
    auto same = [&](uint64_t n) { return std::vector<uint64_t>(R, n); };
    s.buffers = {{"ids", DType::Int32, BufferKind::Input, perRank(K)},
                 {"x", DType::BFloat16, BufferKind::Input, perRank(H)},
                 {"w", DType::BFloat16, BufferKind::Input, same(uint64_t{E} * H * N)},
                 {"layout", DType::Int32, BufferKind::Scratch, same(uint64_t{G} * (C + 1))},
                 {"send", DType::BFloat16, BufferKind::Scratch, same(G * block)},
                 {"counts", DType::Int32, BufferKind::Scratch, same(G)},
                 {"recv", DType::BFloat16, BufferKind::Scratch, same(G * block)},
                 {"out", DType::Float32, BufferKind::Output, same(uint64_t{G} * C * N)}};
    for (uint32_t j = 0; j < G; ++j) {
      ExtentDecl d{"to" + std::to_string(j), C, C / 2.0};
      d.sourceBuffer = layout;
      d.sourceElement = j;
      s.extents.push_back(d);
    }
    for (uint32_t src = 0; src < R; ++src)
      for (uint32_t e = 0; e < E; ++e) {
        ExtentDecl d{"from" + std::to_string(src) + "." + std::to_string(e), C, C / 2.0};
        d.sourceBuffer = counts;
        d.sourceElement = src * E + e;
        s.extents.push_back(d);
        s.gemms.push_back(GemmShape{C, N, H, H, N, N, G + src * E + e});
      }
    s.lanes.resize(R);
    for (uint32_t r = 0; r < R; ++r) {
      Lane comm;
      comm.role = LaneRole::Intra;
      Step route;
      route.kind = StepKind::Route;
      route.count = uint64_t{T[r]} * K;
      route.aux = K;
      route.value = routeValue(G, C);
      route.dst = bufRef(r, layout, 0);
      route.a = bufRef(r, ids, 0);
      comm.steps.push_back(route);
      for (uint32_t d = 0; d < R; ++d) {  // notify: rank d learns how many tokens r sends each of its experts
        Step st;
        st.kind = d == r ? StepKind::Copy : StepKind::Put;
        st.count = E;
        st.dst = bufRef(d, counts, uint64_t{r} * E);
        st.a = bufRef(r, layout, uint64_t{d} * E);
        if (d != r) signal(st, d, 0, 1);
        comm.steps.push_back(st);
      }
      comm.steps.push_back(signalStep(r, 0, 1));
      for (uint32_t j = 0; j < G; ++j) {
        Step gather;
        gather.kind = StepKind::Gather;
        gather.count = block;
        gather.aux = H;
        gather.value = T[r];
        gather.extent = j;
        gather.dst = bufRef(r, send, uint64_t{j} * block);
        gather.a = bufRef(r, x, 0);
        gather.b = bufRef(r, layout, G + uint64_t{j} * C);
        comm.steps.push_back(gather);
        const uint32_t d = j / E;
        Step put;
        put.kind = d == r ? StepKind::Copy : StepKind::Put;
        put.count = block;
        put.extent = j;
        put.dst = bufRef(d, recv, (uint64_t{r} * E + j % E) * block);
        put.a = bufRef(r, send, uint64_t{j} * block);
        if (d != r) signal(put, d, 1 + r, 1);
        comm.steps.push_back(put);
      }
      comm.steps.push_back(signalStep(r, 1 + r, E));
      Lane compute;
      compute.role = LaneRole::Compute;
      compute.steps.push_back(waitStep(r, 0, R));
      for (uint32_t src = 0; src < R; ++src) {
        compute.steps.push_back(waitStep(r, 1 + src, E));
        Step g;
        g.kind = StepKind::GroupedGemm;
        g.count = E;
        g.aux = src * E;
        g.dst = bufRef(r, out, uint64_t{src} * E * C * N);
        g.a = bufRef(r, recv, uint64_t{src} * E * block);
        g.b = bufRef(r, w, 0);
        compute.steps.push_back(g);
      }
      s.lanes[r] = {comm, compute};
    }
    fillCostAttributes(s);
  }

  static void signal(Step& st, uint32_t rank, uint32_t id, uint64_t value) {
    st.flags = kStepSignal;
    st.flag = FlagRef{rank, id};
    st.value = value;
  }
  static Step signalStep(uint32_t rank, uint32_t id, uint64_t value) {
    Step st;
    st.kind = StepKind::Signal;
    st.flag = FlagRef{rank, id};
    st.value = value;
    return st;
  }
  static Step waitStep(uint32_t rank, uint32_t id, uint64_t value) {
    Step st = signalStep(rank, id, value);
    st.kind = StepKind::Wait;
    return st;
  }
};

using Routing = std::vector<std::vector<int32_t>>;  ///< [rank][token x K + k]: global expert ids

/// K distinct random experts per token.
Routing randomRouting(const MoeRoute& f, std::mt19937& rng) {
  Routing ids(f.R);
  std::vector<int32_t> all(f.R * f.E);
  std::iota(all.begin(), all.end(), 0);
  for (uint32_t r = 0; r < f.R; ++r)
    for (uint32_t t = 0; t < f.T[r]; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      ids[r].insert(ids[r].end(), all.begin(), all.begin() + f.K);
    }
  return ids;
}

/// Memory with the routing and random bf16 tokens and weights.
HostMemory inputs(const MoeRoute& f, const Routing& ids, uint32_t seed) {
  HostMemory mem = HostMemory::allocate(f.s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (uint32_t r = 0; r < f.R; ++r) {
    std::memcpy(mem.as<int32_t>(r, f.ids), ids[r].data(), ids[r].size() * sizeof(int32_t));
    for (uint16_t b : {f.x, f.w}) {
      uint16_t* p = mem.as<uint16_t>(r, b);
      for (uint64_t i = 0; i < f.s.buffers[b].count[r]; ++i) p[i] = floatToBf16(dist(rng));
    }
  }
  return mem;
}

/// Every output element against an FP32 reference computed from the ids: on rank d, block (s, e) row i is token
/// t_i x w_e, where t_0 < t_1 < ... are the tokens of rank s that name expert d x E + e; rows past their count stay 0.
void checkOutputs(const MoeRoute& f, const Routing& ids, HostMemory& mem) {
  uint64_t checked = 0;
  for (uint32_t d = 0; d < f.R; ++d)
    for (uint32_t src = 0; src < f.R; ++src)
      for (uint32_t e = 0; e < f.E; ++e) {
        const int32_t j = static_cast<int32_t>(d * f.E + e);
        std::vector<uint32_t> tokens;
        for (uint32_t t = 0; t < f.T[src]; ++t)
          for (uint32_t k = 0; k < f.K; ++k)
            if (ids[src][t * f.K + k] == j) tokens.push_back(t);
        const uint16_t* xs = mem.as<uint16_t>(src, f.x);
        const uint16_t* we = mem.as<uint16_t>(d, f.w) + uint64_t{e} * f.H * f.N;
        const float* o = mem.as<float>(d, f.out) + (uint64_t{src} * f.E + e) * f.C * f.N;
        for (uint32_t i = 0; i < f.C; ++i)
          for (uint32_t c = 0; c < f.N; ++c) {
            double want = 0, mag = 0;
            if (i < tokens.size())
              for (uint32_t k = 0; k < f.H; ++k) {
                const double p = double(bf16ToFloat(xs[tokens[i] * f.H + k])) * bf16ToFloat(we[k * f.N + c]);
                want += p;
                mag += std::fabs(p);
              }
            INFO("rank " << d << " from " << src << " expert " << e << " row " << i << " col " << c);
            CHECK(std::fabs(o[i * f.N + c] - want) <= 1e-5 * mag + 1e-6);
            ++checked;
          }
      }
  CHECK(checked == uint64_t{f.R} * f.R * f.E * f.C * f.N);
}

bool outputsUntouched(const MoeRoute& f, HostMemory& mem) {
  for (uint32_t r = 0; r < f.R; ++r)
    for (uint64_t i = 0; i < f.s.buffers[f.out].count[r]; ++i)
      if (mem.as<float>(r, f.out)[i] != 0.0f) return false;
  return true;
}

}  // namespace

TEST_CASE("route: the schedule routes random router ids and every expert output matches the reference") {
  std::mt19937 rng(20261207);
  for (const std::vector<uint32_t>& tokens : {std::vector<uint32_t>{7, 9, 5}, std::vector<uint32_t>{11, 3, 9}}) {
    const MoeRoute f(tokens, 11);  // capacity: the most tokens a rank has, so no routing overflows
    REQUIRE(validate(f.s).empty());
    const Routing ids = randomRouting(f, rng);
    HostMemory mem = inputs(f, ids, static_cast<uint32_t>(rng()));
    execute(f.s, mem);
    checkOutputs(f, ids, mem);
    // The layout: counts per expert, then each expert's tokens in order, -1 past the count.
    const int32_t* lay = mem.as<int32_t>(0, f.layout);
    const uint32_t G = f.R * f.E;
    int32_t total = 0;
    for (uint32_t j = 0; j < G; ++j) {
      total += lay[j];
      for (int32_t i = 0; i < static_cast<int32_t>(f.C); ++i) {
        const int32_t tok = lay[G + j * f.C + i];
        if (i >= lay[j]) {
          CHECK(tok == -1);
        } else {
          CHECK((ids[0][tok * f.K] == int32_t(j) || ids[0][tok * f.K + 1] == int32_t(j)));
          if (i > 0) CHECK(tok > lay[G + j * f.C + i - 1]);
        }
      }
    }
    CHECK(total == int32_t(f.T[0] * f.K));
  }
}

TEST_CASE("route: a skewed routing fills one expert and leaves the others with no token") {
  const MoeRoute f({7, 9, 5}, 9);
  Routing ids(f.R);
  for (uint32_t r = 0; r < f.R; ++r)
    for (uint32_t t = 0; t < f.T[r]; ++t) ids[r].insert(ids[r].end(), {0, 5});  // experts 1 .. 4 get nothing
  HostMemory mem = inputs(f, ids, 17);
  execute(f.s, mem);
  checkOutputs(f, ids, mem);
  CHECK(mem.as<int32_t>(1, f.counts)[1] == 0);  // rank 0 sends rank 1's expert 1 (global 3) nothing
}

TEST_CASE("route: ids out of range and routings over a capacity are refused, with no output written") {
  const MoeRoute f({7, 9, 5}, 4);
  std::mt19937 rng(5);
  Routing ids(f.R, std::vector<int32_t>{});
  for (uint32_t r = 0; r < f.R; ++r)
    for (uint32_t t = 0; t < f.T[r]; ++t) ids[r].insert(ids[r].end(), {int32_t(t % 6), int32_t((t + 1) % 6)});
  Routing bad = ids;
  bad[1][3 * f.K + 1] = 6;
  HostMemory mem = inputs(f, bad, 1);
  test::expectError([&] { execute(f.s, mem); }, ErrorCode::InvalidArgument,
                    {"rank 1 lane 0 (intra) step 0 (route)", "rank 1 token 3 k 1 names expert 6, outside [0, 6)"});
  CHECK(outputsUntouched(f, mem));
  bad = ids;
  bad[2][0] = -1;
  mem = inputs(f, bad, 1);
  test::expectError([&] { execute(f.s, mem); }, ErrorCode::InvalidArgument, "token 0 k 0 names expert -1");
  CHECK(outputsUntouched(f, mem));
  // Every token of rank 1 to expert 2 (two name it twice): 11 slots into a list of 4.
  bad = ids;
  for (uint32_t t = 0; t < f.T[1]; ++t) bad[1][t * f.K] = 2;
  mem = inputs(f, bad, 1);
  test::expectError([&] { execute(f.s, mem); }, ErrorCode::InvalidArgument,
                    "rank 1 routes 11 tokens to expert 2, above the capacity 4");
  CHECK(outputsUntouched(f, mem));
}

TEST_CASE("route: an extent read from a count above its bound or below 0 is refused, naming it") {
  // One copy sized by extent "n" read from element 1 of int32 input "k": a count that overflows a receive bound.
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  s.buffers = {{"k", DType::Int32, BufferKind::Input, {2, 2}},
               {"src", DType::Float32, BufferKind::Input, {12, 12}},
               {"dst", DType::Float32, BufferKind::Output, {12, 12}}};
  ExtentDecl n{"n", 4, 2.0};
  n.sourceBuffer = 0;
  n.sourceElement = 1;
  s.extents = {n};
  Step copy;
  copy.kind = StepKind::Copy;
  copy.count = 12;  // 3 elements per unit
  copy.extent = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    copy.dst = bufRef(r, 2, 0);
    copy.a = bufRef(r, 1, 0);
    s.lanes.push_back({Lane{LaneRole::Intra, 1, {copy}}});
  }
  fillCostAttributes(s);
  REQUIRE(validate(s).empty());
  for (int32_t v : {5, -1}) {
    HostMemory mem = HostMemory::allocate(s);
    for (uint32_t r = 0; r < 2; ++r)
      for (uint32_t i = 0; i < 12; ++i) mem.as<float>(r, 1)[i] = float(i + 1);
    mem.as<int32_t>(0, 0)[1] = 2;
    mem.as<int32_t>(1, 0)[1] = v;
    test::expectError([&] { execute(s, mem); }, ErrorCode::InvalidArgument,
                      {"rank 1 lane 0 (intra) step 0 (copy): extent 'n' of rank 1 is " + std::to_string(v),
                       "(element 1 of buffer 'k'), outside [0, its bound 4]"});
    for (uint32_t i = 0; i < 12; ++i) CHECK(mem.as<float>(1, 2)[i] == 0.0f);
  }
  // In range: each rank copies its own count's share, whatever the caller says (a sourced extent ignores it).
  HostMemory mem = HostMemory::allocate(s);
  for (uint32_t r = 0; r < 2; ++r) {
    for (uint32_t i = 0; i < 12; ++i) mem.as<float>(r, 1)[i] = float(i + 1);
    mem.as<int32_t>(r, 0)[1] = r == 0 ? 1 : 4;
  }
  ExecOptions opt;
  opt.extents = {{0}, {0}};
  execute(s, mem, opt);
  for (uint32_t i = 0; i < 12; ++i) {
    CHECK(mem.as<float>(0, 2)[i] == (i < 3 ? float(i + 1) : 0.0f));
    CHECK(mem.as<float>(1, 2)[i] == float(i + 1));
  }
}

TEST_CASE("route: JSON and the packed form keep routes, gathers and extent sources, and run the same") {
  const MoeRoute f({7, 9, 5}, 9);
  const std::string text = scheduleToJson(f.s, 2);
  CHECK(text.find("\"source\": [\"layout\", 3]") != std::string::npos);
  CHECK(text.find("\"kind\": \"route\", \"count\": 18, \"topk\": 2, \"experts\": 6, \"capacity\": 9") !=
        std::string::npos);
  CHECK(text.find("\"row\": 24, \"sourceRows\": 9") != std::string::npos);
  CHECK(text.find("\"dtype\": \"int32\"") != std::string::npos);
  const Schedule back = scheduleFromJson(text);
  CHECK(scheduleToJson(back, 2) == text);
  const Schedule unpacked = unpack(pack(f.s));
  CHECK(pack(unpacked) == pack(f.s));
  REQUIRE(unpacked.extents.size() == f.s.extents.size());
  CHECK(unpacked.extents[8].sourceBuffer == f.counts);
  CHECK(unpacked.extents[8].sourceElement == 2);
  CHECK(unpacked.buffers[f.ids].dtype == DType::Int32);
  std::mt19937 rng(3);
  const Routing ids = randomRouting(f, rng);
  for (const Schedule* s : {&back, &unpacked}) {
    HostMemory a = inputs(f, ids, 9), b = inputs(f, ids, 9);
    execute(f.s, a);
    execute(*s, b);
    CHECK(a.bytes == b.bytes);
  }
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = scheduleToJson(f.s);
    const auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    return t;
  };
  test::expectError([&] { scheduleFromJson(with("\"source\":[\"layout\",0]", "\"source\":[\"nope\",0]")); },
                    ErrorCode::ParseError, "extents[0].source[0]: unknown buffer 'nope'");
  test::expectError([&] { scheduleFromJson(with("\"source\":[\"layout\",0]", "\"source\":[\"layout\"]")); },
                    ErrorCode::ParseError, "extents[0].source: expected a source [\"buffer\", element]");
  test::expectError([&] { scheduleFromJson(with("\"topk\":2,", "")); }, ErrorCode::ParseError,
                    "steps[0].topk: required field is missing");
  test::expectError([&] { scheduleFromJson(with("\"sourceRows\":9,", "\"rows\":9,")); }, ErrorCode::ParseError,
                    "unknown field 'rows'");
}

TEST_CASE("route: the validator refuses bad sizes, dtypes and extent sources, naming the field") {
  const MoeRoute f({7, 9, 5}, 9);
  auto refused = [&](auto edit, const std::string& part) {
    Schedule s = f.s;
    edit(s);
    test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule, part.c_str());
  };
  refused([](Schedule& s) { s.lanes[0][0].steps[0].aux = 4; },
          "route): count 14 must be tokens x topk: a positive multiple of topk 4");
  refused([](Schedule& s) { s.lanes[0][0].steps[0].value = routeValue(1, 9); }, "topk 2 is larger than the experts 1");
  refused([](Schedule& s) { s.lanes[0][0].steps[0].value = routeValue(6, 0); }, "capacity must be >= 1");
  refused([](Schedule& s) { s.lanes[1][0].steps[0].value = routeValue(6, 10); },
          "dst elements [0, 66) exceed buffer 'layout' on rank 1 (60 elements)");
  refused([&](Schedule& s) { s.buffers[f.ids].dtype = DType::Float32; },
          "a 'ids' is float32, expected int32 (a route's a holds expert ids");
  refused([&](Schedule& s) { s.extents[2].sourceBuffer = f.x; },
          "extents[2] 'to2': source buffer 'x' is bfloat16, expected int32");
  refused([&](Schedule& s) { s.extents[7].sourceElement = 6; },
          "extent 'from0.1' reads element 6 of buffer 'counts' on rank 0, which has 6 elements");
  refused([](Schedule& s) { s.lanes[2][0].steps[5].aux = 5; },  // the first gather of rank 2
          "count 216 must be rows x row: a positive multiple of row 5");
  refused([](Schedule& s) { s.lanes[2][0].steps[5].value = 6; },
          "a elements [0, 144) exceed buffer 'x' on rank 2 (120 elements)");
  refused([&](Schedule& s) { s.lanes[2][0].steps[5].b = bufRef(2, f.counts, 0); },
          "b elements [0, 9) exceed buffer 'counts'");
  refused([&](Schedule& s) { s.lanes[2][0].steps[5].dst = bufRef(2, f.out, 0); },
          "operand dtypes differ: dst 'out' is float32, a 'x' is bfloat16");
  // Integers are moved and counted, never reduced or multiplied into.
  refused(
      [&](Schedule& s) {
        Step red;
        red.kind = StepKind::Reduce;
        red.count = 2;
        red.dst = red.a = red.b = bufRef(0, f.counts, 0);
        s.lanes[0][1].steps.push_back(red);
      },
      "a reduce does not take int32 operands");
  refused([&](Schedule& s) { s.buffers[f.out].dtype = DType::Int32; }, "C (dst) 'out' is int32");
}

TEST_CASE("route: the race check counts the read of an extent's source") {
  // Lane 0 writes the count, lane 1 copies by it: without the flag between them the read races with the write.
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.nFlags = 1;
  s.buffers = {{"k", DType::Int32, BufferKind::Input, {1}},
               {"count", DType::Int32, BufferKind::Scratch, {1}},
               {"src", DType::Float32, BufferKind::Input, {4}},
               {"dst", DType::Float32, BufferKind::Output, {4}}};
  ExtentDecl n{"n", 4, 2.0};
  n.sourceBuffer = 1;
  s.extents = {n};
  Step set;
  set.kind = StepKind::Copy;
  set.count = 1;
  set.dst = bufRef(0, 1, 0);
  set.a = bufRef(0, 0, 0);
  Step use;
  use.kind = StepKind::Copy;
  use.count = 4;
  use.extent = 0;
  use.dst = bufRef(0, 3, 0);
  use.a = bufRef(0, 2, 0);
  s.lanes = {{Lane{LaneRole::Intra, 1, {set}}, Lane{LaneRole::Compute, 1, {use}}}};
  fillCostAttributes(s);
  test::expectError([&] { validate(s); }, ErrorCode::InvalidSchedule, "race on rank 0 buffer 'count' elements [0, 1)");
  s.lanes[0][0].steps.push_back(MoeRoute::signalStep(0, 0, 1));
  s.lanes[0][1].steps.insert(s.lanes[0][1].steps.begin(), MoeRoute::waitStep(0, 0, 1));
  CHECK(validate(s).empty());
  HostMemory mem = HostMemory::allocate(s);
  mem.as<int32_t>(0, 0)[0] = 3;
  for (uint32_t i = 0; i < 4; ++i) mem.as<float>(0, 2)[i] = float(i + 1);
  execute(s, mem);
  CHECK(mem.as<float>(0, 3)[2] == 3.0f);
  CHECK(mem.as<float>(0, 3)[3] == 0.0f);
}

TEST_CASE("route: int32 is an element type of schedules, not of an operation's data") {
  CHECK(dtypeSize(DType::Int32) == 4);
  CHECK(dtypeInfo(DType::Int32).integer);
  CHECK_FALSE(dtypeInfo(DType::Float32).integer);
  CHECK(parseDType("int32") == DType::Int32);
  CHECK(parseDType("i32") == DType::Int32);
  test::expectError([] { requireDType("int32", "--dtype"); }, ErrorCode::InvalidArgument,
                    "--dtype 'int32' is an integer type, for routing data in schedule buffers");
  // Element access: exact integers, stores round to nearest even and saturate.
  int32_t v[4] = {0, 0, 0, 0};
  storeElement(DType::Int32, v, 0, 2.5f);
  storeElement(DType::Int32, v, 1, -3.5f);
  storeElement(DType::Int32, v, 2, 3e9f);
  storeElement(DType::Int32, v, 3, std::nanf(""));
  CHECK(v[0] == 2);
  CHECK(v[1] == -4);
  CHECK(v[2] == 2147483647);
  CHECK(v[3] == 0);
  v[0] = -7;
  CHECK(loadElement(DType::Int32, v, 0) == -7.0f);
}

TEST_CASE("route: the cost attributes price a route and a gather by the bytes they move") {
  const MoeRoute f({7, 9, 5}, 8);
  const Step& route = f.s.lanes[1][0].steps[0];
  CHECK(route.bytes == (9 * 2 + 6 * 9) * 4);
  CHECK(route.link == LinkClass::Local);
  const Step& gather = f.s.lanes[1][0].steps[5];
  REQUIRE(gather.kind == StepKind::Gather);
  CHECK(gather.bytes == 4 * f.H * 2 + 4 * 4);  // expected = capacity / 2 rows, and their indices
  // The timeline prices both on the rank's memory like a local copy of their bytes (one lane uses it).
  const Profile p = defaultProfile(topologyPreset("h200x2"));
  const Timeline t = simulateUncontended(f.s, p);
  for (const StepTime& st : t.steps)
    if (st.rank == 1 && st.lane == 0 && (st.step == 0 || st.step == 5)) {
      const Step& step = f.s.lanes[1][0].steps[st.step];
      CHECK(st.endUs - st.startUs ==
            doctest::Approx(stepLaneUs(stepPrice(p, step.kind, step.link, static_cast<double>(step.bytes), false), 1)));
      CHECK(st.endUs - st.startUs > p.local.alphaUs);
    }
  CHECK(t.totalUs > 0);
}
