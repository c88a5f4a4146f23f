// mkernel — JSON -> Schedule ("mkernel.schedule.v1", docs/schedule-format.md); the writer is io_write.cpp.
//
// The reader uses nlohmann's DOM because its error positions are what users need, and keeps a lazily formatted
// JSON path so that errors name the field ("ranks[2].lanes[0].steps[5].kind") at no cost on the happy path.
#include "mk/schedule/io.hpp"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "attention_io.hpp"
#include "io_read_json.hpp"
#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/util/format.hpp"

namespace mk {

namespace {

using nlohmann::json;

using namespace io_read;  // NOLINT: the reader's helpers (io_read_json.hpp)

const std::string kDTypeList = dtypeNames();
const std::string kRedOpList = namesOf({RedOp::Sum, RedOp::Max, RedOp::Min, RedOp::LseMerge});
const std::string kRoleList = namesOf({LaneRole::Compute, LaneRole::Intra, LaneRole::InterSend, LaneRole::InterRecv});
const std::string kKindList = [] {
  std::string list;
  for (const StepKindInfo& k : kStepKinds) list += (list.empty() ? "" : ", ") + std::string(k.name);
  return list;
}();
const std::string kBufferKindList =
    namesOf({BufferKind::Input, BufferKind::Output, BufferKind::Scratch, BufferKind::InOut});

class Reader {
 public:
  Schedule read(const json& root) {
    const Path top;
    expectObject(root, top);
    checkKeys(root, top,
              {"schema", "info", "nRanks", "nodeOf", "nFlags", "nBarriers", "buffers", "extents", "gemms", "attentions",
               "ranks"});
    const std::string& schema = asString(member(root, "schema", top), top["schema"]);
    if (!schemaMatches(schema, kScheduleSchema))
      fail(top["schema"], "unsupported schema '" + excerpt(schema) + "' (expected '" + kScheduleSchema + "')");

    if (const json* info = optionalMember(root, "info")) readInfo(*info, top["info"]);
    s_.nRanks = asU32(member(root, "nRanks", top), top["nRanks"]);

    const Path pNode = top["nodeOf"];
    const json& nodeOf = member(root, "nodeOf", top);
    expectArray(nodeOf, pNode);
    if (nodeOf.size() != s_.nRanks)
      fail(pNode, "has " + std::to_string(nodeOf.size()) + " entries, expected nRanks = " + std::to_string(s_.nRanks));
    s_.nodeOf.reserve(s_.nRanks);
    for (std::size_t r = 0; r < nodeOf.size(); ++r) s_.nodeOf.push_back(asU32(nodeOf[r], pNode[r]));

    if (const json* v = optionalMember(root, "nFlags")) s_.nFlags = asU32(*v, top["nFlags"]);
    if (const json* v = optionalMember(root, "nBarriers")) s_.nBarriers = asU32(*v, top["nBarriers"]);

    readBuffers(member(root, "buffers", top), top["buffers"]);
    if (const json* x = optionalMember(root, "extents")) readExtents(*x, top["extents"]);
    if (const json* g = optionalMember(root, "gemms")) readGemms(*g, top["gemms"]);
    if (const json* x = optionalMember(root, "attentions")) readAttentionShapes(*x, top["attentions"], s_.attentions);

    const Path pRanks = top["ranks"];
    const json& ranks = member(root, "ranks", top);
    expectArray(ranks, pRanks);
    if (ranks.size() != s_.nRanks)
      fail(pRanks, "has " + std::to_string(ranks.size()) + " entries, expected nRanks = " + std::to_string(s_.nRanks));
    s_.lanes.resize(s_.nRanks);
    for (std::size_t r = 0; r < ranks.size(); ++r) readRank(ranks[r], pRanks[r], s_.lanes[r]);
    fillCostAttributes(s_);
    return std::move(s_);
  }

