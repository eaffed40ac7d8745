// mmap_file.cc — MappedFile over POSIX open/fstat/mmap.
#include "runtime/data/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/base/error.h"

namespace strata {
namespace {

int advice_of(MappedFile::Access a) {
  switch (a) {
    case MappedFile::Access::kRandom:
      return MADV_RANDOM;
    case MappedFile::Access::kSequential:
      return MADV_SEQUENTIAL;
    case MappedFile::Access::kWillNeed:
      return MADV_WILLNEED;
    case MappedFile::Access::kNormal:
      break;
  }
  return MADV_NORMAL;
}

// ---- a file truncated under a mapping ----
// Reading a mapped page that the file no longer has raises SIGBUS, which would end the process
// with no word of why. Every mapping is recorded in a fixed table the handler can read (lock-free,
// async-signal-safe); the handler names the file and ends the process with status 1 (a job under
// mpirun then ends). A SIGBUS elsewhere gets the default action back and is raised again.
struct Slot {
  std::atomic<uintptr_t> begin{0}, end{0};  // end 0: free
  char path[200];
};
constexpr int kSlots = 1 << 16;
Slot g_slots[kSlots];
std::mutex g_slots_mutex;       // writers only; the handler reads without it
int g_slots_used = 0;           // slots [0, used) have been handed out
std::vector<int> g_free_slots;  // of those, the ones free again

void put(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void put(const char* s) {
  put(s, std::strlen(s));
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Slot& s : g_slots) {  // every slot: the handler takes no lock
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    const uintptr_t e = s.end.load(std::memory_order_acquire);
    if (e == 0 || a < b || a >= e) continue;
    char num[24];
    int n = 0;
    for (uintptr_t v = a - b; n == 0 || v > 0; v /= 10) num[n++] = static_cast<char>('0' + v % 10);
    put("error: ");
    put(s.path);
    put(": the file changed while the job read it (truncated or rewritten: no byte ");
    while (n > 0) put(&num[--n], 1);
    put(" any more); input files must stay as they are for the whole run\n");
    ::_exit(1);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Records a mapping; its slot (-1: none left).
int watch(const std::string& path, const void* data, uint64_t size) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa = {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  });
  const std::lock_guard<std::mutex> lock(g_slots_mutex);
  int at = -1;
  if (!g_free_slots.empty()) {
    at = g_free_slots.back();
    g_free_slots.pop_back();
  } else if (g_slots_used < kSlots) {
    at = g_slots_used++;
  }
  if (at < 0) return -1;  // more mappings than slots: a SIGBUS in it keeps its default action
  Slot& s = g_slots[at];
  const size_t n = std::min(path.size(), sizeof s.path - 1);
  std::memcpy(s.path, path.data(), n);
  s.path[n] = 0;
  s.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
  s.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
  return at;
}

void unwatch(int slot) {
  if (slot < 0) return;
  const std::lock_guard<std::mutex> lock(g_slots_mutex);
  g_slots[slot].end.store(0, std::memory_order_release);
  g_free_slots.push_back(slot);
}

// Closes a descriptor when it goes out of scope (the mapping outlives it).
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile MappedFile::open(const std::string& path, Access access) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below instead.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) {
    const int err = errno;
    throw InputError(path, "",
                     std::string(err == ENOENT ? "an existing file" : "a readable file") +
                         ", cannot open it: " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) {
    throw InputError(path, "",
                     std::string("a readable file, fstat failed: ") + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw InputError(path, "", "a regular file, this is not one");

  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<uint64_t>(st.st_size);
  if (m.size_ == 0) return m;
  void* p = ::mmap(nullptr, static_cast<size_t>(m.size_), PROT_READ, MAP_SHARED, f.fd, 0);
  if (p == MAP_FAILED) {
    throw InputError(path, "",
                     "a file that can be memory-mapped (" + std::to_string(m.size_) +
                         " bytes), mmap failed: " + std::strerror(errno));
  }
  m.data_ = static_cast<const uint8_t*>(p);
  m.slot_ = watch(path, p, m.size_);
  // Advice only tunes paging; a kernel that ignores it reads the same bytes.
  ::madvise(p, static_cast<size_t>(m.size_), advice_of(access));
  return m;
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      slot_(std::exchange(other.slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr) {
    unwatch(std::exchange(slot_, -1));
    ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
    data_ = nullptr;
    size_ = 0;
  }
}

}  // namespace strata
