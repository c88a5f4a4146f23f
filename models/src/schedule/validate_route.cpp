// mkernel — the schedule validator, phase B for routing as data (route.hpp): extent sources, route and gather
// steps; the class is in validator.hpp.
#include <algorithm>
#include <string>

#include "mk/schedule/route.hpp"
#include "validator.hpp"

namespace mk::validation {

void Validator::checkExtentSources() {
  for (std::size_t e = 0; e < s_.extents.size(); ++e) {
    const ExtentDecl& d = s_.extents[e];
    if (!d.sourced()) continue;
    const std::string id = "extents[" + str(e) + "] '" + d.name + "'";
    if (d.sourceBuffer >= s_.buffers.size())
      add(-1, -1, -1,
          id + ": source buffer id " + str(d.sourceBuffer) + " out of range (" + str(s_.buffers.size()) + " buffers)");
    else if (!isDType(static_cast<uint8_t>(s_.buffers[d.sourceBuffer].dtype)) ||
             !dtypeInfo(s_.buffers[d.sourceBuffer].dtype).integer)
      add(-1, -1, -1,
          id + ": source buffer " + bufName(d.sourceBuffer) + " is " + toString(s_.buffers[d.sourceBuffer].dtype) +
              ", expected int32 (an extent's value is a count; keep counts in an int32 buffer)");
  }
}

void Validator::extentSourceOk(uint32_t g, uint32_t i, uint32_t rank, uint32_t extent) {
  if (extent >= s_.extents.size() || !s_.extents[extent].sourced()) return;
  const ExtentDecl& d = s_.extents[extent];
  if (d.sourceBuffer >= s_.buffers.size() || rank >= s_.nRanks) return;  // reported in phase A
  const uint64_t have = s_.buffers[d.sourceBuffer].count[rank];
  if (d.sourceElement >= have)
    addStep(g, i,
            "extent '" + d.name + "' reads element " + str(d.sourceElement) + " of buffer " + bufName(d.sourceBuffer) +
                " on rank " + str(rank) + ", which has " + str(have) + " elements");
}

void Validator::int32Ok(uint32_t g, uint32_t i, const BufRef& ref, const char* name, const char* kind) {
  const DType t = s_.buffers[ref.buffer].dtype;
  if (!isDType(static_cast<uint8_t>(t)) || !dtypeInfo(t).integer)
    addStep(g, i,
            std::string(name) + " " + bufName(ref.buffer) + " is " + toString(t) + ", expected int32 (a " + kind +
                "'s " + name + " holds expert ids, counts or token indices)");
}

void Validator::disjointOk(uint32_t g, uint32_t i, const BufRef& x, uint64_t xn, const char* xName, const BufRef& y,
                           uint64_t yn, const char* yName) {
  if (x.rank != y.rank || x.buffer != y.buffer || xn == 0 || yn == 0) return;
  if (x.offset < addSat(y.offset, yn) && y.offset < addSat(x.offset, xn))
    addStep(g, i,
            std::string(xName) + " [" + str(x.offset) + ", " + str(addSat(x.offset, xn)) + ") overlaps " + yName +
                " [" + str(y.offset) + ", " + str(addSat(y.offset, yn)) + ") in buffer " + bufName(x.buffer) +
                ": a step that reads through indices cannot run in place");
}

void Validator::checkRoute(uint32_t g, uint32_t i, uint32_t r, const Step& st) {
  const RouteShape rs = routeShape(st);
  if (rs.topk == 0)
    addStep(g, i, "topk must be >= 1 (experts per token)");
  else if (st.count == 0 || st.count % rs.topk != 0)
    addStep(g, i, "count " + str(st.count) + " must be tokens x topk: a positive multiple of topk " + str(rs.topk));
  if (rs.experts == 0)
    addStep(g, i, "experts must be >= 1");
  else if (rs.topk > rs.experts)
    addStep(g, i,
            "topk " + str(rs.topk) + " is larger than the experts " + str(rs.experts) +
                " (a token's top-k experts are distinct)");
  if (rs.capacity == 0) addStep(g, i, "capacity must be >= 1 (the entries of each expert's token list)");
  if (const char* why = routeBucketsProblem(s_, st))
    addStep(g, i, std::string(why) + " (experts " + str(rs.experts) + ", " + str(s_.nRanks) + " ranks)");
  if (st.extent != kNoExtent && st.extent < s_.extents.size() && rs.topk > 0 &&
      (st.count / std::max<uint64_t>(s_.extents[st.extent].bound, 1)) % rs.topk != 0)
    addStep(g, i, "count per unit of extent '" + s_.extents[st.extent].name + "' is not a whole number of tokens");
  const bool dOk = refOk(g, i, st.dst, "dst");
  const bool aOk = refOk(g, i, st.a, "a");
  if (!(dOk && aOk)) return;
  for (const auto& [name, ref] : {std::pair<const char*, const BufRef*>{"dst", &st.dst}, {"a", &st.a}}) {
    if (ref->rank != r)
      addStep(g, i, std::string(name) + " is on rank " + str(ref->rank) + ", expected the executing rank " + str(r));
    int32Ok(g, i, *ref, name, "route");
  }
  const IndexedElements n = indexedElements(st);
  rangeOk(g, i, st.dst, "dst", n.dst);
  rangeOk(g, i, st.a, "a", n.a);
  disjointOk(g, i, st.dst, n.dst, "dst (layout)", st.a, n.a, "a (ids)");
}

void Validator::checkGather(uint32_t g, uint32_t i, const Step& st) {
  if (st.aux == 0)
    addStep(g, i, "row must be >= 1 (elements per row)");
  else if (st.count == 0 || st.count % st.aux != 0)
    addStep(g, i, "count " + str(st.count) + " must be rows x row: a positive multiple of row " + str(st.aux));
  if (st.value == 0) addStep(g, i, "sourceRows must be >= 1 (the rows of a its indices may name)");
  if (st.extent != kNoExtent && st.extent < s_.extents.size() && st.aux > 0 &&
      (st.count / std::max<uint64_t>(s_.extents[st.extent].bound, 1)) % st.aux != 0)
    addStep(g, i, "count per unit of extent '" + s_.extents[st.extent].name + "' is not a whole number of rows");
  if (!operandsOnNode(g, i, st, {"dst", "a", "b"}, "gather")) return;
  dtypesAgree(g, i, {{"dst", &st.dst}, {"a", &st.a}});
  int32Ok(g, i, st.b, "b", "gather");
  if (st.aux == 0) return;
  const IndexedElements n = indexedElements(st);
  rangeOk(g, i, st.dst, "dst", n.dst);
  rangeOk(g, i, st.a, "a", n.a);
  rangeOk(g, i, st.b, "b", n.b);
  disjointOk(g, i, st.dst, n.dst, "dst", st.a, n.a, "a");
  disjointOk(g, i, st.dst, n.dst, "dst", st.b, n.b, "b (indices)");
}

void Validator::checkCombine(uint32_t g, uint32_t i, const Step& st) {
  const CombineShape c = combineShape(st);
  if (c.topk == 0) addStep(g, i, "topk must be >= 1 (slots per token)");
  if (c.experts == 0) addStep(g, i, "experts must be >= 1 (the blocks of rows after the weights)");
  if (c.row == 0)
    addStep(g, i, "row must be >= 1 (elements per row)");
  else if (st.count == 0 || st.count % c.row != 0)
    addStep(g, i, "count " + str(st.count) + " must be tokens x row: a positive multiple of row " + str(c.row));
  if (const char* why = routeBucketsProblem(s_, st))
    addStep(g, i, std::string(why) + " (experts " + str(c.experts) + ", " + str(s_.nRanks) + " ranks)");
  if (st.extent != kNoExtent && st.extent < s_.extents.size() && c.row > 0 &&
      (st.count / std::max<uint64_t>(s_.extents[st.extent].bound, 1)) % c.row != 0)
    addStep(g, i, "count per unit of extent '" + s_.extents[st.extent].name + "' is not a whole number of tokens");
  if (!operandsOnNode(g, i, st, {"dst", "a", "b"}, "combine")) return;
  for (const auto& [name, ref] : {std::pair<const char*, const BufRef*>{"dst", &st.dst}, {"a", &st.a}})
    if (s_.buffers[ref->buffer].dtype != DType::Float32)
      addStep(g, i,
              std::string(name) + " " + bufName(ref->buffer) + " is " + toString(s_.buffers[ref->buffer].dtype) +
                  ": a combine reads float32 weights and rows and writes float32 rows");
  int32Ok(g, i, st.b, "b", "combine");
  if (c.topk == 0 || c.experts == 0 || c.row == 0) return;
  const IndexedElements n = indexedElements(st);
  rangeOk(g, i, st.dst, "dst", n.dst);
  rangeOk(g, i, st.a, "a (weights, rows)", n.a);
  rangeOk(g, i, st.b, "b (ids)", n.b);
  disjointOk(g, i, st.dst, n.dst, "dst", st.a, n.a, "a (weights, rows)");
  disjointOk(g, i, st.dst, n.dst, "dst", st.b, n.b, "b (ids)");
}

}  // namespace mk::validation
