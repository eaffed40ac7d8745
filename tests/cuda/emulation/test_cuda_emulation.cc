// test_cuda_emulation.cc — the CUDA emulator's own guarantees (kernels/cuda/emulation), built in
// the emulation build only. The GPU tests that run there are only as good as the emulator's
// claims: that a missing __syncthreads or cp.async wait makes a kernel read what it would read
// wrong on some GPU schedule, that a cp.async issued over data another warp still reads lands
// over it in some block, that ldmatrix hands out the PTX ISA's layout, and that what a GPU would
// stop on stops here. Each kernel below breaks one rule (or, as the control, keeps it) and each
// test checks that the emulator shows it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/mma.cuh"
#include "tests/cuda/device_buffers.h"

namespace kc = strata::kernels::cuda;
using kc::bf16;

namespace {

// n values of T in device memory (device_buffers.h's DeviceBuffer), copied in and out.
template <class T>
class DeviceValues {
 public:
  explicit DeviceValues(const std::vector<T>& v) : buf_(v.size() * sizeof(T)) {
    EXPECT_EQ(cudaMemcpy(buf_.get(), v.data(), buf_.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceValues(size_t n, T fill = T{}) : DeviceValues(std::vector<T>(n, fill)) {}
  T* get() const { return static_cast<T*>(buf_.get()); }
  std::vector<T> host() const {
    std::vector<T> v(buf_.bytes() / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), buf_.get(), buf_.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  strata::device_test::DeviceBuffer buf_;
};
using Ints = DeviceValues<int>;

int* shared_ints() {
  return reinterpret_cast<int*>(kc::dynamic_shared_floats());
}

// Thread i writes i to shared memory and reads the slot 32 on: another warp's. The warp shuffle
// between them is no barrier for the other warp, but an emulator that ran warps in lockstep,
// barrier by barrier, would have every write done before any read.
__global__ void exchange_kernel(int* out, bool sync) {
  int* s = shared_ints();
  const int n = static_cast<int>(blockDim.x), i = static_cast<int>(threadIdx.x);
  s[i] = i;
  const int mate = __shfl_xor_sync(kc::kFullMask, i, 1);
  if (sync) __syncthreads();
  out[static_cast<int>(blockIdx.x) * n + i] = s[(i + 32) % n] + (mate ^ i ^ 1);
}

TEST(CudaEmulation, MissingSyncthreadsBetweenWarpsIsSeen) {
  for (const bool sync : {true, false}) {
    Ints out(2 * 64);
    kc::launch(exchange_kernel, 2, 64, 64 * sizeof(int), nullptr, out.get(), sync);
    int wrong = 0;
    const std::vector<int> got = out.host();
    for (int i = 0; i < 2 * 64; ++i) wrong += got[static_cast<size_t>(i)] != (i % 64 + 32) % 64;
    if (sync)
      EXPECT_EQ(wrong, 0) << "with the __syncthreads every thread reads its neighbour's index";
    else
      EXPECT_GT(wrong, 0) << "without it some thread must read an unwritten slot";
  }
}

// One thread copies in[0..8) to shared memory in two cp.async groups of 16 bytes and, after
// waiting for `wait_for` groups less than it issued (2: no wait), reads all eight back.
__global__ void groups_kernel(int* out, const int* in, int pending) {
  int* s = shared_ints();
  kc::cp_async_16(reinterpret_cast<bf16*>(s), reinterpret_cast<const bf16*>(in), 16);
  kc::cp_async_commit();
  kc::cp_async_16(reinterpret_cast<bf16*>(s + 4), reinterpret_cast<const bf16*>(in + 4), 16);
  kc::cp_async_commit();
  if (pending == 1) kc::cp_async_wait<1>();
  if (pending == 0) kc::cp_async_wait<0>();
  for (int k = 0; k < 8; ++k) out[blockIdx.x * 8 + k] = s[k];
}

TEST(CudaEmulation, CpAsyncLandsAtTheWaitOrEarlier) {
  const std::vector<int> values = {10, 11, 12, 13, 14, 15, 16, 17};
  Ints in(values);
  for (const int pending : {0, 1, 2}) {
    Ints out(4 * 8);
    kc::launch(groups_kernel, 4, 1, 8 * sizeof(int), nullptr, out.get(), in.get(), pending);
    const std::vector<int> got = out.host();
    for (int block = 0; block < 4; ++block)
      for (int k = 0; k < 8; ++k) {
        // Blocks 0 and 1 land copies as late as a GPU may: what the wait left pending is
        // unwritten (0xff bytes); blocks 2 and 3 as early: everything is there.
        const bool landed = block >= 2 || (k < 4 ? pending <= 1 : pending == 0);
        EXPECT_EQ(got[static_cast<size_t>(block * 8 + k)],
                  landed ? values[static_cast<size_t>(k)] : -1)
            << "block " << block << ", pending " << pending << ", int " << k;
      }
  }
}

// Warp 1 stages in[] by cp.async and returns without waiting; warp 0 reads the copy after a
// __syncthreads, which orders nothing after a copy no thread waited for.
__global__ void unwaited_kernel(int* out, const int* in) {
  int* s = shared_ints();
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (warp == 1) {
    kc::cp_async_16(reinterpret_cast<bf16*>(s + 4 * lane),
                    reinterpret_cast<const bf16*>(in + 4 * lane), 16);
    kc::cp_async_commit();
    return;
  }
  __syncthreads();
  for (int k = 0; k < 4; ++k)
    out[static_cast<int>(blockIdx.x) * 128 + 4 * lane + k] = s[4 * lane + k];
}

TEST(CudaEmulation, CpAsyncNobodyWaitedForIsSeen) {
  Ints in(128, 3), out(4 * 128);
  kc::launch(unwaited_kernel, 4, 64, 128 * sizeof(int), nullptr, out.get(), in.get());
  int wrong = 0;
  for (const int v : out.host()) wrong += v != 3;
  EXPECT_GT(wrong, 0) << "some block must leave the copies unlanded";
}

// Warp 1 - `reader` stages in[] by cp.async over shared memory that warp `reader` reads, with
// (`sync`) or without the __syncthreads between the read and the copy. The copying warp waits
// for its copy only after a __syncthreads, so the overwrite shows only where a copy may land
// before its wait: ordering the warps alone would not show it.
__global__ void overwrite_kernel(int* out, const int* in, int reader, bool sync) {
  int* s = shared_ints();
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (warp == reader)
    for (int k = 0; k < 4; ++k) s[4 * lane + k] = 7;
  __syncthreads();
  if (warp == reader)
    for (int k = 0; k < 4; ++k)
      out[static_cast<int>(blockIdx.x) * 128 + 4 * lane + k] = s[4 * lane + k];
  if (sync) __syncthreads();
  if (warp != reader) {
    kc::cp_async_16(reinterpret_cast<bf16*>(s + 4 * lane),
                    reinterpret_cast<const bf16*>(in + 4 * lane), 16);
    kc::cp_async_commit();
  }
  __syncthreads();
  if (warp != reader) kc::cp_async_wait<0>();
  __syncthreads();
}

TEST(CudaEmulation, CpAsyncOverDataAnotherWarpReadsIsSeen) {
  Ints in(128, 3);
  for (const int reader : {0, 1})
    for (const bool sync : {true, false}) {
      Ints out(4 * 128);
      kc::launch(overwrite_kernel, 4, 64, 128 * sizeof(int), nullptr, out.get(), in.get(), reader,
                 sync);
      int wrong = 0;
      for (const int v : out.host()) wrong += v != 7;
      if (sync)
        EXPECT_EQ(wrong, 0) << "warp " << reader << " reads before any copy is issued";
      else
        EXPECT_GT(wrong, 0) << "some block must land a copy before warp " << reader << " reads";
    }
}

// Each lane names row lane % 8 of 8 × 8 matrix lane / 8 (element (r, c) of matrix m holds
// m·64 + r·8 + c) and writes back the four registers ldmatrix gives it.
template <bool kTrans>
__global__ void ldmatrix_kernel(uint32_t* out) {
  auto* s = reinterpret_cast<uint16_t*>(kc::dynamic_shared_floats());
  const int lane = static_cast<int>(threadIdx.x);
  for (int e = 0; e < 8; ++e) s[lane * 8 + e] = static_cast<uint16_t>(lane * 8 + e);
  __syncthreads();
  uint32_t r[4];
  kc::ldmatrix_x4<kTrans>(r, reinterpret_cast<const bf16*>(s + lane * 8));
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
}

TEST(CudaEmulation, LdmatrixHandsOutThePtxLayout) {
  for (const bool trans : {false, true}) {
    DeviceValues<uint32_t> d(32 * 4);
    if (trans)
      kc::launch(ldmatrix_kernel<true>, 1, 32, 32 * 16, nullptr, d.get());
    else
      kc::launch(ldmatrix_kernel<false>, 1, 32, 32 * 16, nullptr, d.get());
    const std::vector<uint32_t> got = d.host();
    // PTX ISA, ldmatrix: lane l holds elements (l / 4, 2(l % 4)) and (l / 4, 2(l % 4) + 1) of
    // each matrix, the first in the low half; with .trans, of each matrix's transpose.
    for (int l = 0; l < 32; ++l)
      for (int m = 0; m < 4; ++m) {
        const int row = l / 4, col = 2 * (l % 4);
        auto at = [&](int r, int c) { return static_cast<uint32_t>(m * 64 + r * 8 + c); };
        const uint32_t want =
            trans ? at(col, row) | at(col + 1, row) << 16 : at(row, col) | at(row, col + 1) << 16;
        EXPECT_EQ(got[static_cast<size_t>(l * 4 + m)], want)
            << (trans ? ".trans" : "plain") << ", lane " << l << ", matrix " << m;
      }
  }
}

// What a GPU stops on (or leaves undefined) stops the emulator with the reason.
__global__ void misaligned_ldmatrix_kernel() {
  const bf16* s = reinterpret_cast<const bf16*>(kc::dynamic_shared_floats());
  uint32_t r[4];
  kc::ldmatrix_x4<false>(r, s + 8 * (threadIdx.x % 8) + 1);  // rows 2 bytes off
}

__global__ void global_cp_async_kernel(int* out, const int* in) {
  kc::cp_async_16(reinterpret_cast<bf16*>(out), reinterpret_cast<const bf16*>(in), 16);
}

TEST(CudaEmulationDeathTest, StopsWhereAGpuWould) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(kc::launch(misaligned_ldmatrix_kernel, 1, 32, 1024, nullptr),
               "an ldmatrix row at .*, which is not a 16-byte aligned row");
  Ints in(4), out(4);
  EXPECT_DEATH(kc::launch(global_cp_async_kernel, 1, 1, 64, nullptr, out.get(), in.get()),
               "a 16-byte cp.async to .*, which is not 16 aligned bytes of the block's dynamic "
               "shared memory");
}

}  // namespace
