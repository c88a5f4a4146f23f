// mkernel — Schedule -> JSON ("mkernel.schedule.v1", docs/schedule-format.md); the reader is io_read.cpp, the file
// helpers src/io/files.cpp.
//
// The writer is hand-rolled (string appends, std::to_chars) rather than built on a nlohmann DOM: a DOM of
// a 1e6-step schedule costs seconds and gigabytes, the direct writer a fraction of a second.
#include "mk/schedule/io.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "attention_io.hpp"
#include "io_writer.hpp"
#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"
#include "mk/util/format.hpp"

namespace mk {
namespace {

using nlohmann::json;

using io_write::quoted;
using io_write::Writer;

std::string stepWhere(uint32_t r, std::size_t l, std::size_t i) {
  return "ranks[" + std::to_string(r) + "].lanes[" + std::to_string(l) + "].steps[" + std::to_string(i) + "]";
}

}  // namespace

std::string scheduleToJson(const Schedule& s, int indent) {
  if (s.nodeOf.size() != s.nRanks)
    throw Error(ErrorCode::InvalidArgument, "cannot serialise: nodeOf has " + std::to_string(s.nodeOf.size()) +
                                                " entries, expected nRanks = " + std::to_string(s.nRanks));
  if (s.lanes.size() != s.nRanks)
    throw Error(ErrorCode::InvalidArgument, "cannot serialise: lanes has " + std::to_string(s.lanes.size()) +
                                                " ranks, expected nRanks = " + std::to_string(s.nRanks));
  std::vector<std::string> extentNames;
  for (std::size_t e = 0; e < s.extents.size(); ++e)
    extentNames.push_back(quoted(s.extents[e].name, ("extents[" + std::to_string(e) + "].name").c_str()));
  std::vector<std::string> names;
  names.reserve(s.buffers.size());
  for (std::size_t b = 0; b < s.buffers.size(); ++b) {
    const BufferDecl& d = s.buffers[b];
    if (d.count.size() != s.nRanks)
      throw Error(ErrorCode::InvalidArgument, "cannot serialise: buffers[" + std::to_string(b) + "] ('" + d.name +
                                                  "') has " + std::to_string(d.count.size()) +
                                                  " per-rank counts, expected nRanks = " + std::to_string(s.nRanks));
    names.push_back(quoted(d.name, ("buffers[" + std::to_string(b) + "].name").c_str()));
  }

  Writer w(indent);
  std::string& o = w.out();
  // The "extent" member of the object at `where`, when `extent` names one.
  auto extentMember = [&](uint32_t extent, const std::string& where) {
    if (extent == kNoExtent) return;
    if (extent >= extentNames.size())
      throw Error(ErrorCode::InvalidArgument, "cannot serialise " + where + ".extent: index " + std::to_string(extent) +
                                                  " out of range (" + std::to_string(extentNames.size()) + " extents)");
    w.comma();
    w.key("extent");
    w.raw(extentNames[extent]);
  };
  o.reserve(256 + s.stepCount() * 72);
  o += '{';
  w.newline(1);
  w.key("schema");
  w.str(kScheduleSchema);
  o += ',';
  w.newline(1);
  w.key("info");
  o += '{';
  w.key("op");
  w.raw(quoted(s.info.op, "info.op"));
  w.comma();
  w.key("algo");
  w.raw(quoted(s.info.algo, "info.algo"));
  w.comma();
  w.key("dtype");
  w.str(toString(s.info.dtype));
  w.comma();
  w.key("redop");
  w.str(toString(s.info.redop));
  w.comma();
  w.key("count");
  w.u64(s.info.count);
  w.comma();
  w.key("root");
  w.u64(s.info.root);
  w.comma();
  w.key("chunks");
  w.u64(s.info.chunks);
  w.comma();
  w.key("channels");
  w.u64(s.info.channels);
  o += "},";
  w.newline(1);
  w.key("nRanks");
  w.u64(s.nRanks);
  o += ',';
  w.newline(1);
  w.key("nodeOf");
  o += '[';
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    if (r) w.comma();
    w.u64(s.nodeOf[r]);
  }
  o += "],";
  w.newline(1);
  w.key("nFlags");
  w.u64(s.nFlags);
  o += ',';
  w.newline(1);
  w.key("nBarriers");
  w.u64(s.nBarriers);
  o += ',';
  w.newline(1);

