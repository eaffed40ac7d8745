// comm_nccl.cc — the NCCL backend (device buffers).
//
// One NCCL communicator per group, created with ncclCommInitRank from a unique id that group rank
// 0 makes and broadcasts over an MPI communicator of the same ranks (each NcclCommunicator keeps
// that MPI communicator for splitting into sub-groups and for the id broadcasts of those).
//
// Stream-ordering contract (never a host synchronisation on the data path):
//   start of an operation   cudaEventRecord(ready, compute); cudaStreamWaitEvent(comm, ready)
//                           — the operation sees every kernel enqueued on compute before it;
//   the NCCL call           enqueued on this group's own high-priority communication stream, so
//                           communication overlaps compute and other groups' communication;
//   end of the operation    cudaEventRecord(done, comm);
//   Request::wait()         cudaStreamWaitEvent(compute, done) — compute work enqueued after the
//                           wait sees the result. The host does not block.
// barrier() alone blocks the host (it polls its event against the deadline).
//
// Watchdog: a process-wide thread polls the `done` event of every operation in flight
// (cudaEventQuery, every 50 ms) and each communicator's asynchronous error. An operation pending
// longer than timeout_s gets the watchdog line, its communicator is aborted (ncclCommAbort, which
// releases the kernels spinning on the missing peer) and the job ends with status 1. The schedule
// step in the message is the wait context of the thread when the operation was enqueued.
//
// Communicator creation is not watched inside ncclCommInitRank (blocking NCCL init has no
// deadline), but the id broadcast before it is: once every rank has the id, all have arrived.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>

#include "runtime/comm/comm_mpi.h"
#include "runtime/comm/cuda/nccl_check.h"
#include "runtime/comm/watchdog.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kI32:
      return ncclInt32;
    case DType::kBF16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : ncclMax;
}

// The completion event of one operation, shared by its Request and the watchdog.
class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return e_; }
  bool done() const {
    const cudaError_t r = cudaEventQuery(e_);
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) return false;
    CUDA_CHECK(r);
    return false;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

struct PeerDesc {
  bool send;
  int peer_world;
  size_t bytes;
  std::string what;
};

// What an operation was, for the watchdog line; formatted only if it fires.
struct OpDesc {
  const char* op = nullptr;  // collective name; nullptr for point-to-point
  size_t bytes = 0;
  std::vector<PeerDesc> peers;
};

// One thread for the process, running while any NCCL communicator exists.
class NcclWatchdog {
 public:
  // Never destroyed: the thread is joined when the last communicator goes, not at static
  // destruction, when the CUDA runtime may already be gone.
  static NcclWatchdog& get() {
    static NcclWatchdog* w = new NcclWatchdog();
    return *w;
  }

  void add_comm(ncclComm_t comm, const std::string& group, int device) {
    std::lock_guard<std::mutex> lk(mu_);
    comms_.push_back({comm, group});
    device_ = device;
    if (!thread_.joinable()) {
      stop_ = false;
      thread_ = std::thread([this] { run(); });
    }
  }

