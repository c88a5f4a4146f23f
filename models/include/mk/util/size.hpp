// mkernel — human sizes on command lines ("8", "1K", "1KiB", "512M", "1GiB": binary multiples) and the
// formatting of sizes, durations and plain numbers in messages and reports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mk {

/// Parse a byte size: digits with an optional binary suffix K/Ki/KiB/KB, M.., G.., T.. (all powers of 1024;
/// "B" alone allowed; one word: no spaces, "1 KiB" included). A lower-case "b" is a bit ("1Gb") and refused.
/// Throws Error(InvalidArgument) for empty, negative,
/// fractional, spaced, garbage or overflowing input, naming the text.
uint64_t parseSize(std::string_view text);

/// "MIN:MAX:FACTOR" (e.g. "8:1G:2", each part a size as parseSize reads it) -> MIN, MIN*FACTOR, ... <= MAX, the
/// sizes of an nccl-tests -b/-e/-f sweep. Throws Error(InvalidArgument) naming `flag` and the rule broken
/// (three parts, 0 < MIN <= MAX, FACTOR an integer >= 2).
std::vector<uint64_t> parseSweep(std::string_view text, std::string_view flag = "--sweep");

/// "64 MiB (67108864 B)": a size in the largest binary unit that divides it exactly, the raw bytes next to it
/// (just "512 B" below 1 KiB, where both are one number).
std::string formatSizeWithBytes(uint64_t bytes);

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