 private:
  void readInfo(const json& v, const Path& p) {
    expectObject(v, p);
    checkKeys(v, p, {"op", "algo", "dtype", "redop", "count", "root", "chunks", "channels"});
    OpInfo& info = s_.info;
    if (const json* x = optionalMember(v, "op")) info.op = asString(*x, p["op"]);
    if (const json* x = optionalMember(v, "algo")) info.algo = asString(*x, p["algo"]);
    if (const json* x = optionalMember(v, "dtype"))
      info.dtype = asEnum<DType>(*x, p["dtype"], parseDType, "dtype", kDTypeList);
    if (const json* x = optionalMember(v, "redop"))
      info.redop = asEnum<RedOp>(*x, p["redop"], parseRedOp, "reduction op", kRedOpList);
    if (const json* x = optionalMember(v, "count")) info.count = asU64(*x, p["count"]);
    if (const json* x = optionalMember(v, "root")) info.root = asU32(*x, p["root"]);
    if (const json* x = optionalMember(v, "chunks")) info.chunks = asU32(*x, p["chunks"]);
    if (const json* x = optionalMember(v, "channels")) info.channels = asU32(*x, p["channels"]);
  }

  void readBuffers(const json& v, const Path& p) {
    expectArray(v, p);
    if (v.size() > 0xFFFF) fail(p, std::to_string(v.size()) + " buffers declared (at most 65535)");
    for (std::size_t b = 0; b < v.size(); ++b) {
      const Path pb = p[b];
      const json& o = v[b];
      expectObject(o, pb);
      checkKeys(o, pb, {"name", "dtype", "kind", "count"});
      BufferDecl d;
      d.name = asString(member(o, "name", pb), pb["name"]);
      if (d.name.empty()) fail(pb["name"], "a buffer name must not be empty");
      if (byName_.count(d.name)) fail(pb["name"], "duplicate buffer name '" + excerpt(d.name) + "'");
      d.dtype = asEnum<DType>(member(o, "dtype", pb), pb["dtype"], parseDType, "dtype", kDTypeList);
      d.kind = asEnum<BufferKind>(member(o, "kind", pb), pb["kind"], parseBufferKind, "buffer kind", kBufferKindList);
      const Path pc = pb["count"];
      const json& c = member(o, "count", pb);
      if (c.is_array()) {
        if (c.size() != s_.nRanks)
          fail(pc,
               "has " + std::to_string(c.size()) + " per-rank counts, expected nRanks = " + std::to_string(s_.nRanks));
        d.count.reserve(c.size());
        for (std::size_t r = 0; r < c.size(); ++r) d.count.push_back(asU64(c[r], pc[r]));
      } else {
        d.count.assign(s_.nRanks, asU64(c, pc));
      }
      byName_.emplace(d.name, static_cast<uint16_t>(b));
      s_.buffers.push_back(std::move(d));
    }
  }

  void readExtents(const json& v, const Path& p) {
    expectArray(v, p);
    for (std::size_t e = 0; e < v.size(); ++e) {
      const Path pe = p[e];
      const json& o = v[e];
      expectObject(o, pe);
      checkKeys(o, pe, {"name", "bound", "expected", "source"});
      ExtentDecl d;
      d.name = asString(member(o, "name", pe), pe["name"]);
      if (d.name.empty()) fail(pe["name"], "an extent name must not be empty");
      if (extentByName_.count(d.name)) fail(pe["name"], "duplicate extent name '" + excerpt(d.name) + "'");
      d.bound = asU64(member(o, "bound", pe), pe["bound"]);
      if (d.bound == 0) fail(pe["bound"], "must be >= 1 (the largest value the extent takes)");
      d.expected = static_cast<double>(d.bound);
      if (const json* x = optionalMember(o, "expected"))
        d.expected = json_get::number(*x, pe["expected"], 0.0, static_cast<double>(d.bound));
      if (const json* x = optionalMember(o, "source")) {
        const Path ps = pe["source"];
        if (!x->is_array() || x->size() != 2)
          fail(ps, "expected a source [\"buffer\", element], got " + describeJson(*x));
        d.sourceBuffer = bufferId((*x)[0], ps[std::size_t{0}]);
        d.sourceElement = asU64((*x)[1], ps[1]);
      }
      extentByName_.emplace(d.name, static_cast<uint32_t>(e));
      s_.extents.push_back(std::move(d));
    }
  }

