// scheduler.cc — runs an emulated grid: each block's threads as fibers on the calling thread,
// switched at barriers (device.h describes the model and what it detects). The fibers are
// Boost.Context's, whose switch is a few instructions (ucontext's makes two system calls, which
// made a LayerNorm of 256 rows take seconds); one fiber per thread of the block is made per
// launch and runs the kernel for every block in turn.
#include <sys/mman.h>
#include <unistd.h>

#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/emulation/device.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace strata::cuda_emulation {
namespace {

constexpr size_t kStackBytes = size_t{64} << 10;  // per thread; kernels keep tiles in "registers"
constexpr int kWarp = 32;

// A fiber's stack with an inaccessible page below it, so an overflow faults instead of
// overwriting the next stack.
class Stack {
 public:
  Stack() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = kStackBytes + page;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("cuda emulation: mmap of a fiber stack");
      std::abort();
    }
    mprotect(p, page, PROT_NONE);
    base_ = static_cast<char*>(p);
    page_ = page;
  }
  ~Stack() { munmap(base_, bytes_); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* bottom() const { return base_ + page_; }
  size_t size() const { return kStackBytes; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0, page_ = 0;
};

enum class Wait { kNone, kBlock, kShuffle, kMma, kLdmatrix, kDone };

// One lane's operands of a warp's tensor-core product (mma_bf16_16816), on its fiber's stack
// while it waits.
struct MmaLane {
  const uint32_t* a;  // [4]
  const uint32_t* b;  // [2]
  float* d;           // [4], updated in place
};

// One lane's part of a warp's ldmatrix (ldmatrix_x4): the row it names and where its four
// registers go.
struct LdmatrixLane {
  const unsigned char* row;  // 16 bytes: row (lane % 8) of matrix (lane / 8)
  uint32_t* r;               // [4]
  bool trans;
};

// A cp.async in flight: `src_bytes` bytes from src, then zeros, to the 16 bytes at dst.
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  int src_bytes;
};

// Boost.Context's StackAllocator concept over one of our stacks (which outlive the fiber).
// Thread i's stack starts (i mod 64) cache lines below the top: stacks a whole number of pages
// apart would put every fiber's hot frames in the same cache sets, and each switch would miss.
struct PooledStack {
  Stack* stack;
  int thread;
  boost::context::stack_context allocate() {
    const size_t colour = static_cast<size_t>(thread % 64) * 64;
    boost::context::stack_context sc;
    sc.size = stack->size() - colour;
    sc.sp = stack->bottom() + sc.size;  // stacks grow down
    return sc;
  }
  void deallocate(boost::context::stack_context&) noexcept {}
};

struct Fiber {
  boost::context::fiber self;    // where the scheduler resumes it
  boost::context::fiber caller;  // where it yields to (the scheduler)
  uint3 idx;
  Wait wait = Wait::kNone;
  // This thread's cp.async copies in blocks that land them late: committed groups, oldest first,
  // and those issued since the last commit. They land in shared memory only when a cp_async_wait
  // lets them (never, if the thread returns first), so a read that does not wait for its copy
  // sees the bytes from before it.
  std::vector<std::vector<AsyncCopy>> copy_groups;
  std::vector<AsyncCopy> uncommitted;
};

// The state of the grid running on this thread.
struct Grid {
  const std::function<void()>* body = nullptr;
  dim3 grid, block;
  uint3 block_idx{0, 0, 0};
  int threads = 0;
  bool finished = false;  // the last block has run: fibers return when next resumed
  std::vector<Fiber> fibers;
  int current = -1;
  // Per warp: two slots per lane (shuffles alternate between them, so a lane that is done
  // reading one can already write the next), and which of the two the next shuffle uses.
  std::vector<uint64_t> slots;  // [warp][parity][lane]
  std::vector<int> parity;
  std::vector<MmaLane> mma;       // [warp][lane]: the operands of lanes waiting at a product
  std::vector<LdmatrixLane> ldm;  // [warp][lane]: the lanes waiting at an ldmatrix
  std::vector<unsigned char> smem;
  // cp.async copies land when issued (blocks 2 and 3 of every 4) instead of when waited for:
  // the earliest a GPU may complete them, where a copy over data another warp still reads shows.
  bool early_copies = false;
};

thread_local Grid* g_grid = nullptr;
thread_local std::vector<std::unique_ptr<Stack>> g_stacks;

