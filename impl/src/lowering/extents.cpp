// Runtime extents in the lowering (see extents.hpp).
#include "lowering/extents.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "mk/error.hpp"
#include "mk/schedule/step_kind.hpp"

namespace mk::runtime {
namespace {

[[noreturn]] void failStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, ErrorCode code,
                           const std::string& msg) {
  throw Error(code, describeStep(s, rank, lane, step) + ": " + msg);
}

std::string extentName(const Schedule& s, uint32_t e) { return "runtime extent '" + s.extents[e].name + "'"; }

/// Whether any rank runs a compute step (Gemm, GroupedGemm, Attention): then every rank's table carries a parameter
/// block.
bool anyComputeStep(const Schedule& s) {
  for (const auto& lanes : s.lanes)
    for (const Lane& lane : lanes)
      for (const Step& st : lane.steps)
        if (st.kind == StepKind::Gemm || st.kind == StepKind::GroupedGemm || st.kind == StepKind::Attention)
          return true;
  return false;
}

}  // namespace

void lowerStepExtent(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, device::LoweredStep& ls,
                     std::vector<uint64_t>* sources) {
  ls.extent = device::kNoExtentWord;
  ls.extentBound = 0;
  ls.extentUnit = 0;
  const Step& st = s.lanes[rank][lane].steps[step];
  if (st.extent == kNoExtent || !(kindInfo(st.kind).fields & kFieldExtent)) return;
  if (st.extent >= s.extents.size())
    failStep(s, rank, lane, step, ErrorCode::InvalidSchedule,
             "extent index " + std::to_string(st.extent) + " is outside the schedule's " +
                 std::to_string(s.extents.size()) + " extents");
  const ExtentDecl& d = s.extents[st.extent];
  const std::string name = extentName(s, st.extent);
  if (st.kind == StepKind::ProxyPut)
    failStep(s, rank, lane, step, ErrorCode::Unsupported,
             "a ProxyPut with " + name +
                 " is not run by the GPU engine (its proxy sizes commands from its own copy of the schedule, "
                 "which has no extent values); run the schedule on the CPU executor, which runs it");
  if (st.flags & kStepProtocolBits)
    failStep(s, rank, lane, step, ErrorCode::Unsupported,
             std::string("an ") + ((st.flags & kStepLL128) ? "LL128" : "LL") + " put with " + name +
                 ": packets are planned when the schedule is lowered, for a fixed count; send it with the simple "
                 "protocol (no LL bits)");
  if (d.bound == 0 || st.count % d.bound != 0)
    failStep(s, rank, lane, step, ErrorCode::InvalidSchedule,
             "count " + std::to_string(st.count) + " is not a multiple of the bound " + std::to_string(d.bound) +
                 " of " + name + " (count is the elements at the bound)");
  if (d.bound > std::numeric_limits<int32_t>::max())
    failStep(s, rank, lane, step, ErrorCode::Unsupported,
             name + " has bound " + std::to_string(d.bound) + "; the GPU engine's steps carry bounds below 2^31");
  ls.extent = st.extent;
  if (d.sourced()) {
    // The value is an int32 of this rank's copy of the buffer, which an earlier step of the op wrote (a route's
    // counts, a notify's put): the kernel reads it when the step starts, after the step's waits.
    if (d.sourceBuffer >= s.buffers.size() || s.buffers[d.sourceBuffer].dtype != DType::Int32 ||
        d.sourceElement >= s.buffers[d.sourceBuffer].count[rank])
      failStep(s, rank, lane, step, ErrorCode::InvalidSchedule,
               name + " is read from element " + std::to_string(d.sourceElement) + " of buffer " +
                   std::to_string(d.sourceBuffer) + ", which is not an int32 element of rank " + std::to_string(rank) +
                   "'s buffer");
    const uint64_t binding = uint64_t{rank} * s.buffers.size() + d.sourceBuffer;
    const uint64_t operand = (binding << device::kOperandShift) | (d.sourceElement * 4);
    // One entry per element: steps of one extent share its index (the lowering's equal-pieces rule compares it).
    const auto at = std::find(sources->begin(), sources->end(), operand);
    ls.extent = device::kSourcedExtent | static_cast<uint32_t>(at - sources->begin());
    if (at == sources->end()) sources->push_back(operand);
  }
  ls.extentBound = static_cast<uint32_t>(d.bound);
  ls.extentUnit = st.count / d.bound;
}

void requireStaticGemm(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step) {
  const Step& st = s.lanes[rank][lane].steps[step];
  if (st.aux >= s.gemms.size() || s.gemms[st.aux].extent == kNoExtent) return;
  const uint32_t e = s.gemms[st.aux].extent;
  failStep(s, rank, lane, step, ErrorCode::Unsupported,
           "gemms[" + std::to_string(st.aux) + "] has rows set by " +
               (e < s.extents.size() ? extentName(s, e) : "extent " + std::to_string(e)) +
               ": the GPU tile engine runs static shapes only (its tiles and tensor maps are fixed when the op is "
               "bound); run the schedule on the CPU executor");
}

uint32_t extentsBindingOf(const Schedule& s, uint32_t rank) {
  bool uses = false;
  for (const Lane& lane : s.lanes[rank])
    for (const Step& st : lane.steps)
      uses = uses || (st.extent != kNoExtent && (kindInfo(st.kind).fields & kFieldExtent) &&
                      (st.extent >= s.extents.size() || !s.extents[st.extent].sourced()));
  if (!uses) return device::kNoExtentWord;
  const auto nB = static_cast<uint32_t>(s.buffers.size());
  const bool gemms = anyComputeStep(s);
  const uint32_t last = device::extentWordsBinding(s.nRanks, nB, gemms, s.nRanks - 1);
  if (last >= device::kMaxBindings)
    throw Error(
        ErrorCode::Unsupported,
        "a schedule with runtime extents binds one more address per rank (its extent words): " + std::to_string(nB) +
            " buffers on " + std::to_string(s.nRanks) + " ranks" + (gemms ? " with compute steps" : "") + " need " +
            std::to_string(last + 1) + ", the engine carries at most " + std::to_string(device::kMaxBindings));
  return device::extentWordsBinding(s.nRanks, nB, gemms, rank);
}

}  // namespace mk::runtime