  /// The index of the extent `v` names (a string).
  uint32_t readExtentRef(const json& v, const Path& p) {
    const std::string& name = asString(v, p);
    auto it = extentByName_.find(name);
    if (it == extentByName_.end()) {
      std::string declared;
      for (const auto& e : s_.extents) declared += (declared.empty() ? "" : ", ") + e.name;
      fail(p, "unknown extent '" + excerpt(name) + "' (declared: " + (declared.empty() ? "none" : excerpt(declared)) +
                  ")");
    }
    return it->second;
  }

  void readGemms(const json& v, const Path& p) {
    expectArray(v, p);
    for (std::size_t g = 0; g < v.size(); ++g) {
      const Path pg = p[g];
      const json& o = v[g];
      expectObject(o, pg);
      checkKeys(o, pg, {"m", "n", "k", "lda", "ldb", "ldc", "extent"});
      GemmShape gs;
      gs.m = asU32(member(o, "m", pg), pg["m"]);
      gs.n = asU32(member(o, "n", pg), pg["n"]);
      gs.k = asU32(member(o, "k", pg), pg["k"]);
      gs.lda = asU32(member(o, "lda", pg), pg["lda"]);
      gs.ldb = asU32(member(o, "ldb", pg), pg["ldb"]);
      gs.ldc = asU32(member(o, "ldc", pg), pg["ldc"]);
      if (const json* x = optionalMember(o, "extent")) gs.extent = readExtentRef(*x, pg["extent"]);
      s_.gemms.push_back(gs);
    }
  }

  void readRank(const json& v, const Path& p, std::vector<Lane>& lanes) {
    expectObject(v, p);
    checkKeys(v, p, {"lanes"});
    const Path pl = p["lanes"];
    const json& arr = member(v, "lanes", p);
    expectArray(arr, pl);
    lanes.resize(arr.size());
    for (std::size_t l = 0; l < arr.size(); ++l) {
      const Path pli = pl[l];
      const json& o = arr[l];
      expectObject(o, pli);
      checkKeys(o, pli, {"role", "ctas", "steps"});
      Lane& lane = lanes[l];
      lane.role = asEnum<LaneRole>(member(o, "role", pli), pli["role"], parseLaneRole, "lane role", kRoleList);
      if (const json* c = optionalMember(o, "ctas")) lane.ctas = asU32(*c, pli["ctas"]);
      const Path ps = pli["steps"];
      const json& steps = member(o, "steps", pli);
      expectArray(steps, ps);
      lane.steps.resize(steps.size());
      for (std::size_t i = 0; i < steps.size(); ++i) readStep(steps[i], ps[i], lane.steps[i]);
    }
  }

  /// The id of the buffer `v` names (a string); `where` is what an unknown name is reported at.
  uint16_t bufferId(const json& v, const Path& p, const Path& where) {
    const std::string& name = asString(v, p);
    auto it = byName_.find(name);
    if (it == byName_.end()) {
      std::string declared;
      for (const auto& b : s_.buffers) declared += (declared.empty() ? "" : ", ") + b.name;
      fail(where, "unknown buffer '" + excerpt(name) +
                      "' (declared: " + (declared.empty() ? "none" : excerpt(declared)) + ")");
    }
    return it->second;
  }
  uint16_t bufferId(const json& v, const Path& p) { return bufferId(v, p, p); }

  BufRef readOperand(const json& v, const Path& p) {
    if (!v.is_array() || v.size() != 3)
      fail(p, "expected an operand [rank, \"buffer\", offset], got " + describeJson(v));
    BufRef ref;
    ref.rank = asU32(v[0], p[std::size_t{0}]);
    ref.buffer = bufferId(v[1], p[1], p);
    ref.offset = asU64(v[2], p[2]);
    return ref;
  }

