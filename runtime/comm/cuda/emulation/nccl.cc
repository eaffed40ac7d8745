// nccl.cc (emulation build) — the NCCL calls runtime/comm/cuda/comm_nccl.cc makes, carried out over
// MPI, so that the NCCL communicator, its stream and event ordering and its watchdog run in CI
// on ranks that each hold an emulated device (STRATA_EMULATED_DEVICES, kernels/cuda/emulation/
// runtime.cc). Not a general NCCL: the subset Strata uses, with NCCL's contract for it.
//
//   ncclGetUniqueId      the id names the world rank that made it and a serial number
//   ncclCommInitRank     every member tells the id's maker its world rank (MPI_COMM_WORLD, a tag
//                        from the serial); the maker answers with the group's world ranks in rank
//                        order, and the members make an MPI communicator of them
//                        (MPI_Comm_create_group, collective over the members only)
//   collectives, p2p     the matching non-blocking MPI operation on that communicator, enqueued on
//                        the call's stream as pending work (async.h): an event recorded on the
//                        stream after it completes with it, and a stream that waits for that
//                        event waits for it
//   ncclGroupStart/End   the calls between them are one unit on their stream
//   stream order         a unit starts (posts its MPI operations) once everything before it on
//                        its stream has completed, as on a GPU: a send whose receive is not
//                        posted holds up its stream (MPI's rendezvous for all but small
//                        messages, like NCCL's, whose buffers take only small ones)
//
// As in NCCL, the buffers must be device memory (a host pointer is ncclInvalidArgument), in-place
// means sendbuff == recvbuff (all-gather and reduce-scatter: the rank's slice of the larger
// buffer), bf16 sums round to bf16 after each step, point-to-point messages between two ranks
// match in posting order, and operations on one communicator must be issued in the same order on
// every rank (MPI's rule for collectives too).
//
// MPI is initialised MPI_THREAD_FUNNELED: only the thread that created the first communicator
// calls MPI. The watchdog thread's event queries get the completion that thread last saw; that
// thread tests every operation in flight at each NCCL call, each kernel launch and while it waits.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/emulation/async.h"
#include "runtime/comm/comm_mpi.h"
#include "runtime/comm/watchdog.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  bool aborted = false;
  std::string last_error;
};

namespace {

using strata::DType;
using strata::ReduceOp;
namespace emu = strata::cuda_emulation;

constexpr uint32_t kIdMagic = 0x4e43454d;  // "MECN"
// The init exchange's tag is kInitTagBase + 2 * (serial % kInitTags); MPI_Comm_create_group's is
// the next one, so that nothing it sends can match the exchange's receives.
constexpr int kInitTagBase = 0x4000;
constexpr int kInitTags = 4096;

struct IdContents {
  uint32_t magic;
  int32_t maker;  // world rank of the ncclGetUniqueId caller
  uint64_t serial;
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "fits in an ncclUniqueId");

std::string g_last_error;                   // ncclGetLastError(nullptr)
std::atomic<std::thread::id> g_mpi_thread;  // the thread that may call MPI
uint64_t g_serial = 0;

bool on_mpi_thread() {
  return std::this_thread::get_id() == g_mpi_thread.load();
}

ncclResult_t error(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  g_last_error = "NCCL emulation: " + what;
  if (comm != nullptr) comm->last_error = g_last_error;
  return r;
}

// One NCCL call: how to start it (posting its MPI request) and what to do once it completes.
struct Op {
  std::function<void(Op&)> start;  // fills request
  std::function<void(Op&)> then;   // once the request completes (may be empty)
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<char> scratch;  // where a result lands before `then` moves it
};

// The operations of one NCCL group (or one call outside a group): the unit a stream runs. It
// starts once everything before it on its stream has completed, all its operations together,
// and completes when all of them have. That is NCCL's semantics on a stream — a send that no
// receive matches yet holds up everything behind it on its stream — which is what makes a
// schedule that only works with buffered sends hang here, as it would on GPUs.
class Group final : public emu::PendingWork {
 public:
  std::vector<Op> ops;
  cudaStream_t stream = nullptr;

