// subprocess.h — runs the strata binary (STRATA_BIN_PATH) as a user would, bounded in time, and
// checks docs/contracts.md's exit contract on what it did: status 0, or status 2 with exactly one
// line on stderr, "error: <file>: ..."; never another status, never a signal, never a hang.
//
// Header-only, for the tests of bad input (test_bad_input.cc, test_fuzz_inputs.cc).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace strata::testing {

struct Outcome {
  int status = -1;         // the exit status, when it exited
  int signal = 0;          // the signal that ended it (0: none)
  bool timed_out = false;  // killed at the deadline
  double seconds = 0;
  std::string out, err;  // the first kMaxCaptured bytes of each
};

constexpr size_t kMaxCaptured = 1 << 20;

// Whether process `pid` runs `name` (it has exec'd: before, it is the fork of the caller, with
// the caller's handlers) and has a handler for `sig` (/proc/PID/status: Name, SigCgt).
inline bool catches_signal(pid_t pid, const std::string& name, int sig) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (f == nullptr) return false;
  char line[256];
  unsigned long long mask = 0;
  bool named = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "Name:", 5) == 0)
      named = std::string(line + 5).find(name.substr(0, 15)) != std::string::npos;
    if (std::strncmp(line, "SigCgt:", 7) == 0) mask = std::strtoull(line + 7, nullptr, 16);
  }
  std::fclose(f);
  return named && ((mask >> (sig - 1)) & 1);
}

// Runs STRATA_BIN_PATH with `args` (stdin empty), killing it (SIGKILL, its whole process group)
// after timeout_s; with `signal` > 0, sends it that signal `signal_after_s` seconds after it has
// installed a handler for it (a stop request at any moment of the run from its first instant
// that a program can handle one: start-up, a resume, a step — not while the loader still maps
// its libraries).
inline Outcome run_strata(const std::vector<std::string>& args, double timeout_s, int signal = 0,
                          double signal_after_s = 0) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) return {};
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    std::vector<char*> argv;
    std::string bin = STRATA_BIN_PATH;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Outcome o;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&o.out, &o.err};
  int open_pipes = 2;
  const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
  const std::string bin_path = STRATA_BIN_PATH;
  const std::string name = bin_path.substr(bin_path.find_last_of('/') + 1);
  std::chrono::steady_clock::time_point signal_at{};
  bool armed = false, signalled = signal == 0;
  while (open_pipes > 0) {
    const auto now = std::chrono::steady_clock::now();
    if (!signalled && !armed && catches_signal(pid, name, signal)) {
      armed = true;
      signal_at = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(signal_after_s));
    }
    if (armed && !signalled && now >= signal_at) {
      ::kill(pid, signal);
      signalled = true;
    }
    double left = std::chrono::duration<double>(deadline - now).count();
    if (!signalled)  // look again soon: for the handler, then for the moment
      left = std::min(
          left, armed ? std::chrono::duration<double>(signal_at - now).count() + 1e-3 : 0.002);
    if (left <= 0) {
      o.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      break;
    }
    if (::poll(fds, 2, static_cast<int>(left * 1000) + 1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        if (sinks[i]->size() < kMaxCaptured) sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      }
    }
  }
  for (const pollfd& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int st = 0;
  ::waitpid(pid, &st, 0);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(st)) o.status = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) o.signal = WTERMSIG(st);
  return o;
}

// "" when `o` keeps the exit contract, else how it broke it. With `stop_asked`, status 4 (stopped
// on the request, saying so) keeps it too.
inline std::string contract_violation(const Outcome& o, bool stop_asked = false) {
  if (o.timed_out) return "no exit within the deadline (a hang)";
  if (o.signal != 0)
    return "killed by signal " + std::to_string(o.signal) + " (" + strsignal(o.signal) + ")";
  if (o.status == 0) return "";
  if (stop_asked && o.status == 4)
    return o.out.find("stopped by") != std::string::npos
               ? ""
               : "status 4 without its \"stopped by\" line";
  if (o.status != 2) return "exit status " + std::to_string(o.status) + " (expected 0 or 2)";
  if (o.err.empty() || o.err.back() != '\n' || o.err.find('\n') != o.err.size() - 1)
    return "status 2 with stderr not exactly one line";
  if (o.err.rfind("error: ", 0) != 0) return "status 2 with a line not starting \"error: \"";
  return "";
}

}  // namespace strata::testing
