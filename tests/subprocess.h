// subprocess.h — runs the strata binary (STRATA_BIN_PATH) as a user would, bounded in time, and
// checks DESIGN.md's exit contract on what it did: status 0, or status 2 with exactly one line
// on stderr, "error: <file>: ..."; never another status, never a signal, never a hang.
//
// Header-only, for the tests of bad input (test_bad_input.cc, test_fuzz_inputs.cc).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
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

// Runs STRATA_BIN_PATH with `args` (stdin empty), killing it (SIGKILL, its whole process group)
// after timeout_s.
inline Outcome run_strata(const std::vector<std::string>& args, double timeout_s) {
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
  while (open_pipes > 0) {
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
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

// "" when `o` keeps the exit contract, else how it broke it.
inline std::string contract_violation(const Outcome& o) {
  if (o.timed_out) return "no exit within the deadline (a hang)";
  if (o.signal != 0)
    return "killed by signal " + std::to_string(o.signal) + " (" + strsignal(o.signal) + ")";
  if (o.status == 0) return "";
  if (o.status != 2) return "exit status " + std::to_string(o.status) + " (expected 0 or 2)";
  if (o.err.empty() || o.err.back() != '\n' || o.err.find('\n') != o.err.size() - 1)
    return "status 2 with stderr not exactly one line";
  if (o.err.rfind("error: ", 0) != 0) return "status 2 with a line not starting \"error: \"";
  return "";
}

}  // namespace strata::testing