std::string describe(const Grid& g) {
  std::ostringstream os;
  os << "grid (" << g.grid.x << ", " << g.grid.y << ", " << g.grid.z << ") of blocks (" << g.block.x
     << ", " << g.block.y << ", " << g.block.z << "), block (" << g.block_idx.x << ", "
     << g.block_idx.y << ", " << g.block_idx.z << ")";
  return os.str();
}

[[noreturn]] void fail(const Grid& g, const std::string& what) {
  std::fprintf(stderr, "cuda emulation: %s: %s\n", describe(g).c_str(), what.c_str());
  std::fflush(stderr);
  std::abort();
}

// The running fiber waits for `w` and hands control back to the scheduler.
void block_on(Wait w) {
  Grid* g = g_grid;
  if (g == nullptr || g->current < 0) {
    std::fprintf(stderr, "cuda emulation: a barrier outside a kernel\n");
    std::abort();
  }
  Fiber& f = g->fibers[static_cast<size_t>(g->current)];
  f.wait = w;
  f.caller = std::move(f.caller).resume();
}

int lane_count(const Grid& g, int warp) {
  return std::min(kWarp, g.threads - warp * kWarp);
}

// The 32 exchange slots of `warp` for shuffles of this parity.
uint64_t* shuffle_slots(Grid& g, int warp, int parity) {
  return g.slots.data() + (static_cast<size_t>(warp) * 2 + static_cast<size_t>(parity)) * kWarp;
}

// Where every not-finished thread waits, for a failure message:
// "threads 0-31 wait at a warp shuffle, threads 32-63 wait at __syncthreads".
std::string waits(const Grid& g) {
  std::ostringstream os;
  auto name = [](Wait w) {
    return w == Wait::kBlock      ? "__syncthreads"
           : w == Wait::kShuffle  ? "a warp shuffle"
           : w == Wait::kMma      ? "an mma.sync"
           : w == Wait::kLdmatrix ? "an ldmatrix"
                                  : "running";
  };
  int i = 0;
  const int n = g.threads;
  while (i < n) {
    const Wait w = g.fibers[static_cast<size_t>(i)].wait;
    int j = i;
    while (j + 1 < n && g.fibers[static_cast<size_t>(j + 1)].wait == w) ++j;
    if (w != Wait::kDone) {
      if (os.tellp() > 0) os << ", ";
      os << "threads " << i << "-" << j << " wait at " << name(w);
    }
    i = j + 1;
  }
  return os.str();
}

float bf16_bits_to_float(uint32_t half) {
  const uint32_t bits = half << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// The product of the warp whose 32 lanes wait at it: A (16 × 16) and B (16 × 8) are put together
// from the lanes' fragments by the PTX ISA's m16n8k16 layout (kernels/cuda/mma.cuh), D = A·B is
// summed in f32, and each lane's four accumulators get their part.
void run_mma(const MmaLane* lanes) {
  float A[16][16], B[16][8];
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r % 2), k = 2 * t + 8 * (r / 2);
      A[row][k] = bf16_bits_to_float(lanes[l].a[r] & 0xffffu);
      A[row][k + 1] = bf16_bits_to_float(lanes[l].a[r] >> 16);
    }
    for (int r = 0; r < 2; ++r) {
      const int k = 2 * t + 8 * r;
      B[k][g] = bf16_bits_to_float(lanes[l].b[r] & 0xffffu);
      B[k + 1][g] = bf16_bits_to_float(lanes[l].b[r] >> 16);
    }
  }
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
      float sum = 0.f;
      for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
      lanes[l].d[r] += sum;
    }
  }
}

// Whether the 16 bytes at p are 16-byte aligned and inside the block's dynamic shared memory,
// as an ldmatrix row or a cp.async destination must be; shared_span names that memory for the
// failure message.
bool is_shared_chunk(const Grid& g, const void* p) {
  const auto* b = static_cast<const unsigned char*>(p);
  return b >= g.smem.data() && b + 16 <= g.smem.data() + g.smem.size() &&
         reinterpret_cast<uintptr_t>(b) % 16 == 0;
}
std::string shared_span(const Grid& g) {
  std::ostringstream os;
  os << g.smem.size() << " bytes at " << static_cast<const void*>(g.smem.data());
  return os.str();
}