  void remove_comm(ncclComm_t comm) {
    std::thread stopping;
    {
      std::lock_guard<std::mutex> lk(mu_);
      comms_.erase(std::remove_if(comms_.begin(), comms_.end(),
                                  [comm](const CommInfo& c) { return c.comm == comm; }),
                   comms_.end());
      entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                    [comm](const Entry& e) { return e.comm == comm; }),
                     entries_.end());
      if (comms_.empty() && thread_.joinable()) {
        stop_ = true;
        stopping = std::move(thread_);
      }
    }
    cv_.notify_all();
    if (stopping.joinable()) stopping.join();
  }

  void track(ncclComm_t comm, std::shared_ptr<Event> done, const std::string& group, int group_size,
             OpDesc desc, double timeout_s) {
    if (timeout_s <= 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    entries_.push_back(Entry{comm, std::move(done), Clock::now(), timeout_s, group, group_size,
                             std::move(desc), wait_context()});
  }

 private:
  struct Entry {
    ncclComm_t comm;
    std::shared_ptr<Event> done;
    Clock::time_point start;
    double timeout_s;
    std::string group;
    int group_size;
    OpDesc desc;
    std::string context;
  };

  static std::string describe(const Entry& e) {
    if (e.desc.op != nullptr) {
      return describe_collective(e.desc.op, e.group, e.group_size, e.desc.bytes);
    }
    std::string out;
    for (const PeerDesc& p : e.desc.peers) {
      if (!out.empty()) out += "; ";
      out += describe_p2p(p.send, p.peer_world, e.group, p.bytes, p.what);
    }
    return out;
  }

  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    CUDA_CHECK(cudaSetDevice(device_));
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(50), [this] { return stop_; });
      if (stop_) break;
      const auto now = Clock::now();
      // Entries are in enqueue order: the oldest pending one is the operation that is stuck.
      size_t kept = 0;
      for (size_t i = 0; i < entries_.size(); ++i) {
        Entry& e = entries_[i];
        if (e.done->done()) continue;
        if (now - e.start > std::chrono::duration<double>(e.timeout_s)) {
          const std::string what = describe(e);
          const std::string context = e.context;
          const ncclComm_t comm = e.comm;
          const double timeout_s = e.timeout_s;
          lk.unlock();
          ncclCommAbort(comm);
          watchdog_expire(timeout_s, what, context);
        }
        if (kept != i) entries_[kept] = std::move(e);
        ++kept;
      }
      entries_.resize(kept);
      // A peer that died or a network failure shows here before any deadline passes.
      for (const CommInfo& c : comms_) {
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(c.comm, &async));
        if (async != ncclSuccess && async != ncclInProgress) {
          const std::string what = "NCCL asynchronous error on group " + c.group + ": " +
                                   ncclGetErrorString(async) + " (" + ncclGetLastError(c.comm) +
                                   ")";
          lk.unlock();
          ncclCommAbort(c.comm);
          fatal(what, __FILE__, __LINE__);
        }
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> entries_;
  struct CommInfo {
    ncclComm_t comm;
    std::string group;
  };
  std::vector<CommInfo> comms_;
  std::thread thread_;
  bool stop_ = false;
  int device_ = 0;
};

class NcclRequest final : public detail::RequestImpl {
 public:
  NcclRequest(std::shared_ptr<Event> done, cudaStream_t compute)
      : done_(std::move(done)), compute_(compute) {}
  bool test() override { return done_->done(); }
  void wait() override { CUDA_CHECK(cudaStreamWaitEvent(compute_, done_->get(), 0)); }

 private:
  std::shared_ptr<Event> done_;
  cudaStream_t compute_;
};

