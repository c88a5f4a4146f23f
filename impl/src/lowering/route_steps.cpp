// mkernel — the lowering's checks of the MoE routing steps (route_steps.hpp).
#include "lowering/route_steps.hpp"

#include <limits>
#include <string>
#include <utility>

#include "mk/device/engine_device.hpp"
#include "mk/error.hpp"
#include "mk/schedule/route.hpp"

namespace mk::runtime {
namespace {

std::string str(uint64_t v) { return std::to_string(v); }

[[noreturn]] void failAt(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, ErrorCode code,
                         const std::string& msg) {
  throw Error(code, describeStep(s, rank, lane, step) + ": " + msg);
}

bool overlap(const BufRef& x, uint64_t nx, const BufRef& y, uint64_t ny) {
  return x.rank == y.rank && x.buffer == y.buffer && x.offset < y.offset + ny && y.offset < x.offset + nx;
}

void requireOwn(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step,
                std::initializer_list<std::pair<const BufRef*, const char*>> refs) {
  for (const auto& [ref, name] : refs)
    if (ref->rank != rank)
      failAt(s, rank, lane, step, ErrorCode::Unsupported,
             std::string(name) + " lives on rank " + str(ref->rank) +
                 ": a routing step reads and writes only its own rank's memory (move the rows with a put)");
}

}  // namespace

RouteStepSpans checkRouteStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step) {
  const Step& st = s.lanes[rank][lane].steps[step];
  const RouteShape rs = routeShape(st);
  if (rs.topk == 0 || rs.experts == 0 || rs.capacity == 0 || st.count % rs.topk != 0)
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule,
           "topk " + str(rs.topk) + ", experts " + str(rs.experts) + " and capacity " + str(rs.capacity) +
               " must be >= 1 and count " + str(st.count) + " a multiple of topk");
  if (rs.buckets != RouteBuckets::Experts)
    failAt(s, rank, lane, step, ErrorCode::Unsupported,
           "a route into per-node lists (a dispatch across nodes) is not run by the GPU engine yet; run the schedule "
           "on the CPU executor");
  requireOwn(s, rank, lane, step, {{&st.dst, "the layout (dst)"}, {&st.a, "the ids (a)"}});
  const IndexedElements n = indexedElements(st);
  if (s.buffers[st.dst.buffer].dtype != DType::Int32 || s.buffers[st.a.buffer].dtype != DType::Int32)
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule, "a route reads int32 ids and writes an int32 layout");
  if (st.count > std::numeric_limits<uint32_t>::max() || n.dst > std::numeric_limits<int32_t>::max())
    failAt(s, rank, lane, step, ErrorCode::Unsupported,
           "the kernel's route addresses at most 2^32 ids and 2^31 layout entries (count " + str(st.count) +
               ", layout " + str(n.dst) + ")");
  if (overlap(st.dst, n.dst, st.a, n.a))
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule, "the layout overlaps the ids");
  return RouteStepSpans{n.dst, n.a, 0};
}

RouteStepSpans checkCombineStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step) {
  const Step& st = s.lanes[rank][lane].steps[step];
  const CombineShape c = combineShape(st);
  if (c.topk == 0 || c.experts == 0 || c.row == 0 || st.count == 0 || st.count % c.row != 0)
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule,
           "topk " + str(c.topk) + ", experts " + str(c.experts) + " and row " + str(c.row) +
               " must be >= 1 and count " + str(st.count) + " a positive multiple of row");
  if (c.buckets != RouteBuckets::Experts)
    failAt(s, rank, lane, step, ErrorCode::Unsupported,
           "a combine of per-node sums (a combine across nodes) is not run by the GPU engine yet; run the schedule "
           "on the CPU executor");
  requireOwn(s, rank, lane, step, {{&st.dst, "dst"}, {&st.a, "the weights and rows (a)"}, {&st.b, "the ids (b)"}});
  const IndexedElements n = indexedElements(st);
  if (s.buffers[st.dst.buffer].dtype != DType::Float32 || s.buffers[st.a.buffer].dtype != DType::Float32 ||
      s.buffers[st.b.buffer].dtype != DType::Int32)
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule,
           "a combine reads float32 weights and rows and int32 ids and writes float32 rows");
  if (overlap(st.dst, n.dst, st.a, n.a) || overlap(st.dst, n.dst, st.b, n.b))
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule, "dst overlaps the rows, the weights or the ids");
  // The kernel keeps a count per expert and at least one token's positions in its shared memory.
  if (c.tokens > std::numeric_limits<uint32_t>::max() || (uint64_t{c.experts} + c.topk) * 4 > device::kCombineSmemBytes)
    failAt(s, rank, lane, step, ErrorCode::Unsupported,
           "experts " + str(c.experts) + " + topk " + str(c.topk) + " (4 bytes each) exceed the " +
               str(device::kCombineSmemBytes) + " bytes of shared memory a combine step has, or tokens " +
               str(c.tokens) + " is 2^32 or more");
  return RouteStepSpans{n.dst, n.a, n.b};
}

RouteStepSpans checkGatherStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step) {
  const Step& st = s.lanes[rank][lane].steps[step];
  if (st.aux == 0 || st.count % st.aux != 0 || st.value == 0)
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule,
           "count " + str(st.count) + " must be a whole number of rows of row " + str(st.aux) +
               " >= 1 and sourceRows " + str(st.value) + " >= 1");
  requireOwn(s, rank, lane, step, {{&st.dst, "dst"}, {&st.a, "the source rows (a)"}, {&st.b, "the indices (b)"}});
  const IndexedElements n = indexedElements(st);
  if (s.buffers[st.dst.buffer].dtype != s.buffers[st.a.buffer].dtype || s.buffers[st.b.buffer].dtype != DType::Int32)
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule, "a gather moves rows of one dtype through int32 indices");
  if (overlap(st.dst, n.dst, st.a, n.a) || overlap(st.dst, n.dst, st.b, n.b))
    failAt(s, rank, lane, step, ErrorCode::InvalidSchedule, "dst overlaps its source rows or its indices");
  if (st.value > std::numeric_limits<int32_t>::max())
    failAt(s, rank, lane, step, ErrorCode::Unsupported, "sourceRows " + str(st.value) + " is above 2^31 - 1");
  return RouteStepSpans{n.dst, n.a, n.b};
}

}  // namespace mk::runtime