// The ldmatrix.sync.aligned.m8n8.x4[.trans].b16 of the warp whose 32 lanes wait at it: lane
// 8m + i names row i of 8 × 8 matrix m (16 bytes, 16-byte aligned, in the block's dynamic shared
// memory); lane l gets, in register m, the pair of matrix m at row l / 4 and columns 2(l % 4),
// 2(l % 4) + 1, or with .trans at column l / 4 and rows 2(l % 4), 2(l % 4) + 1 (the lower column
// or row in bits 0-15).
void run_ldmatrix(const Grid& g, int warp, const LdmatrixLane* lanes) {
  for (int l = 0; l < kWarp; ++l) {
    const bool same_trans = lanes[l].trans == lanes[0].trans;
    if (same_trans && is_shared_chunk(g, lanes[l].row)) continue;
    std::ostringstream os;
    os << "warp " << warp << ", lane " << l << ": an ldmatrix ";
    if (!same_trans)
      os << "with .trans where lane 0's is " << (lanes[0].trans ? "with" : "without") << " it";
    else
      os << "row at " << static_cast<const void*>(lanes[l].row)
         << ", which is not a 16-byte aligned row of the block's dynamic shared memory ("
         << shared_span(g) << ")";
    fail(g, os.str());
  }
  uint16_t m[4][8][8];  // [matrix][row][column], read before any lane's registers are written
  for (int l = 0; l < kWarp; ++l) std::memcpy(m[l / 8][l % 8], lanes[l].row, 16);
  for (int l = 0; l < kWarp; ++l) {
    const int i = l / 4, j = 2 * (l % 4);
    for (int k = 0; k < 4; ++k) {
      const uint16_t lo = lanes[l].trans ? m[k][j][i] : m[k][i][j];
      const uint16_t hi = lanes[l].trans ? m[k][j + 1][i] : m[k][i][j + 1];
      lanes[l].r[k] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}

void land(const AsyncCopy& c) {
  std::memcpy(c.dst, c.src, static_cast<size_t>(c.src_bytes));
  std::memset(c.dst + c.src_bytes, 0, static_cast<size_t>(16 - c.src_bytes));
}

// Lands thread f's cp.async groups but the `pending` most recent, oldest first.
void land_copies(Fiber& f, size_t pending) {
  while (f.copy_groups.size() > pending) {
    for (const AsyncCopy& c : f.copy_groups.front()) land(c);
    f.copy_groups.erase(f.copy_groups.begin());
  }
}

// Releases the block barrier if every thread that has not returned waits at it (threads that
// returned count as arrived, as on a GPU); false otherwise.
bool release_block(Grid& g) {
  int live = 0, at_block = 0;
  for (const Fiber& f : g.fibers) {
    live += f.wait != Wait::kDone;
    at_block += f.wait == Wait::kBlock;
  }
  if (live == 0 || at_block < live) return false;
  for (Fiber& f : g.fibers)
    if (f.wait == Wait::kBlock) f.wait = Wait::kNone;
  return true;
}

// Releases warp w's shuffle, product or ldmatrix if all its lanes have arrived; false otherwise.
bool release_warp(Grid& g, int w) {
  const int first = w * kWarp, lanes = lane_count(g, w);
  int at_shuffle = 0, at_mma = 0, at_ldm = 0, done = 0;
  for (int l = 0; l < lanes; ++l) {
    const Wait s = g.fibers[static_cast<size_t>(first + l)].wait;
    at_shuffle += s == Wait::kShuffle;
    at_mma += s == Wait::kMma;
    at_ldm += s == Wait::kLdmatrix;
    done += s == Wait::kDone;
  }
  const int waiting = std::max({at_shuffle, at_mma, at_ldm});
  if (waiting == 0 || waiting + done < lanes) return false;
  const char* what = at_shuffle > 0 ? "a shuffle" : at_mma > 0 ? "an mma.sync" : "an ldmatrix";
  if (done > 0)
    fail(g, "warp " + std::to_string(w) + ": " + what + " over all lanes while " +
                std::to_string(done) + " of its lanes have returned (" + waits(g) + ")");
  if (at_shuffle == 0 && lanes != kWarp)
    fail(g, "warp " + std::to_string(w) + ": " + what + " in a partial warp");
  if (at_mma > 0) {
    run_mma(g.mma.data() + static_cast<size_t>(w) * kWarp);
  } else if (at_ldm > 0) {
    run_ldmatrix(g, w, g.ldm.data() + static_cast<size_t>(w) * kWarp);
  } else {
    g.parity[static_cast<size_t>(w)] ^= 1;
  }
  for (int l = 0; l < lanes; ++l) g.fibers[static_cast<size_t>(first + l)].wait = Wait::kNone;
  return true;
}

// Makes the grid's fibers: thread i runs the kernel body for each block the scheduler gives it.
void make_fibers(Grid& g) {
  const int n = g.threads;
  if (g_stacks.size() < static_cast<size_t>(n)) g_stacks.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto& stack = g_stacks[static_cast<size_t>(i)];
    if (!stack) stack = std::make_unique<Stack>();
    Fiber& f = g.fibers[static_cast<size_t>(i)];
    f.idx = uint3{static_cast<unsigned>(i) % g.block.x,
                  static_cast<unsigned>(i) / g.block.x % g.block.y,
                  static_cast<unsigned>(i) / (g.block.x * g.block.y)};
    f.self = boost::context::fiber(std::allocator_arg, PooledStack{stack.get(), i},
                                   [&g, &f](boost::context::fiber&& scheduler) {
                                     f.caller = std::move(scheduler);
                                     while (!g.finished) {
                                       (*g.body)();
                                       // Copies it never waited for never land: no
                                       // thread can have been ordered after them.
                                       f.copy_groups.clear();
                                       f.uncommitted.clear();
                                       f.wait = Wait::kDone;
                                       f.caller = std::move(f.caller).resume();
                                     }
                                     return std::move(f.caller);
                                   });
  }
}

void resume(Grid& g, int i) {
  Fiber& f = g.fibers[static_cast<size_t>(i)];
  threadIdx = f.idx;
  g.current = i;
  f.self = std::move(f.self).resume();
  g.current = -1;
}

// Runs one block. Its warps take turns, each running as far as it can — through its shuffles,
// products and ldmatrix — until all its threads wait at __syncthreads or have returned: warp order
// and thread order in even blocks, both reversed in odd ones. So one warp always gets to a
// barrier before the next starts, and shared memory that one warp writes and another reads (or
// overwrites) without a __syncthreads between is seen unwritten (or overwritten) in one of the
// two orders.
void run_block(Grid& g, bool reverse, bool early_copies) {
  const int n = g.threads, warps = (n + kWarp - 1) / kWarp;
  for (Fiber& f : g.fibers) {
    f.wait = Wait::kNone;
    f.copy_groups.clear();
    f.uncommitted.clear();
  }
  std::fill(g.parity.begin(), g.parity.end(), 0);
  std::fill(g.smem.begin(), g.smem.end(), static_cast<unsigned char>(0xff));
  g.early_copies = early_copies;
  blockIdx = g.block_idx;
  for (;;) {
    for (int wi = 0; wi < warps; ++wi) {
      const int w = reverse ? warps - 1 - wi : wi, lanes = lane_count(g, w);
      do {
        for (int k = 0; k < lanes; ++k) {
          const int i = w * kWarp + (reverse ? lanes - 1 - k : k);
          if (g.fibers[static_cast<size_t>(i)].wait == Wait::kNone) resume(g, i);
        }
      } while (release_warp(g, w));
    }
    bool live = false;
    for (const Fiber& f : g.fibers) live = live || f.wait != Wait::kDone;
    if (!live) return;
    // Every warp has run as far as it can: unless all live threads wait at __syncthreads, some
    // wait at a barrier that will never be released.
    if (!release_block(g)) fail(g, "deadlock: " + waits(g));
  }
}

}  // namespace

