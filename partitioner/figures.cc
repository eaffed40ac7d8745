#include "partitioner/figures.h"

#include <cmath>
#include <cstdio>

namespace strata {

std::string three(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string count_text(double v, const char* unit) {
  const double a = std::fabs(v);
  if (a >= 1e12) return three(v / 1e12) + " T " + unit;
  if (a >= 1e9) return three(v / 1e9) + " B " + unit;
  if (a >= 1e6) return three(v / 1e6) + " M " + unit;
  if (a >= 1e3) return three(v / 1e3) + " k " + unit;
  return three(v) + " " + unit;
}

std::string flop_text(double v) {
  static const char* const kPrefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 6) {
    v /= 1000;
    ++i;
  }
  return three(v) + " " + kPrefixes[i] + "FLOP";
}

std::string seconds_text(double s) {
  const double a = std::fabs(s);
  if (a >= 3600) return three(s / 3600) + " h";
  if (a >= 60) return three(s / 60) + " min";
  if (a >= 1 || a == 0) return three(s) + " s";
  if (a >= 1e-3) return three(s * 1e3) + " ms";
  return three(s * 1e6) + " µs";
}

std::string bytes_text(double b) {
  const double a = std::fabs(b);
  if (a >= 1024.0 * 1024 * 1024 * 1024) return three(b / (1024.0 * 1024 * 1024 * 1024)) + " TiB";
  if (a >= 1024.0 * 1024 * 1024) return three(b / (1024.0 * 1024 * 1024)) + " GiB";
  if (a >= 1024.0 * 1024) return three(b / (1024.0 * 1024)) + " MiB";
  if (a >= 1024.0) return three(b / 1024.0) + " KiB";
  return three(b) + " B";
}

std::string percent_text(double fraction) {
  return three(fraction * 100) + "%";
}

}  // namespace strata