  void start() {
    for (Op& op : ops) op.start(op);
    started_ = true;
  }
  // Tests its requests (MPI thread, once started); true once all have completed.
  bool poll() {
    if (done_.load()) return true;
    if (!started_ || !on_mpi_thread()) return false;
    for (Op& op : ops) {
      if (op.request == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_CHECK(MPI_Test(&op.request, &flag, MPI_STATUS_IGNORE));
      if (flag == 0) return false;
    }
    for (Op& op : ops)
      if (op.then) op.then(op);
    done_.store(true);
    return true;
  }
  bool test() override;
  void wait() override;

 private:
  bool started_ = false;
  std::atomic<bool> done_{false};
};

// Per stream, its groups not yet completed in order; the first is the one started. MPI thread
// only.
std::map<cudaStream_t, std::deque<std::shared_ptr<Group>>> g_streams;
std::shared_ptr<Group> g_open_group;  // between ncclGroupStart and ncclGroupEnd
int g_group_depth = 0;

// Completes what has completed and starts what may start, on every stream (MPI moves data
// only inside its calls, so this runs at every NCCL call, kernel launch and wait).
void progress() {
  if (!on_mpi_thread()) return;
  for (auto it = g_streams.begin(); it != g_streams.end();) {
    auto& queue = it->second;
    while (!queue.empty() && queue.front()->poll()) {
      queue.pop_front();
      if (!queue.empty()) queue.front()->start();
    }
    it = queue.empty() ? g_streams.erase(it) : std::next(it);
  }
}

void submit(const std::shared_ptr<Group>& g) {
  auto& queue = g_streams[g->stream];
  queue.push_back(g);
  emu::enqueue(g->stream, g);
  if (queue.size() == 1) g->start();
  progress();
}

bool Group::test() {
  if (poll()) return true;
  progress();
  return poll();
}

void Group::wait() {
  while (!test()) strata::poll_pause();
}

bool type_of(ncclDataType_t t, DType* out) {
  switch (t) {
    case ncclFloat32:
      *out = DType::kF32;
      return true;
    case ncclInt32:
      *out = DType::kI32;
      return true;
    case ncclBfloat16:
      *out = DType::kBF16;
      return true;
    default:
      return false;
  }
}

// The checks NCCL makes before it enqueues anything, then the MPI datatype and operation.
struct Call {
  ncclComm_t comm;
  const char* name;
  ncclResult_t status = ncclSuccess;
  DType dtype = DType::kF32;
  MPI_Datatype mpi_type = MPI_DATATYPE_NULL;
  MPI_Op mpi_op = MPI_OP_NULL;
  int count = 0;
  size_t bytes = 0;  // of `count` elements

  Call(ncclComm_t c, const char* n, size_t elements, ncclDataType_t t, ncclRedOp_t op = ncclNumOps)
      : comm(c), name(n) {
    progress();
    if (comm == nullptr) {
      fail(ncclInvalidArgument, "comm is NULL");
      return;
    }
    if (comm->aborted) {
      fail(ncclInvalidUsage, "the communicator was aborted");
      return;
    }
    if (!type_of(t, &dtype)) {
      fail(ncclInvalidArgument, "datatype " + std::to_string(t) + " is not emulated");
      return;
    }
    if (elements > static_cast<size_t>(INT_MAX)) {
      fail(ncclInvalidArgument, "count " + std::to_string(elements) + " above INT_MAX");
      return;
    }
    count = static_cast<int>(elements);
    bytes = elements * strata::dtype_size(dtype);
    mpi_type = strata::detail::mpi_type(dtype);
    if (op != ncclNumOps) {
      if (op != ncclSum && op != ncclMax) {
        fail(ncclInvalidArgument, "reduction " + std::to_string(op) + " is not emulated");
        return;
      }
      mpi_op = strata::detail::mpi_op(op == ncclSum ? ReduceOp::kSum : ReduceOp::kMax, dtype);
    }
  }

  bool ok() const { return status == ncclSuccess; }
  void fail(ncclResult_t r, const std::string& what) {
    status = error(r, comm, std::string(name) + ": " + what);
  }
  // A buffer of `n` bytes the call reads or writes must be device memory.
  void device(const void* p, size_t n, const char* which) {
    if (ok() && n > 0 && !emu::is_device_memory(p, n))
      fail(ncclInvalidArgument, std::string(which) + " is not " + std::to_string(n) +
                                    " bytes of device memory (cudaMalloc)");
  }
  void rank(int r, const char* which) {
    if (ok() && (r < 0 || r >= comm->size))
      fail(ncclInvalidArgument, std::string(which) + " " + std::to_string(r) + " of " +
                                    std::to_string(comm->size) + " ranks");
  }