void run_grid(const void* kernel, dim3 grid, dim3 block, size_t dynamic_smem_bytes,
              const std::function<void()>& body) {
  Grid g;
  g.body = &body;
  g.grid = grid;
  g.block = block;
  g.threads = static_cast<int>(block.x * block.y * block.z);
  if (g.threads <= 0 || g.threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    fail(g, "invalid launch shape (a GPU refuses it with cudaErrorInvalidConfiguration)");
  if (dynamic_smem_bytes > max_dynamic_shared_bytes(kernel))
    fail(g, std::to_string(dynamic_smem_bytes) + " bytes of dynamic shared memory, " +
                std::to_string(max_dynamic_shared_bytes(kernel)) +
                " allowed (above 48 KiB a kernel must opt in with cudaFuncSetAttribute)");
  g.fibers.resize(static_cast<size_t>(g.threads));
  const int warps = (g.threads + kWarp - 1) / kWarp;
  g.slots.assign(static_cast<size_t>(warps) * 2 * kWarp, 0);
  g.parity.assign(static_cast<size_t>(warps), 0);
  g.mma.assign(static_cast<size_t>(warps) * kWarp, MmaLane{});
  g.ldm.assign(static_cast<size_t>(warps) * kWarp, LdmatrixLane{});
  g.smem.resize(dynamic_smem_bytes);
  if (g_grid != nullptr) fail(g, "a kernel launched from inside a kernel");
  g_grid = &g;
  blockDim = block;
  gridDim = grid;
  make_fibers(g);
  uint64_t index = 0;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x, ++index) {
        g.block_idx = uint3{x, y, z};
        run_block(g, index % 2 == 1, index / 2 % 2 == 1);
      }
  g.finished = true;
  for (int i = 0; i < g.threads; ++i) resume(g, i);  // each returns from its function
  g_grid = nullptr;
}