  w.key("buffers");
  o += '[';
  for (std::size_t b = 0; b < s.buffers.size(); ++b) {
    const BufferDecl& d = s.buffers[b];
    if (b) o += ',';
    w.newline(2);
    o += '{';
    w.key("name");
    w.raw(names[b]);
    w.comma();
    w.key("dtype");
    w.str(toString(d.dtype));
    w.comma();
    w.key("kind");
    w.str(toString(d.kind));
    w.comma();
    w.key("count");
    bool uniform = !d.count.empty();
    for (uint64_t c : d.count) uniform = uniform && c == d.count.front();
    if (uniform) {
      w.u64(d.count.front());
    } else {
      o += '[';
      for (std::size_t r = 0; r < d.count.size(); ++r) {
        if (r) w.comma();
        w.u64(d.count[r]);
      }
      o += ']';
    }
    o += '}';
  }
  if (!s.buffers.empty()) w.newline(1);
  o += "],";
  w.newline(1);

  if (!s.extents.empty()) {  // absent when there are none: static schedules read as before
    w.key("extents");
    o += '[';
    for (std::size_t e = 0; e < s.extents.size(); ++e) {
      if (e) o += ',';
      w.newline(2);
      o += '{';
      w.key("name");
      w.raw(extentNames[e]);
      w.comma();
      w.key("bound");
      w.u64(s.extents[e].bound);
      w.comma();
      w.key("expected");
      w.num(s.extents[e].expected);
      if (s.extents[e].sourced()) {
        if (s.extents[e].sourceBuffer >= names.size())
          throw Error(ErrorCode::InvalidArgument, "cannot serialise extents[" + std::to_string(e) +
                                                      "].source: buffer id " +
                                                      std::to_string(s.extents[e].sourceBuffer) + " out of range (" +
                                                      std::to_string(names.size()) + " buffers)");
        w.comma();
        w.key("source");
        o += '[';
        o += names[s.extents[e].sourceBuffer];
        w.comma();
        w.u64(s.extents[e].sourceElement);
        o += ']';
      }
      o += '}';
    }
    w.newline(1);
    o += "],";
    w.newline(1);
  }

  w.key("gemms");
  o += '[';
  for (std::size_t g = 0; g < s.gemms.size(); ++g) {
    const GemmShape& gs = s.gemms[g];
    if (g) o += ',';
    w.newline(2);
    o += '{';
    const std::pair<const char*, uint32_t> dims[] = {{"m", gs.m},     {"n", gs.n},     {"k", gs.k},
                                                     {"lda", gs.lda}, {"ldb", gs.ldb}, {"ldc", gs.ldc}};
    for (std::size_t i = 0; i < 6; ++i) {
      if (i) w.comma();
      w.key(dims[i].first);
      w.u64(dims[i].second);
    }
    extentMember(gs.extent, "gemms[" + std::to_string(g) + "]");
    o += '}';
  }
  if (!s.gemms.empty()) w.newline(1);
  o += "],";
  w.newline(1);
  writeAttentionShapes(w, s.attentions);