  // Adds the operation (`start` fills op.request) to the open group, or submits it as a group
  // of its own on `stream`.
  ncclResult_t post(cudaStream_t stream, std::function<void(Op&)> start,
                    std::function<void(Op&)> then = {}) {
    if (!ok()) return status;
    std::shared_ptr<Group> g = g_open_group;
    if (!g) {
      g = std::make_shared<Group>();
      g->stream = stream;
    } else if (g->ops.empty()) {
      g->stream = stream;
    } else if (g->stream != stream) {
      fail(ncclInvalidUsage, "a group's operations on two streams is not emulated");
      return status;
    }
    Op op;
    op.start = std::move(start);
    op.then = std::move(then);
    g->ops.push_back(std::move(op));
    if (!g_open_group) submit(g);
    return ncclSuccess;
  }
};

void* in_place(const void* send, const void* recv) {
  return send == recv ? MPI_IN_PLACE : const_cast<void*>(send);
}

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised)
    return error(ncclSystemError, nullptr, "ncclGetUniqueId: runs over MPI, not initialised");
  if (id == nullptr) return error(ncclInvalidArgument, nullptr, "ncclGetUniqueId: id is NULL");
  IdContents c{kIdMagic, 0, g_serial++};
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c.maker));
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, &c, sizeof c);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr) return error(ncclInvalidArgument, nullptr, "ncclCommInitRank: comm is NULL");
  *out = nullptr;
  IdContents c;
  std::memcpy(&c, id.internal, sizeof c);
  if (c.magic != kIdMagic)
    return error(ncclInvalidArgument, nullptr, "ncclCommInitRank: not an ncclGetUniqueId id");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return error(
        ncclInvalidArgument, nullptr,
        "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  g_mpi_thread.store(std::this_thread::get_id());
  emu::set_progress_hook(&progress);

  int me = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
  const int tag = kInitTagBase + 2 * static_cast<int>(c.serial % kInitTags);
  // The group's world ranks in group-rank order, gathered by the id's maker (group rank 0 here,
  // though NCCL does not require it: the maker is whoever holds world rank c.maker).
  std::vector<int> members(static_cast<size_t>(nranks), -1);
  if (me == c.maker) {
    members[static_cast<size_t>(rank)] = me;
    for (int i = 0; i < nranks - 1; ++i) {
      int pair[2];  // group rank, world rank
      MPI_CHECK(MPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      if (pair[0] < 0 || pair[0] >= nranks || members[static_cast<size_t>(pair[0])] != -1)
        return error(ncclInvalidUsage, nullptr,
                     "ncclCommInitRank: group rank " + std::to_string(pair[0]) +
                         " claimed twice or out of range");
      members[static_cast<size_t>(pair[0])] = pair[1];
    }
    for (int r = 0; r < nranks; ++r) {
      if (r == rank) continue;
      MPI_CHECK(MPI_Send(members.data(), nranks, MPI_INT, members[static_cast<size_t>(r)], tag,
                         MPI_COMM_WORLD));
    }
  } else {
    int pair[2] = {rank, me};
    MPI_CHECK(MPI_Send(pair, 2, MPI_INT, c.maker, tag, MPI_COMM_WORLD));
    MPI_CHECK(
        MPI_Recv(members.data(), nranks, MPI_INT, c.maker, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
  }
  MPI_Group world_group, group;
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  MPI_CHECK(MPI_Group_incl(world_group, nranks, members.data(), &group));
  auto comm = std::make_unique<ncclComm>();
  MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, group, tag + 1, &comm->mpi));
  MPI_CHECK(MPI_Group_free(&group));
  MPI_CHECK(MPI_Group_free(&world_group));
  MPI_CHECK(MPI_Comm_set_errhandler(comm->mpi, MPI_ERRORS_RETURN));
  comm->rank = rank;
  comm->size = nranks;
  *out = comm.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !comm->aborted) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

// Operations in flight are abandoned, as an abort abandons its kernels; the job is ending.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm != nullptr) comm->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr)
    return error(ncclInvalidArgument, comm, "ncclCommGetAsyncError: NULL argument");
  *async_error = ncclSuccess;  // MPI errors end the job at the call that meets them
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm != nullptr ? comm->last_error.c_str() : g_last_error.c_str();
}

