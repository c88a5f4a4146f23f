// mkernel — internal: the JSON form of the schedule's attention shapes ("attentions", attention.hpp), read by
// io_read.cpp and written by io_write.cpp.
#pragma once

#include <vector>

#include "io_read_json.hpp"
#include "io_writer.hpp"
#include "mk/schedule/attention.hpp"

namespace mk {

/// Appends the shapes of the array `v` (at JSON path `p`) to `out`; Error(ParseError) naming the field otherwise.
void readAttentionShapes(const io_read::json& v, const io_read::Path& p, std::vector<AttentionShape>& out);

/// Writes `"attentions": [...],` (nothing when `shapes` is empty, so schedules without attention read as before).
void writeAttentionShapes(io_write::Writer& w, const std::vector<AttentionShape>& shapes);

}  // namespace mk