  FlagRef readFlag(const json& v, const Path& p) {
    if (!v.is_array() || v.size() != 2) fail(p, "expected a flag [rank, id], got " + describeJson(v));
    return FlagRef{asU32(v[0], p[std::size_t{0}]), asU32(v[1], p[1])};
  }

  /// A route's or a combine's "buckets": experts (the default), nodes or own-node, as Step::flags bits (route.hpp).
  uint8_t readRouteBuckets(const json& v, const Path& p) {
    const std::string b = asString(v, p);
    if (b == "nodes") return kStepRouteNodes;
    if (b == "own-node") return kStepRouteOwnNode;
    if (b != "experts") fail(p, "unknown buckets '" + excerpt(b) + "' (expected experts, nodes, own-node)");
    return 0;
  }

  void readStep(const json& o, const Path& p, Step& st) {
    expectObject(o, p);
    st.kind = asEnum<StepKind>(member(o, "kind", p), p["kind"], parseStepKind, "step kind", kKindList);
    // Cost attributes a writer may add for humans; recomputed by fillCostAttributes, never trusted.
    const std::initializer_list<const char*> cost = {"bytes", "flops", "link"};
    switch (st.kind) {
      case StepKind::Copy:
        checkKeys(o, p, {"kind", "count", "extent", "dst", "a"}, cost);
        st.count = asU64(member(o, "count", p), p["count"]);
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        break;
      case StepKind::Reduce:
        checkKeys(o, p, {"kind", "count", "extent", "op", "row", "dst", "a", "b"}, cost);
        st.count = asU64(member(o, "count", p), p["count"]);
        if (const json* x = optionalMember(o, "op"))
          st.op = asEnum<RedOp>(*x, p["op"], parseRedOp, "reduction op", kRedOpList);
        if (const json* x = optionalMember(o, "row")) {
          if (redOpInfo(st.op).shape != RedOpShape::LseRows)
            fail(p["row"],
                 std::string("a row width is given but op is ") + toString(st.op) + " (only lse-merge reads rows)");
          st.aux = asU32(*x, p["row"]);
        }
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        st.b = readOperand(member(o, "b", p), p["b"]);
        break;
      case StepKind::Put:
      case StepKind::ProxyPut: {
        checkKeys(o, p, {"kind", "count", "extent", "dst", "a", "protocol", "signal", "flag", "value"}, cost);
        st.count = asU64(member(o, "count", p), p["count"]);
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        if (const json* x = optionalMember(o, "protocol")) {
          const std::string proto = asString(*x, p["protocol"]);
          if (proto == "ll")
            st.flags |= kStepLL;
          else if (proto == "ll128")
            st.flags |= kStepLL128;
          else if (proto != "simple")
            fail(p["protocol"], "unknown protocol '" + excerpt(proto) + "' (expected simple, ll, ll128)");
        }
        const json* sig = optionalMember(o, "signal");
        if (sig != nullptr && asBool(*sig, p["signal"])) {
          st.flags |= kStepSignal;
          st.flag = readFlag(member(o, "flag", p), p["flag"]);
          st.value = json_get::unsignedInt(member(o, "value", p), p["value"]);
        } else {
          if (optionalMember(o, "flag")) fail(p["flag"], "a flag is given but \"signal\" is not true");
          if (optionalMember(o, "value")) fail(p["value"], "a value is given but \"signal\" is not true");
        }
        break;
      }
      case StepKind::Signal:
      case StepKind::Wait:
        checkKeys(o, p, {"kind", "flag", "value"}, cost);
        st.flag = readFlag(member(o, "flag", p), p["flag"]);
        st.value = json_get::unsignedInt(member(o, "value", p), p["value"]);
        break;
      case StepKind::Gemm:
      case StepKind::GroupedGemm:
        if (st.kind == StepKind::GroupedGemm) {
          checkKeys(o, p, {"kind", "count", "gemm", "dst", "a", "b", "accumulate", "bColMajor", "swiglu"}, cost);
          st.count = asU64(member(o, "count", p), p["count"]);
        } else {
          checkKeys(o, p, {"kind", "gemm", "dst", "a", "b", "accumulate", "bColMajor"}, cost);
        }
        st.aux = asU32(member(o, "gemm", p), p["gemm"]);
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        st.b = readOperand(member(o, "b", p), p["b"]);
        if (const json* x = optionalMember(o, "accumulate"); x && asBool(*x, p["accumulate"]))
          st.flags |= kStepAccumulate;
        if (const json* x = optionalMember(o, "bColMajor"); x && asBool(*x, p["bColMajor"])) st.flags |= kStepBColMajor;
        if (const json* x = optionalMember(o, "swiglu"); x && asBool(*x, p["swiglu"])) st.flags |= kStepSwiGLU;
        break;
      case StepKind::Barrier:
        checkKeys(o, p, {"kind", "barrier"}, cost);
        st.aux = asU32(member(o, "barrier", p), p["barrier"]);
        break;
      case StepKind::Route:
        checkKeys(o, p, {"kind", "count", "extent", "topk", "experts", "capacity", "buckets", "dst", "a"}, cost);
        st.count = asU64(member(o, "count", p), p["count"]);
        st.aux = asU32(member(o, "topk", p), p["topk"]);
        st.value =
            routeValue(asU32(member(o, "experts", p), p["experts"]), asU32(member(o, "capacity", p), p["capacity"]));
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        if (const json* x = optionalMember(o, "buckets")) st.flags |= readRouteBuckets(*x, p["buckets"]);
        break;
      case StepKind::Gather:
        checkKeys(o, p, {"kind", "count", "extent", "row", "sourceRows", "dst", "a", "b"}, cost);
        st.count = asU64(member(o, "count", p), p["count"]);
        st.aux = asU32(member(o, "row", p), p["row"]);
        st.value = asU64(member(o, "sourceRows", p), p["sourceRows"]);
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        st.b = readOperand(member(o, "b", p), p["b"]);
        break;
      case StepKind::Combine:
        checkKeys(o, p, {"kind", "count", "extent", "topk", "experts", "row", "buckets", "dst", "a", "b"}, cost);
        st.count = asU64(member(o, "count", p), p["count"]);
        st.aux = asU32(member(o, "topk", p), p["topk"]);
        st.value = combineValue(asU32(member(o, "experts", p), p["experts"]), asU32(member(o, "row", p), p["row"]));
        if (const json* x = optionalMember(o, "buckets")) st.flags |= readRouteBuckets(*x, p["buckets"]);
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        st.b = readOperand(member(o, "b", p), p["b"]);
        break;
      case StepKind::Attention:
      case StepKind::AttentionGrad:
        checkKeys(o, p, {"kind", "attention", "dst", "a", "b"}, cost);
        st.aux = asU32(member(o, "attention", p), p["attention"]);
        st.dst = readOperand(member(o, "dst", p), p["dst"]);
        st.a = readOperand(member(o, "a", p), p["a"]);
        st.b = readOperand(member(o, "b", p), p["b"]);
        break;
    }
    if (kindInfo(st.kind).fields & kFieldExtent)
      if (const json* x = optionalMember(o, "extent")) st.extent = readExtentRef(*x, p["extent"]);
  }

  Schedule s_;
  std::unordered_map<std::string, uint16_t> byName_;
  std::unordered_map<std::string, uint32_t> extentByName_;
};

}  // namespace

namespace {

/// The one reading path: `what` names the document in every message (a path, or "schedule").
Schedule readSchedule(const std::string& text, const std::string& what) {
  const json root = parseJson(text, what);
  try {
    return Reader().read(root);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::ParseError) throw;
    throw Error(ErrorCode::ParseError, what + ": " + e.message());
  }
}

}  // namespace

Schedule scheduleFromJson(const std::string& text) { return readSchedule(text, "schedule"); }

Schedule loadSchedule(const std::string& path) { return readSchedule(readFile(path), path); }

void saveSchedule(const Schedule& s, const std::string& path) { writeFileAtomic(path, scheduleToJson(s) + "\n"); }

}  // namespace mk