  w.key("ranks");
  o += '[';
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    if (r) o += ',';
    w.newline(2);
    o += '{';
    w.key("lanes");
    o += '[';
    const auto& lanes = s.lanes[r];
    for (std::size_t l = 0; l < lanes.size(); ++l) {
      const Lane& lane = lanes[l];
      if (l) o += ',';
      w.newline(3);
      o += '{';
      w.key("role");
      w.str(toString(lane.role));
      w.comma();
      w.key("ctas");
      w.u64(lane.ctas);
      w.comma();
      w.key("steps");
      o += '[';
      for (std::size_t i = 0; i < lane.steps.size(); ++i) {
        const Step& st = lane.steps[i];
        if (i) o += ',';
        w.newline(4);
        auto operand = [&](const char* k, const BufRef& ref) {
          if (ref.buffer >= names.size())
            throw Error(ErrorCode::InvalidArgument, "cannot serialise " + stepWhere(r, l, i) + "." + k +
                                                        ": buffer id " + std::to_string(ref.buffer) +
                                                        " out of range (" + std::to_string(names.size()) + " buffers)");
          w.comma();
          w.key(k);
          o += '[';
          w.u64(ref.rank);
          w.comma();
          o += names[ref.buffer];
          w.comma();
          w.u64(ref.offset);
          o += ']';
        };
        auto flagAndValue = [&]() {
          w.comma();
          w.key("flag");
          o += '[';
          w.u64(st.flag.rank);
          w.comma();
          w.u64(st.flag.id);
          o += ']';
          w.comma();
          w.key("value");
          w.u64(st.value);
        };
        auto count = [&]() {
          w.comma();
          w.key("count");
          w.u64(st.count);
          if (st.extent != kNoExtent && (kindInfo(st.kind).fields & kFieldExtent))
            extentMember(st.extent, stepWhere(r, l, i));
        };
        auto buckets = [&](RouteBuckets b) {  // a route's or a combine's, when not the experts (the default)
          if (b == RouteBuckets::Experts) return;
          w.comma();
          w.key("buckets");
          w.str(b == RouteBuckets::Nodes ? "nodes" : "own-node");
        };
        o += '{';
        w.key("kind");
        const char* kindName = toString(st.kind);
        if (kindName[0] == '?')
          throw Error(ErrorCode::InvalidArgument, "cannot serialise " + stepWhere(r, l, i) + ": unknown step kind " +
                                                      std::to_string(static_cast<unsigned>(st.kind)));
        w.str(kindName);
        switch (st.kind) {
          case StepKind::Copy:
            count();
            operand("dst", st.dst);
            operand("a", st.a);
            break;
          case StepKind::Reduce:
            count();
            w.comma();
            w.key("op");
            w.str(toString(st.op));
            if (isRedOp(static_cast<uint8_t>(st.op)) && redOpInfo(st.op).shape == RedOpShape::LseRows) {
              w.comma();
              w.key("row");
              w.u64(st.aux);
            }
            operand("dst", st.dst);
            operand("a", st.a);
            operand("b", st.b);
            break;
          case StepKind::Put:
          case StepKind::ProxyPut:
            count();
            operand("dst", st.dst);
            operand("a", st.a);
            if (st.flags & kStepProtocolBits) {
              w.comma();
              w.key("protocol");
              w.str((st.flags & kStepLL) ? "ll" : "ll128");
            }
            if (st.flags & kStepSignal) {
              w.comma();
              w.key("signal");
              o += "true";
              flagAndValue();
            }
            break;
          case StepKind::Signal:
          case StepKind::Wait: flagAndValue(); break;
          case StepKind::GroupedGemm: count(); [[fallthrough]];
          case StepKind::Gemm:
          case StepKind::Attention:  // a shape index ("gemm", "attention") and three operands
          case StepKind::AttentionGrad:
            w.comma();
            w.key(kindInfo(st.kind).auxName);
            w.u64(st.aux);
            operand("dst", st.dst);
            operand("a", st.a);
            operand("b", st.b);
            if (st.kind == StepKind::Attention || st.kind == StepKind::AttentionGrad) break;
            w.comma();
            w.key("accumulate");
            o += (st.flags & kStepAccumulate) ? "true" : "false";
            w.comma();
            w.key("bColMajor");
            o += (st.flags & kStepBColMajor) ? "true" : "false";
            if (st.flags & kStepSwiGLU) {
              w.comma();
              w.key("swiglu");
              o += "true";
            }
            break;
          case StepKind::Barrier:
            w.comma();
            w.key("barrier");
            w.u64(st.aux);
            break;
          case StepKind::Route: {
            const RouteShape rs = routeShape(st);
            count();
            for (const auto& [k, v] : {std::pair<const char*, uint32_t>{"topk", rs.topk},
                                       {"experts", rs.experts},
                                       {"capacity", rs.capacity}}) {
              w.comma();
              w.key(k);
              w.u64(v);
            }
            buckets(rs.buckets);
            operand("dst", st.dst);
            operand("a", st.a);
            break;
          }
          case StepKind::Combine: {
            const CombineShape c = combineShape(st);
            count();
            for (const auto& [k, v] :
                 {std::pair<const char*, uint32_t>{"topk", c.topk}, {"experts", c.experts}, {"row", c.row}}) {
              w.comma();
              w.key(k);
              w.u64(v);
            }
            buckets(c.buckets);
            operand("dst", st.dst);
            operand("a", st.a);
            operand("b", st.b);
            break;
          }
          case StepKind::Gather:
            count();
            w.comma();
            w.key("row");
            w.u64(st.aux);
            w.comma();
            w.key("sourceRows");
            w.u64(st.value);
            operand("dst", st.dst);
            operand("a", st.a);
            operand("b", st.b);
            break;
        }
        if (w.pretty()) {
          // For human readers only; scheduleFromJson ignores them and recomputes (fillCostAttributes).
          w.comma();
          w.key("link");
          w.str(toString(st.link));
          w.comma();
          w.key("bytes");
          w.u64(st.bytes);
          w.comma();
          w.key("flops");
          w.num(st.flops);
        }
        o += '}';
      }
      if (!lane.steps.empty()) w.newline(3);
      o += "]}";
    }
    if (!lanes.empty()) w.newline(2);
    o += "]}";
  }
  if (s.nRanks) w.newline(1);
  o += ']';
  w.newline(0);
  o += '}';
  return std::move(o);
}

}  // namespace mk