class NcclCommunicator final : public GroupCommunicator {
 public:
  // host: an MPI communicator over the same ranks, owned; MPI_COMM_NULL for a one-rank world
  // without MPI.
  NcclCommunicator(MPI_Comm host, int rank, int size, std::vector<int> world_ranks,
                   std::string name, double timeout_s)
      : GroupCommunicator(std::move(name), timeout_s), host_(host), device_(local_device_index()) {
    rank_ = rank;
    size_ = size;
    world_ranks_ = std::move(world_ranks);
    CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    if (size_ > 1) {
      MPI_Request r;
      MPI_CHECK(MPI_Ibcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, host_, &r));
      detail::mpi_wait(&r, timeout_s_,
                       describe_collective("broadcast of the NCCL id", name_, size_, sizeof id));
    }
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
    CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof(int32_t), stream_));
    NcclWatchdog::get().add_comm(comm_, name_, device_);
  }

  ~NcclCommunicator() override {
    // This group's work finishes before it is torn down; a hang here is reported like any other.
    auto done = std::make_shared<Event>();
    CUDA_CHECK(cudaEventRecord(done->get(), stream_));
    poll_until([&done] { return done->done(); }, timeout_s_,
               [this] { return describe_collective("teardown", name_, size_, 0); });
    NcclWatchdog::get().remove_comm(comm_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
    cudaEventDestroy(ready_);
    cudaFree(barrier_buf_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (host_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&host_);
  }

  CommBackend backend() const override { return CommBackend::kNCCL; }
  Device device() const override { return Device::kCUDA; }
  void set_compute_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }
  bool rendezvous_sends() const override { return true; }

  Request iall_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    return enqueue({"all_reduce", count * dtype_size(dtype), {}}, [&] {
      NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    });
  }

  Request ireduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                          ReduceOp op) override {
    return enqueue({"reduce_scatter", recv_count * size_ * dtype_size(dtype), {}}, [&] {
      NCCL_CHECK(
          ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    });
  }

  Request ireduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts,
                           DType dtype, ReduceOp op) override {
    // NCCL has no uneven reduce-scatter: one reduce per destination, fused into one group.
    const size_t es = dtype_size(dtype);
    return enqueue_per_rank("reduce_scatterv", counts, es, [&](int r, size_t offset) {
      NCCL_CHECK(ncclReduce(static_cast<const char*>(send) + offset * es, recv, counts[r],
                            nccl_type(dtype), nccl_op(op), r, comm_, stream_));
    });
  }

  Request iall_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    return enqueue({"all_gather", send_count * size_ * dtype_size(dtype), {}}, [&] {
      NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(dtype), comm_, stream_));
    });
  }

  Request iall_gatherv(const void* send, void* recv, const std::vector<size_t>& counts,
                       DType dtype) override {
    // No uneven all-gather either: one broadcast per source into its slot, fused into one group.
    const size_t es = dtype_size(dtype);
    return enqueue_per_rank("all_gatherv", counts, es, [&](int r, size_t offset) {
      char* slot = static_cast<char*>(recv) + offset * es;
      NCCL_CHECK(ncclBroadcast(r == rank_ ? send : slot, slot, counts[r], nccl_type(dtype), r,
                               comm_, stream_));
    });
  }

  Request iall_to_allv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                       const std::vector<size_t>& recv_counts, DType dtype) override {
    STRATA_CHECK(send_counts.size() == static_cast<size_t>(size_) &&
                     recv_counts.size() == static_cast<size_t>(size_),
                 "all_to_allv on group " << name_ << ": " << send_counts.size() << " and "
                                         << recv_counts.size() << " counts for " << size_
                                         << " ranks");
    const size_t es = dtype_size(dtype);
    size_t bytes = 0;
    for (size_t c : send_counts) bytes += c * es;
    // NCCL has no uneven all-to-all: one group of a send and a receive per peer (self included),
    // which progress together.
    return enqueue({"all_to_allv", bytes, {}}, [&] {
      NCCL_CHECK(ncclGroupStart());
      size_t so = 0, ro = 0;
      for (int r = 0; r < size_; ++r) {
        const size_t sc = send_counts[static_cast<size_t>(r)];
        const size_t rc = recv_counts[static_cast<size_t>(r)];
        if (sc > 0)
          NCCL_CHECK(ncclSend(static_cast<const char*>(send) + so * es, sc, nccl_type(dtype), r,
                              comm_, stream_));
        if (rc > 0)
          NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + ro * es, rc, nccl_type(dtype), r, comm_,
                              stream_));
        so += sc;
        ro += rc;
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  Request ibroadcast(void* buf, size_t count, DType dtype, int root) override {
    check_rank(root, "broadcast root");
    return enqueue({"broadcast", count * dtype_size(dtype), {}}, [&] {
      NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_));
    });
  }

  Request isend(const void* buf, size_t count, DType dtype, int peer, int tag) override {
    return ibatch({P2POp::send(buf, count, dtype, peer, tag)});
  }
  Request irecv(void* buf, size_t count, DType dtype, int peer, int tag) override {
    return ibatch({P2POp::recv(buf, count, dtype, peer, tag)});
  }

  Request ibatch(const std::vector<P2POp>& ops) override {
    OpDesc desc;
    for (const P2POp& op : ops) {
      check_rank(op.peer, op.kind == P2POp::Kind::kSend ? "send peer" : "recv peer");
      desc.peers.push_back({op.kind == P2POp::Kind::kSend,
                            world_ranks_[static_cast<size_t>(op.peer)],
                            op.count * dtype_size(op.dtype), op.what});
    }
    // One NCCL group: sends and receives progress together, so their order cannot deadlock.
    return enqueue(std::move(desc), [&] {
      NCCL_CHECK(ncclGroupStart());
      for (const P2POp& op : ops) {
        if (op.count == 0) continue;  // both sides know the count, so both skip it
        if (op.kind == P2POp::Kind::kSend) {
          NCCL_CHECK(ncclSend(op.buf, op.count, nccl_type(op.dtype), op.peer, comm_, stream_));
        } else {
          NCCL_CHECK(ncclRecv(op.buf, op.count, nccl_type(op.dtype), op.peer, comm_, stream_));
        }
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  void barrier() override {
    auto done = enqueue_event({"barrier", 0, {}}, [&] {
      NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_));
    });
    poll_until([&done] { return done->done(); }, timeout_s_,
               [this] { return describe_collective("barrier", name_, size_, 0); });
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    if (host_ == MPI_COMM_NULL) {  // one rank without MPI: the only possible group is itself
      if (color < 0) return nullptr;
      return std::make_unique<NcclCommunicator>(MPI_COMM_NULL, 0, 1, world_ranks_, name,
                                                timeout_s_);
    }
    MPI_Comm out = detail::mpi_split(host_, color, key, timeout_s_,
                                     "split of group " + name_ + " into group " + name);
    if (out == MPI_COMM_NULL) return nullptr;
    int r = 0, n = 0;
    MPI_CHECK(MPI_Comm_rank(out, &r));
    MPI_CHECK(MPI_Comm_size(out, &n));
    return std::make_unique<NcclCommunicator>(out, r, n, detail::mpi_world_ranks(out), name,
                                              timeout_s_);
  }

 private:
  template <class Launch>
  std::shared_ptr<Event> enqueue_event(OpDesc desc, Launch&& launch) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaEventRecord(ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    launch();
    auto done = std::make_shared<Event>();
    CUDA_CHECK(cudaEventRecord(done->get(), stream_));
    NcclWatchdog::get().track(comm_, done, name_, size_, std::move(desc), timeout_s_);
    return done;
  }
  template <class Launch>
  Request enqueue(OpDesc desc, Launch&& launch) {
    return Request(std::make_unique<NcclRequest>(
        enqueue_event(std::move(desc), std::forward<Launch>(launch)), compute_));
  }
  // An uneven collective as one NCCL group of a call per rank r with counts[r] > 0 elements
  // (`offset`: the elements of the ranks before r), of `es` bytes each.
  template <class PerRank>
  Request enqueue_per_rank(const char* op, const std::vector<size_t>& counts, size_t es,
                           PerRank&& per_rank) {
    check_counts(counts, op);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    return enqueue({op, total * es, {}}, [&] {
      NCCL_CHECK(ncclGroupStart());
      size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        if (counts[r] > 0) per_rank(r, offset);
        offset += counts[r];
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  MPI_Comm host_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;   // this group's communication stream
  cudaStream_t compute_ = nullptr;  // the caller's compute stream (legacy default until set)
  cudaEvent_t ready_ = nullptr;     // re-recorded per operation: a wait captures the record
  int32_t* barrier_buf_ = nullptr;  // (1) device scratch for barrier()
};

}  // namespace

namespace detail {

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return n;
}

std::unique_ptr<Communicator> make_nccl_world_communicator(double timeout_s) {
  const World& w = world();
  const int devices = cuda_device_count();
  STRATA_CHECK(devices > 0, "the NCCL backend needs a CUDA device; host " << w.host << " has none");
  STRATA_CHECK(w.local_size <= devices, w.local_size << " ranks on host " << w.host << " share "
                                                     << devices
                                                     << " CUDA devices; NCCL needs one device "
                                                        "per rank");
  MPI_Comm host = w.mpi ? mpi_dup_world(timeout_s) : MPI_COMM_NULL;
  std::vector<int> ranks(static_cast<size_t>(w.size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return std::make_unique<NcclCommunicator>(host, w.rank, w.size, std::move(ranks), "world",
                                            timeout_s);
}

}  // namespace detail
}  // namespace strata
