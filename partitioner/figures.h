// figures.h — engineering figures with three significant digits, as `strata plan`, its refusals
// and the dry run print them (no "0.000120576B", no "7.9272e-05 s", no "7119.61 GiB"): a count
// with its SI prefix (B for billions, as model sizes are said), FLOPs, a duration in h, min, s, ms
// or µs, bytes in TiB, GiB, MiB or KiB, a percentage.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

namespace strata {

std::string three(double v);                         // "%.3g"
std::string count_text(double v, const char* unit);  // "1.24 B parameters"
std::string flop_text(double v);                     // "3.15 PFLOP"
std::string seconds_text(double s);                  // "2.5 h", "1.2 s", "79.3 µs"
std::string bytes_text(double b);                    // "61.2 GiB"
std::string percent_text(double fraction);           // 0.0542 → "5.42%"

}  // namespace strata
