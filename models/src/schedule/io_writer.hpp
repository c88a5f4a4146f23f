// mkernel — internal: the token writer of the schedule's JSON writer (io_write.cpp): string appends and
// std::to_chars, no DOM.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "mk/error.hpp"
#include "mk/util/format.hpp"

namespace mk::io_write {

using nlohmann::json;

/// JSON string literal of `s` (quotes included); nlohmann does the escaping and rejects invalid UTF-8.
inline std::string quoted(const std::string& s, const char* what) {
  try {
    return json(s).dump();
  } catch (const json::exception& e) {
    throw Error(ErrorCode::InvalidArgument, std::string("cannot serialise ") + what + ": " + e.what());
  }
}

/// Appends JSON tokens to one string, on one line (indent < 0) or one member per line.
class Writer {
 public:
  explicit Writer(int indent) : indent_(indent) {}

  std::string& out() noexcept { return out_; }
  bool pretty() const noexcept { return indent_ >= 0; }

  void newline(int level) {
    if (indent_ < 0) return;
    out_ += '\n';
    out_.append(static_cast<std::size_t>(level) * static_cast<std::size_t>(indent_), ' ');
  }
  /// Separator between members written on one line.
  void comma() { out_ += pretty() ? ", " : ","; }
  void key(const char* k) {
    out_ += '"';
    out_ += k;
    out_ += pretty() ? "\": " : "\":";
  }
  void u64(uint64_t v) {
    char buf[24];
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, res.ptr);
  }
  void num(double v) {
    // flops are integral in practice; print them without an exponent when they fit.
    if (v >= 0 && v < 9.007199254740992e15 && std::floor(v) == v) {
      u64(static_cast<uint64_t>(v));
      return;
    }
    out_ += strprintf("%.17g", v);
  }
  void str(const char* s) {  // only for our own enum names: no escaping needed
    out_ += '"';
    out_ += s;
    out_ += '"';
  }
  void raw(const std::string& s) { out_ += s; }

 private:
  int indent_;
  std::string out_;
};

}  // namespace mk::io_write
