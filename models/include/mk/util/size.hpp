// mkernel — human sizes on command lines ("8", "1K", "1KiB", "512M", "1GiB": binary multiples) and the
// formatting of sizes, durations and plain numbers in messages and reports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mk {

/// Parse a byte size: digits with an optional binary suffix K/Ki/KiB/KB, M.., G.., T.. (all powers of 1024;
/// "B" alone allowed). Throws Error(InvalidArgument) for empty, negative, fractional, garbage or overflowing
/// input, naming the text.
uint64_t parseSize(std::string_view text);

/// "1 KiB", "512 MiB", "1021 B": the largest binary unit that divides the value exactly.
std::string formatSize(uint64_t bytes);

/// "12.291 ms", "3.500 us", "1.250 s": a duration in microseconds with the unit that keeps it readable.
std::string formatMicros(double us);

/// "7.00 MiB", "512 B": an amount of bytes (possibly fractional, e.g. an average) with two decimals.
std::string formatBytes(double bytes);

/// "0.65", "1.5e+06", "inf": `v` with `significant` significant digits in printf's %g style (what an
/// ostream prints by default for 6), for numbers inside messages and formula strings.
std::string formatNumber(double v, int significant = 6);

}  // namespace mk