void sync_block() {
  block_on(Wait::kBlock);
}

uint64_t shuffle_xor(uint64_t bits, int lane_mask, unsigned mask, int width) {
  Grid& g = *g_grid;
  const int t = g.current, warp = t / kWarp, lane = t % kWarp;
  if (mask != 0xffffffffu || width != kWarp)
    fail(g, "only full-warp shuffles (mask 0xffffffff, width 32) are emulated");
  const int src = lane ^ lane_mask;
  if (src < 0 || src >= lane_count(g, warp))
    fail(g, "thread " + std::to_string(t) + " shuffles from lane " + std::to_string(src) +
                ", which its warp does not have");
  const int parity = g.parity[static_cast<size_t>(warp)];
  uint64_t* slots = shuffle_slots(g, warp, parity);
  slots[lane] = bits;
  block_on(Wait::kShuffle);  // the release flips the warp's parity; these slots stay as written
  return slots[src];
}

void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
  Grid& g = *g_grid;
  g.mma[static_cast<size_t>(g.current)] = MmaLane{a, b, d};
  block_on(Wait::kMma);  // the release computes the warp's product into every lane's d
}

void ldmatrix_x4(uint32_t* r, const void* row, bool trans) {
  Grid& g = *g_grid;
  g.ldm[static_cast<size_t>(g.current)] =
      LdmatrixLane{static_cast<const unsigned char*>(row), r, trans};
  block_on(Wait::kLdmatrix);  // the release reads the warp's rows into every lane's r
}

void cp_async_16(void* smem_dst, const void* global_src, int src_bytes) {
  Grid& g = *g_grid;
  const bool bad_src = src_bytes < 0 || src_bytes > 16 ||
                       (src_bytes > 0 && reinterpret_cast<uintptr_t>(global_src) % 16);
  if (bad_src || !is_shared_chunk(g, smem_dst)) {
    std::ostringstream os;
    os << "thread " << g.current << ": a 16-byte cp.async ";
    if (bad_src)
      os << "of " << src_bytes << " source bytes from " << global_src
         << " (0 to 16 bytes from a 16-byte aligned address)";
    else
      os << "to " << smem_dst << ", which is not 16 aligned bytes of the block's dynamic shared "
         << "memory (" << shared_span(g) << ")";
    fail(g, os.str());
  }
  const AsyncCopy c{static_cast<unsigned char*>(smem_dst),
                    static_cast<const unsigned char*>(global_src), src_bytes};
  if (g.early_copies)
    land(c);
  else
    g.fibers[static_cast<size_t>(g.current)].uncommitted.push_back(c);
}

void cp_async_commit() {
  Fiber& f = g_grid->fibers[static_cast<size_t>(g_grid->current)];
  f.copy_groups.push_back(std::move(f.uncommitted));
  f.uncommitted.clear();
}

void cp_async_wait(int pending) {
  land_copies(g_grid->fibers[static_cast<size_t>(g_grid->current)], static_cast<size_t>(pending));
}

void* dynamic_shared() {
  return g_grid->smem.data();
}

void check_aligned(const void* p, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes == 0) return;
  std::ostringstream os;
  os << "thread " << g_grid->current << ": a " << bytes << "-byte vector access at " << p
     << ", which is not " << bytes << "-byte aligned (a GPU stops with a misaligned address)";
  fail(*g_grid, os.str());
}

}  // namespace strata::cuda_emulation
