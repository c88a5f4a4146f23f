#include "mk/util/size.hpp"

#include <cctype>
#include <cstdio>
#include <limits>

#include "mk/error.hpp"
#include "mk/util/format.hpp"

namespace mk {

uint64_t parseSize(std::string_view text) {
  auto fail = [&](const char* why) {
    return Error(ErrorCode::InvalidArgument,
                 "bad size '" + std::string(text) + "': " + why + " (expected e.g. 8, 1021, 64K, 1MiB, 1G)");
  };
  if (text.empty()) throw fail("empty");
  // One word, as the shell passes it: '1 K B' once read as 1 KiB, and "1 KiB" with one space is refused too, so
  // that a size never depends on how a script happened to quote it.
  for (const char c : text)
    if (std::isspace(static_cast<unsigned char>(c))) throw fail("spaces are not allowed (write 1KiB, not 1 KiB)");
  std::size_t i = 0;
  if (text[i] == '-') throw fail("negative");
  if (text[i] == '+') ++i;
  if (i == text.size() || !std::isdigit(static_cast<unsigned char>(text[i]))) throw fail("no digits");
  uint64_t value = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) throw fail("too large");
    value = value * 10 + digit;
  }
  // A lower-case b is a bit (1Gb = 1 gigabit, network speeds): refused rather than read as GiB, eight times too
  // much. Converting would guess the writer meant bits; a size is bytes, so the writer says so.
  if (i < text.size() && text.back() == 'b')
    throw fail("a lower-case b is a bit, not a byte: write B for bytes (1GB, 1GiB) or give bits / 8");
  std::string suffix;
  for (; i < text.size(); ++i) suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i])));
  unsigned shift = 0;
  if (!suffix.empty() && suffix.back() == 'B') suffix.pop_back();
  if (!suffix.empty() && suffix.back() == 'I') suffix.pop_back();
  if (suffix.empty())
    shift = 0;
  else if (suffix == "K")
    shift = 10;
  else if (suffix == "M")
    shift = 20;
  else if (suffix == "G")
    shift = 30;
  else if (suffix == "T")
    shift = 40;
  else if (suffix.find('.') != std::string::npos)
    throw fail("fractions are not allowed");
  else
    throw fail("unknown suffix");
  if (shift && value > (std::numeric_limits<uint64_t>::max() >> shift)) throw fail("too large");
  return value << shift;
}

std::vector<uint64_t> parseSweep(std::string_view text, std::string_view flag) {
  const std::string head = "bad " + std::string(flag) + " '" + std::string(text) + "': ";
  auto bad = [&](const std::string& why) { return Error(ErrorCode::InvalidArgument, head + why); };
  const auto c1 = text.find(':');
  const auto c2 = c1 == std::string_view::npos ? std::string_view::npos : text.find(':', c1 + 1);
  if (c2 == std::string_view::npos || text.find(':', c2 + 1) != std::string_view::npos)
    throw bad("expected MIN:MAX:FACTOR, e.g. 8:1G:2");
  uint64_t lo = 0, hi = 0, factor = 0;
  try {
    lo = parseSize(text.substr(0, c1));
    hi = parseSize(text.substr(c1 + 1, c2 - c1 - 1));
    factor = parseSize(text.substr(c2 + 1));
  } catch (const Error& e) {
    throw bad(e.message());
  }
  if (lo == 0 || hi < lo) throw bad("need 0 < MIN <= MAX");
  if (factor < 2) throw bad("FACTOR must be an integer >= 2");
  std::vector<uint64_t> sizes;
  // b * factor is formed only when it cannot pass hi, so MAX near 2^64 cannot wrap around (at most 64 sizes).
  for (uint64_t b = lo;; b *= factor) {
    sizes.push_back(b);
    if (b > hi / factor) break;
  }
  return sizes;
}

std::string formatSizeWithBytes(uint64_t bytes) {
  const std::string human = formatSize(bytes);
  return bytes < 1024 || bytes % 1024 != 0 ? human : human + " (" + std::to_string(bytes) + " B)";
}

std::string formatSize(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  unsigned u = 0;
  while (u < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + " " + kUnits[u];
}

std::string formatMicros(double us) {
  if (us >= 1e6) return strprintf("%.3f s", us / 1e6);
  if (us >= 1e3) return strprintf("%.3f ms", us / 1e3);
  return strprintf("%.3f us", us);
}

std::string formatBytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return strprintf("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return strprintf("%.2f MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return strprintf("%.2f KiB", bytes / 1024.0);
  return strprintf("%.0f B", bytes);
}

std::string formatNumber(double v, int significant) { return strprintf("%.*g", significant, v); }

}  // namespace mk