ncclResult_t ncclGroupStart() {
  progress();
  if (g_group_depth++ == 0) g_open_group = std::make_shared<Group>();
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return error(ncclInvalidUsage, nullptr, "ncclGroupEnd: no group open");
  if (--g_group_depth == 0) {
    std::shared_ptr<Group> g = std::move(g_open_group);
    g_open_group.reset();
    if (!g->ops.empty()) submit(g);
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  Call call(comm, "ncclAllReduce", count, type, op);
  call.device(send, call.bytes, "sendbuff");
  call.device(recv, call.bytes, "recvbuff");
  return call.post(stream, [=](Op& o) {
    MPI_CHECK(MPI_Iallreduce(in_place(send, recv), recv, call.count, call.mpi_type, call.mpi_op,
                             comm->mpi, &o.request));
  });
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  Call call(comm, "ncclReduce", count, type, op);
  call.rank(root, "root");
  call.device(send, call.bytes, "sendbuff");
  const bool is_root = call.ok() && comm->rank == root;
  if (is_root) call.device(recv, call.bytes, "recvbuff");  // used on the root only
  return call.post(stream, [=](Op& o) {
    MPI_CHECK(MPI_Ireduce(is_root ? in_place(send, recv) : send, is_root ? recv : nullptr,
                          call.count, call.mpi_type, call.mpi_op, root, comm->mpi, &o.request));
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  Call call(comm, "ncclBroadcast", count, type);
  call.rank(root, "root");
  const bool is_root = call.ok() && comm->rank == root;
  if (is_root) call.device(send, call.bytes, "sendbuff");  // read on the root only
  call.device(recv, call.bytes, "recvbuff");
  return call.post(stream, [=](Op& o) {
    if (is_root && send != recv) std::memcpy(recv, send, call.bytes);
    MPI_CHECK(MPI_Ibcast(recv, call.count, call.mpi_type, root, comm->mpi, &o.request));
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  Call call(comm, "ncclAllGather", send_count, type);
  call.device(send, call.bytes, "sendbuff");
  if (call.ok()) call.device(recv, call.bytes * static_cast<size_t>(comm->size), "recvbuff");
  return call.post(stream, [=](Op& o) {
    // In place: sendbuff is this rank's slice of recvbuff, which is MPI's in-place too.
    const bool own_slice =
        send == static_cast<const char*>(recv) + static_cast<size_t>(comm->rank) * call.bytes;
    MPI_CHECK(MPI_Iallgather(own_slice ? MPI_IN_PLACE : send, call.count, call.mpi_type, recv,
                             call.count, call.mpi_type, comm->mpi, &o.request));
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  Call call(comm, "ncclReduceScatter", recv_count, type, op);
  if (call.ok()) call.device(send, call.bytes * static_cast<size_t>(comm->size), "sendbuff");
  call.device(recv, call.bytes, "recvbuff");
  if (!call.ok()) return call.status;
  // In place (recvbuff is this rank's slice of sendbuff) MPI would read recvbuff: the result
  // goes to scratch and moves into place once complete.
  const char* lo = static_cast<const char*>(send);
  const char* at = static_cast<const char*>(recv);
  const bool overlaps =
      at < lo + call.bytes * static_cast<size_t>(comm->size) && lo < at + call.bytes;
  const size_t bytes = call.bytes;
  auto start = [=](Op& o) {
    void* dst = recv;
    if (overlaps) {
      o.scratch.resize(bytes);
      dst = o.scratch.data();
    }
    MPI_CHECK(MPI_Ireduce_scatter_block(send, dst, call.count, call.mpi_type, call.mpi_op,
                                        comm->mpi, &o.request));
  };
  if (!overlaps) return call.post(stream, start);
  return call.post(stream, start,
                   [recv, bytes](Op& o) { std::memcpy(recv, o.scratch.data(), bytes); });
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  Call call(comm, "ncclSend", count, type);
  call.rank(peer, "peer");
  call.device(send, call.bytes, "sendbuff");
  return call.post(stream, [=](Op& o) {
    MPI_CHECK(MPI_Isend(send, call.count, call.mpi_type, peer, 0, comm->mpi, &o.request));
  });
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  Call call(comm, "ncclRecv", count, type);
  call.rank(peer, "peer");
  call.device(recv, call.bytes, "recvbuff");
  return call.post(stream, [=](Op& o) {
    MPI_CHECK(MPI_Irecv(recv, call.count, call.mpi_type, peer, 0, comm->mpi, &o.request));
  });
}

}  // extern "C"
