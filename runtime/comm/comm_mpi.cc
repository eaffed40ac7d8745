// comm_mpi.cc — the MPI backend (host buffers) and MPI start-up / shut-down.
//
// Every operation is started with its non-blocking MPI call (MPI_Iallreduce, MPI_Isend, ...) and
// completed by polling MPI_Testall against the watchdog deadline (watchdog.h), yielding the core
// between polls when ranks are oversubscribed: MPI itself has no timeout, and a blocking MPI call
// could hang forever. All-reduces run as a ring of MPI_Isend/MPI_Irecv steps instead
// (RingAllReduce) from 64 KiB, and at every size between 2 ranks: there Open MPI's MPI_Iallreduce
// is up to twice as slow as its blocking MPI_Allreduce. Each Communicator owns a duplicate or
// split of MPI_COMM_WORLD, so its traffic never matches another group's, and sets
// MPI_ERRORS_RETURN so that MPI_CHECK reports errors with context.
//
// Progress: MPI moves a started operation only inside MPI calls. A non-blocking all_reduce started
// during the backward pass advances whenever any MPI call runs on this rank (Request::test() is the
// cheapest) and completes at the latest in wait().
#include "runtime/comm/comm_mpi.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>

#include "kernels/cpu/precision.h"
#include "runtime/base/abort_hook.h"
#include "runtime/comm/watchdog.h"

namespace strata {
namespace detail {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kBF16:
      return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

using kernels::cpu::bf16_to_f32;
using kernels::cpu::f32_to_bf16;

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
  }
}

namespace {
MPI_Op g_bf16_sum = MPI_OP_NULL;
MPI_Op g_bf16_max = MPI_OP_NULL;
}  // namespace

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::kBF16) {
    MPI_Op& slot = op == ReduceOp::kSum ? g_bf16_sum : g_bf16_max;
    if (slot == MPI_OP_NULL) {
      MPI_CHECK(MPI_Op_create(op == ReduceOp::kSum ? &bf16_sum : &bf16_max, /*commute=*/1, &slot));
    }
    return slot;
  }
  return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
}

}  // namespace detail

namespace {

using detail::mpi_op;
using detail::mpi_type;

int to_int(size_t n, const char* what, const std::string& group) {
  STRATA_CHECK(n <= static_cast<size_t>(INT_MAX),
               what << " of " << n << " elements on group " << group
                    << " exceeds the MPI count limit of " << INT_MAX);
  return static_cast<int>(n);
}

// One send or receive of a request, for the watchdog message.
struct PeerDesc {
  bool send;
  int peer_world;
  size_t bytes;
  std::string what;
};

// A started MPI operation: one or more MPI requests completed together.
class MpiRequest final : public detail::RequestImpl {
 public:
  std::vector<MPI_Request> reqs;
  std::vector<int> ints;     // counts and displacements of v-collectives: read by MPI until done
  const char* op = nullptr;  // collective name; nullptr for point-to-point
  std::string group;
  int group_size = 0;
  size_t bytes = 0;             // collectives
  std::vector<PeerDesc> peers;  // point-to-point, parallel to reqs
  double timeout_s = 0;

  bool test() override {
    int done = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
    return done != 0;
  }
  void wait() override {
    poll_until([this] { return test(); }, timeout_s, [this] { return describe(); });
  }

 private:
  std::string describe() const {
    if (op != nullptr) return describe_collective(op, group, group_size, bytes);
    // Name only what is still pending: in a batch, the stuck peer is the useful fact.
    std::string out;
    for (size_t i = 0; i < reqs.size(); ++i) {
      int done = 0;
      MPI_Request r = reqs[i];
      if (MPI_Request_get_status(r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) continue;
      if (!out.empty()) out += "; ";
      out += describe_p2p(peers[i].send, peers[i].peer_world, group, peers[i].bytes, peers[i].what);
    }
    return out.empty() ? "point-to-point (group " + group + ")" : out;
  }
};

// acc[i] = op(in[i], acc[i]) for n elements, with MPI's own reduction kernels (Open MPI's are
// vectorised for the CPU it runs on, which a portable build of ours is not).
void reduce_into(void* acc, const void* in, size_t n, DType t, ReduceOp op) {
  for (size_t done = 0; done < n;) {
    const int len = static_cast<int>(std::min<size_t>(n - done, INT_MAX));
    const size_t skip = done * dtype_size(t);
    MPI_CHECK(MPI_Reduce_local(static_cast<const char*>(in) + skip, static_cast<char*>(acc) + skip,
                               len, mpi_type(t), mpi_op(op, t)));
    done += static_cast<size_t>(len);
  }
}

// Scratch buffers of ring all-reduces, kept by their communicator and reused: allocating and
// zero-filling the scratch on every call would cost as much as a 1 MiB all-reduce itself.
class ScratchPool {
 public:
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t bytes = 0;
  };
  Buffer take(size_t bytes) {
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes >= bytes) {
        Buffer b = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    }
    return Buffer{std::unique_ptr<char[]>(new char[bytes]), bytes};  // uninitialised on purpose
  }
  void give(Buffer b) {
    if (b.data) free_.push_back(std::move(b));
  }

 private:
  std::vector<Buffer> free_;  // one per ring all-reduce that was in flight at the same time
};

// All-reduce of large messages as a ring (reduce-scatter, then all-gather: 2 (p - 1) steps, each
// sending one chunk of about count / p elements to the next rank and receiving one from the
// previous). Open MPI's non-blocking MPI_Iallreduce reduces large messages to a root and
// broadcasts them back (its binomial algorithm, chosen for p < 4 and for in-place calls), about
// half the speed of its blocking MPI_Allreduce; the ring moves 2 (p - 1) / p of the data per
// rank, the least any algorithm can. Every chunk is reduced in one fixed order along the ring and
// then copied to all ranks, so every rank ends with bitwise the same result.
//
// In reduce-scatter steps the incoming chunk arrives in segments through two scratch slots, and
// segment j is reduced while segment j + 1 arrives. Chunks up to kSmallChunkBytes come in two
// halves (every extra message costs a rendezvous); larger ones, whose buffers no longer fit in
// the last-level cache together, in kSegmentBytes pieces so that the scratch stays in the core's
// own cache and the reduction reads it from there (measured with bench_comm: at 16 MiB and 2
// ranks, 256 KiB segments take 0.75x the time of 1 MiB ones; at 4 MiB, halves take 0.7x the time
// of 256 KiB segments).
//
// The steps advance inside test() (and so inside wait()): each completed step starts the next.
// Its messages travel on the communicator's private collective communicator with a tag of their
// own, so they match neither user point-to-point traffic nor another all-reduce in flight.
class RingAllReduce final : public detail::RequestImpl {
 public:
  static constexpr size_t kSegmentBytes = size_t{256} << 10;
  static constexpr size_t kSmallChunkBytes = size_t{4} << 20;

  // Elements per reduce-scatter segment for a largest chunk of `chunk` elements of `es` bytes.
  static size_t segment_elems(size_t chunk, size_t es) {
    if (chunk * es <= kSmallChunkBytes) return std::max<size_t>(1, (chunk + 1) / 2);
    return kSegmentBytes / es;
  }

  RingAllReduce(MPI_Comm comm, std::shared_ptr<ScratchPool> pool, int rank, int size, int tag,
                void* buf, size_t count, DType dtype, ReduceOp op, std::string group,
                int prev_world_rank, int next_world_rank, double timeout_s)
      : comm_(comm),
        pool_(std::move(pool)),
        rank_(rank),
        size_(size),
        tag_(tag),
        buf_(static_cast<char*>(buf)),
        dtype_(dtype),
        op_(op),
        es_(dtype_size(dtype)),
        counts_(chunk_counts(count, size)),
        seg_(segment_elems(counts_[0], es_)),
        offsets_(counts_.size(), 0),
        bytes_(count * es_),
        group_(std::move(group)),
        prev_world_rank_(prev_world_rank),
        next_world_rank_(next_world_rank),
        timeout_s_(timeout_s) {
    for (size_t k = 1; k < counts_.size(); ++k) offsets_[k] = offsets_[k - 1] + counts_[k - 1];
    tmp_ = pool_->take(2 * slot_elems() * es_);
    post_step();
  }
  ~RingAllReduce() override { pool_->give(std::move(tmp_)); }

  bool test() override {
    while (step_ < steps()) {
      int done = 0;
      if (reducing()) {
        const int kr = recv_chunk();
        const size_t n_seg = segments(counts_[kr]);
        while (reduced_ < n_seg) {
          const size_t slot = reduced_ % 2;
          MPI_CHECK(MPI_Test(&recvs_[slot], &done, MPI_STATUS_IGNORE));
          if (!done) return false;
          const size_t first = reduced_ * seg_;
          reduce_into(buf_ + (offsets_[kr] + first) * es_, slot_ptr(slot),
                      std::min(seg_, counts_[kr] - std::min(first, counts_[kr])), dtype_, op_);
          if (reduced_ + 2 < n_seg) post_recv_segment(reduced_ + 2);
          ++reduced_;
        }
      } else {
        MPI_CHECK(MPI_Test(&recvs_[0], &done, MPI_STATUS_IGNORE));
        if (!done) return false;
      }
      MPI_CHECK(
          MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE));
      if (!done) return false;
      ++step_;
      if (step_ < steps()) post_step();
    }
    return true;
  }

  void wait() override {
    poll_until([this] { return test(); }, timeout_s_,
               [this] {
                 std::ostringstream os;
                 os << describe_collective("all_reduce", group_, size_, bytes_) << ", ring step "
                    << step_ + 1 << " of " << steps() << ": recv from world rank "
                    << prev_world_rank_ << ", send to world rank " << next_world_rank_;
                 return os.str();
               });
  }

 private:
  int steps() const { return 2 * (size_ - 1); }
  bool reducing() const { return step_ < size_ - 1; }
  int mod(int k) const { return ((k % size_) + size_) % size_; }
  size_t segments(size_t n) const { return n == 0 ? 1 : (n + seg_ - 1) / seg_; }
  size_t slot_elems() const { return std::min(seg_, counts_[0]); }  // chunk 0 is the largest
  char* slot_ptr(size_t slot) { return tmp_.data.get() + slot * slot_elems() * es_; }
  // Reduce-scatter step s sends chunk r - s and receives chunk r - s - 1 (afterwards rank r holds
  // chunk r + 1 fully reduced); all-gather step s sends chunk r + 1 - s and receives chunk r - s.
  int send_chunk() const {
    return reducing() ? mod(rank_ - step_) : mod(rank_ + 1 - (step_ - (size_ - 1)));
  }
  int recv_chunk() const {
    return reducing() ? mod(rank_ - step_ - 1) : mod(rank_ - (step_ - (size_ - 1)));
  }

  void post_recv_segment(size_t j) {
    const int kr = recv_chunk();
    const size_t first = std::min(j * seg_, counts_[kr]);
    const size_t n = std::min(seg_, counts_[kr] - first);
    MPI_CHECK(MPI_Irecv(slot_ptr(j % 2), static_cast<int>(n), mpi_type(dtype_),
                        (rank_ + size_ - 1) % size_, tag_, comm_, &recvs_[j % 2]));
  }

  void post_step() {
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const int ks = send_chunk(), kr = recv_chunk();
    const MPI_Datatype t = mpi_type(dtype_);
    if (reducing()) {
      // The receiver reduces segment by segment, so the sender cuts the chunk the same way.
      reduced_ = 0;
      for (size_t j = 0; j < std::min<size_t>(2, segments(counts_[kr])); ++j) post_recv_segment(j);
      const size_t n_seg = segments(counts_[ks]);
      sends_.assign(n_seg, MPI_REQUEST_NULL);
      for (size_t j = 0; j < n_seg; ++j) {
        const size_t first = std::min(j * seg_, counts_[ks]);
        MPI_CHECK(MPI_Isend(buf_ + (offsets_[ks] + first) * es_,
                            static_cast<int>(std::min(seg_, counts_[ks] - first)), t, next, tag_,
                            comm_, &sends_[j]));
      }
    } else {
      MPI_CHECK(MPI_Irecv(buf_ + offsets_[kr] * es_, static_cast<int>(counts_[kr]), t, prev, tag_,
                          comm_, &recvs_[0]));
      sends_.assign(1, MPI_REQUEST_NULL);
      MPI_CHECK(MPI_Isend(buf_ + offsets_[ks] * es_, static_cast<int>(counts_[ks]), t, next, tag_,
                          comm_, &sends_[0]));
    }
  }

  MPI_Comm comm_;
  std::shared_ptr<ScratchPool> pool_;
  int rank_, size_, tag_;
  char* buf_;
  DType dtype_;
  ReduceOp op_;
  size_t es_;
  std::vector<size_t> counts_;   // [chunk] elements
  size_t seg_;                   // elements per reduce-scatter segment
  std::vector<size_t> offsets_;  // [chunk] first element
  size_t bytes_;
  std::string group_;
  int prev_world_rank_, next_world_rank_;  // the ring's neighbours, for the watchdog's line
  double timeout_s_;
  ScratchPool::Buffer tmp_;  // two slots of one segment: incoming data of reduce-scatter steps
  MPI_Request recvs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // [slot]
  std::vector<MPI_Request> sends_;
  int step_ = 0;
  size_t reduced_ = 0;  // segments of this reduce-scatter step reduced so far
};

class MpiCommunicator final : public GroupCommunicator {
 public:
  // Takes ownership of `comm`.
  MpiCommunicator(MPI_Comm comm, std::string name, double timeout_s)
      : GroupCommunicator(std::move(name), timeout_s), comm_(comm) {
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    world_ranks_ = detail::mpi_world_ranks(comm_);
    MPI_Request r;
    MPI_CHECK(MPI_Comm_idup(comm_, &coll_, &r));
    detail::mpi_wait(&r, timeout_s_, describe_collective("create group", name_, size_, 0));
    MPI_CHECK(MPI_Comm_set_errhandler(coll_, MPI_ERRORS_RETURN));
    int* ub = nullptr;
    int found = 0;
    MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found));
    tag_ub_ = found && ub != nullptr ? *ub : 32767;  // 32767: the least the standard allows
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      MPI_Comm_free(&coll_);
      MPI_Comm_free(&comm_);
    }
  }

  CommBackend backend() const override { return CommBackend::kMPI; }
  Device device() const override { return Device::kCPU; }

  Request iall_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    if (count > 0 && size_ > 1 && (size_ == 2 || count * dtype_size(dtype) >= kRingMinBytes)) {
      to_int(count, "all_reduce", name_);
      const int tag = static_cast<int>(ring_seq_++ % static_cast<uint64_t>(tag_ub_));
      return Request(
          std::make_unique<RingAllReduce>(coll_, scratch_, rank_, size_, tag, buf, count, dtype, op,
                                          name_, world_rank_of((rank_ + size_ - 1) % size_),
                                          world_rank_of((rank_ + 1) % size_), timeout_s_));
    }
    auto r = collective("all_reduce", count * dtype_size(dtype));
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, to_int(count, "all_reduce", name_), mpi_type(dtype),
                             mpi_op(op, dtype), comm_, r->reqs.data()));
    return Request(std::move(r));
  }

  Request ireduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                          ReduceOp op) override {
    auto r = collective("reduce_scatter", recv_count * size_ * dtype_size(dtype));
    to_int(recv_count * size_, "reduce_scatter", name_);
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(recv_count), mpi_type(dtype),
                                        mpi_op(op, dtype), comm_, r->reqs.data()));
    return Request(std::move(r));
  }

  Request ireduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts,
                           DType dtype, ReduceOp op) override {
    check_counts(counts, "reduce_scatterv");
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    to_int(total, "reduce_scatterv", name_);
    auto r = collective("reduce_scatterv", total * dtype_size(dtype));
    r->ints.assign(counts.begin(), counts.end());
    MPI_CHECK(MPI_Ireduce_scatter(send, recv, r->ints.data(), mpi_type(dtype), mpi_op(op, dtype),
                                  comm_, r->reqs.data()));
    return Request(std::move(r));
  }

  Request iall_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    to_int(send_count * size_, "all_gather", name_);
    auto r = collective("all_gather", send_count * size_ * dtype_size(dtype));
    const char* mine = static_cast<const char*>(recv) + rank_ * send_count * dtype_size(dtype);
    const void* src = send == mine ? MPI_IN_PLACE : send;
    MPI_CHECK(MPI_Iallgather(src, static_cast<int>(send_count), mpi_type(dtype), recv,
                             static_cast<int>(send_count), mpi_type(dtype), comm_, r->reqs.data()));
    return Request(std::move(r));
  }

  Request iall_gatherv(const void* send, void* recv, const std::vector<size_t>& counts,
                       DType dtype) override {
    check_counts(counts, "all_gatherv");
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    to_int(total, "all_gatherv", name_);
    auto r = collective("all_gatherv", total * dtype_size(dtype));
    // ints = counts (size) then displacements (size), both read by MPI until completion.
    r->ints.resize(2 * static_cast<size_t>(size_));
    int offset = 0;
    for (int i = 0; i < size_; ++i) {
      r->ints[i] = static_cast<int>(counts[i]);
      r->ints[size_ + i] = offset;
      offset += static_cast<int>(counts[i]);
    }
    const char* mine = static_cast<const char*>(recv) + r->ints[size_ + rank_] * dtype_size(dtype);
    const void* src = send == mine ? MPI_IN_PLACE : send;
    MPI_CHECK(MPI_Iallgatherv(src, r->ints[rank_], mpi_type(dtype), recv, r->ints.data(),
                              r->ints.data() + size_, mpi_type(dtype), comm_, r->reqs.data()));
    return Request(std::move(r));
  }

  Request iall_to_allv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                       const std::vector<size_t>& recv_counts, DType dtype) override {
    check_counts(send_counts, "all_to_allv");
    check_counts(recv_counts, "all_to_allv");
    const size_t sent = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
    const size_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
    to_int(sent, "all_to_allv", name_);
    to_int(received, "all_to_allv", name_);
    auto r = collective("all_to_allv", std::max(sent, received) * dtype_size(dtype));
    // ints = send counts, send displacements, receive counts, receive displacements (size each),
    // read by MPI until completion.
    const size_t n = static_cast<size_t>(size_);
    r->ints.resize(4 * n);
    int so = 0, ro = 0;
    for (size_t i = 0; i < n; ++i) {
      r->ints[i] = static_cast<int>(send_counts[i]);
      r->ints[n + i] = so;
      r->ints[2 * n + i] = static_cast<int>(recv_counts[i]);
      r->ints[3 * n + i] = ro;
      so += r->ints[i];
      ro += r->ints[2 * n + i];
    }
    MPI_CHECK(MPI_Ialltoallv(send, r->ints.data(), r->ints.data() + n, mpi_type(dtype), recv,
                             r->ints.data() + 2 * n, r->ints.data() + 3 * n, mpi_type(dtype), comm_,
                             r->reqs.data()));
    return Request(std::move(r));
  }

  Request ibroadcast(void* buf, size_t count, DType dtype, int root) override {
    check_rank(root, "broadcast root");
    auto r = collective("broadcast", count * dtype_size(dtype));
    MPI_CHECK(MPI_Ibcast(buf, to_int(count, "broadcast", name_), mpi_type(dtype), root, comm_,
                         r->reqs.data()));
    return Request(std::move(r));
  }

  Request isend(const void* buf, size_t count, DType dtype, int peer, int tag) override {
    return ibatch({P2POp::send(buf, count, dtype, peer, tag)});
  }
  Request irecv(void* buf, size_t count, DType dtype, int peer, int tag) override {
    return ibatch({P2POp::recv(buf, count, dtype, peer, tag)});
  }

  Request ibatch(const std::vector<P2POp>& ops) override {
    auto r = std::make_unique<MpiRequest>();
    r->group = name_;
    r->group_size = size_;
    r->timeout_s = timeout_s_;
    r->reqs.resize(ops.size(), MPI_REQUEST_NULL);
    r->peers.resize(ops.size());
    // Receives are posted before sends so that arriving data finds its buffer.
    size_t k = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const P2POp::Kind kind = pass == 0 ? P2POp::Kind::kRecv : P2POp::Kind::kSend;
      for (const P2POp& op : ops) {
        if (op.kind != kind) continue;
        check_rank(op.peer, kind == P2POp::Kind::kSend ? "send peer" : "recv peer");
        const int n = to_int(op.count, kind == P2POp::Kind::kSend ? "send" : "recv", name_);
        r->peers[k] = {kind == P2POp::Kind::kSend, world_ranks_[static_cast<size_t>(op.peer)],
                       op.count * dtype_size(op.dtype), op.what};
        if (kind == P2POp::Kind::kSend) {
          MPI_CHECK(MPI_Isend(op.buf, n, mpi_type(op.dtype), op.peer, op.tag, comm_, &r->reqs[k]));
        } else {
          MPI_CHECK(MPI_Irecv(op.buf, n, mpi_type(op.dtype), op.peer, op.tag, comm_, &r->reqs[k]));
        }
        ++k;
      }
    }
    return Request(std::move(r));
  }

  void barrier() override {
    auto r = collective("barrier", 0);
    MPI_CHECK(MPI_Ibarrier(comm_, r->reqs.data()));
    r->wait();
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm out = detail::mpi_split(comm_, color, key, timeout_s_,
                                     "split of group " + name_ + " into group " + name);
    if (out == MPI_COMM_NULL) return nullptr;
    int n = 0;
    MPI_CHECK(MPI_Comm_size(out, &n));
    if (n == 1) {
      MPI_CHECK(MPI_Comm_free(&out));
      return detail::make_local_communicator(name, world_ranks_[static_cast<size_t>(rank_)],
                                             timeout_s_);
    }
    return std::make_unique<MpiCommunicator>(out, name, timeout_s_);
  }

 private:
  std::unique_ptr<MpiRequest> collective(const char* op, size_t bytes) const {
    auto r = std::make_unique<MpiRequest>();
    r->reqs.assign(1, MPI_REQUEST_NULL);
    r->op = op;
    r->group = name_;
    r->group_size = size_;
    r->bytes = bytes;
    r->timeout_s = timeout_s_;
    return r;
  }
  // Below this, a ring's 2 (p - 1) message latencies cost more than MPI's fewer, larger steps
  // (except with 2 ranks, where the ring has 2 steps and still beats MPI_Iallreduce 4x at 4 KiB).
  static constexpr size_t kRingMinBytes = size_t{64} << 10;

  MPI_Comm comm_;
  MPI_Comm coll_ = MPI_COMM_NULL;  // the same ranks, private to ring all-reduce messages
  int tag_ub_ = 32767;
  uint64_t ring_seq_ = 0;  // ring all-reduces started: the same sequence on every rank
  std::shared_ptr<ScratchPool> scratch_ = std::make_shared<ScratchPool>();
};

void mpi_abort_hook(int status) {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (initialised && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
}

// How long abort_job() leaves MPI_Abort to end this process (abort_hook.h): 2 s, unless the user
// asked Open MPI to keep an aborting process around (mpi_abort_delay, to attach a debugger).
double mpi_abort_grace_s() {
  for (const char* v : {"OMPI_MCA_opal_abort_delay", "OMPI_MCA_mpi_abort_delay"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && *s != '\0' && std::strcmp(s, "0") != 0) return 0;  // unbounded
  }
  return 2.0;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0') ? static_cast<int>(x) : fallback;
}

}  // namespace

namespace detail {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  int initialised = 0;
  MPI_Initialized(&initialised);
  return initialised != 0;
}

namespace {

// Test hook (docs/communication.md): STRATA_TEST_STOP_AFTER_INIT=1 makes world rank 1 SIGSTOP
// itself just after MPI_Init, as a rank that stops before the job gets going would.
void stop_hook(const World& w) {
  const char* s = std::getenv("STRATA_TEST_STOP_AFTER_INIT");
  if (s && std::strcmp(s, "1") == 0 && w.rank == 1) ::raise(SIGSTOP);
}

// Every rank reports to world rank 0, which answers once all have: the end of start-up, with
// the missing ranks named on rank 0 if some never arrive (MPI_Init's own wait cannot say which).
void join_world(const World& w, double timeout_s) {
  if (w.size == 1) return;
  constexpr int kTag = 7001;  // MPI_COMM_WORLD carries nothing else of ours
  const size_t n = static_cast<size_t>(w.size);
  std::vector<int> tokens(n, 0);
  std::vector<MPI_Request> reqs;
  if (w.rank == 0) {
    reqs.resize(n - 1);
    for (int r = 1; r < w.size; ++r)
      MPI_CHECK(MPI_Irecv(&tokens[static_cast<size_t>(r)], 1, MPI_INT, r, kTag, MPI_COMM_WORLD,
                          &reqs[static_cast<size_t>(r) - 1]));
    std::vector<int> arrived(n - 1, 0);
    poll_until(
        [&] {
          bool all = true;
          for (size_t i = 0; i < reqs.size(); ++i) {
            if (!arrived[i]) MPI_CHECK(MPI_Test(&reqs[i], &arrived[i], MPI_STATUS_IGNORE));
            all = all && arrived[i];
          }
          return all;
        },
        timeout_s,
        [&] {
          std::string missing;
          for (size_t i = 0; i < arrived.size(); ++i)
            if (!arrived[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(i + 1);
          return "start-up: world rank(s) " + missing + " of " + std::to_string(w.size) +
                 " did not arrive (stopped, or never started)";
        });
    for (int r = 1; r < w.size; ++r)
      MPI_CHECK(MPI_Isend(&tokens[0], 1, MPI_INT, r, kTag, MPI_COMM_WORLD,
                          &reqs[static_cast<size_t>(r) - 1]));
  } else {
    reqs.resize(2);
    MPI_CHECK(MPI_Isend(&tokens[0], 1, MPI_INT, 0, kTag, MPI_COMM_WORLD, &reqs[0]));
    MPI_CHECK(MPI_Irecv(&tokens[1], 1, MPI_INT, 0, kTag, MPI_COMM_WORLD, &reqs[1]));
  }
  // The first watchdog to fire ends the job, and only rank 0 can name the missing ranks: the
  // others give it a moment more (their line would only say that they wait for rank 0).
  const double wait_s = w.rank == 0 || timeout_s <= 0 ? timeout_s : timeout_s + 2.0;
  poll_until(
      [&] {
        int done = 0;
        MPI_CHECK(
            MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      wait_s,
      [&] {
        return "start-up: waiting for world rank 0 to hear from all " + std::to_string(w.size) +
               " ranks";
      });
}

}  // namespace

// The communicator of input_error_agreement: a world of its own, so that ranks agreeing on bad
// input never match a collective of the training's.
MPI_Comm g_error_comm = MPI_COMM_NULL;

World mpi_init_world(int* argc, char*** argv, bool* we_initialised, double timeout_s) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  *we_initialised = false;
  if (!initialised) {
    watch_launcher();
    // MPI_Init waits for every rank of the job; one that never starts would hold it forever.
    const WatchdogTimer deadline(timeout_s,
                                 "start-up (MPI_Init: waiting for every rank of the job to start)");
    // FUNNELED: one thread drives MPI. The NCCL watchdog thread may call MPI_Abort, which only
    // ends the job.
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    *we_initialised = true;
  }
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  World w;
  w.mpi = true;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.size));
  set_process_identity(w.rank, w.size);  // before anything below can fail
  set_abort_hook(&mpi_abort_hook, mpi_abort_grace_s());
  w.host = process_host();
  // Open MPI says the local rank directly; other launchers are asked through a shared-memory split.
  w.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", -1);
  w.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", -1);
  if (w.local_rank < 0 || w.local_size < 1) {
    MPI_Comm node;
    MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &w.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &w.local_size));
    MPI_CHECK(MPI_Comm_free(&node));
  }
  if (*we_initialised) {
    stop_hook(w);
    join_world(w, timeout_s);
  }
  // After join_world every rank is here: the duplication completes.
  if (g_error_comm == MPI_COMM_NULL) {
    MPI_Request r;
    MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &g_error_comm, &r));
    mpi_wait(&r, timeout_s, "start-up: creating the error-agreement communicator");
    MPI_CHECK(MPI_Comm_set_errhandler(g_error_comm, MPI_ERRORS_RETURN));
  }
  return w;
}

int mpi_input_error_agreement(double wait_s) {
  if (g_error_comm == MPI_COMM_NULL) return -1;
  int mine = 0, lowest = -1;
  MPI_CHECK(MPI_Comm_rank(g_error_comm, &mine));
  MPI_Request r;
  MPI_CHECK(MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, g_error_comm, &r));
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (done) return lowest;
    // Not every rank came: the request stays pending, as the caller ends the job.
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void mpi_finalize_world(bool we_initialised, double timeout_s) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op* op : {&g_bf16_sum, &g_bf16_max}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
  if (g_error_comm != MPI_COMM_NULL) MPI_Comm_free(&g_error_comm);
  if (!we_initialised) return;
  // MPI_Finalize waits for the launcher and the other ranks; a stopped one would hold it forever.
  const WatchdogTimer deadline(
      timeout_s, "shutdown (MPI_Finalize: the launcher or another rank does not answer)");
  MPI_Finalize();
}

void mpi_wait(MPI_Request* r, double timeout_s, const std::string& what) {
  poll_until(
      [r] {
        int done = 0;
        MPI_CHECK(MPI_Test(r, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      timeout_s, [&what] { return what; });
}

std::vector<int> mpi_world_ranks(MPI_Comm c) {
  int n = 0;
  MPI_CHECK(MPI_Comm_size(c, &n));
  MPI_Group mine, all;
  MPI_CHECK(MPI_Comm_group(c, &mine));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &all));
  std::vector<int> ranks(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  MPI_CHECK(MPI_Group_translate_ranks(mine, n, ranks.data(), all, out.data()));
  MPI_CHECK(MPI_Group_free(&mine));
  MPI_CHECK(MPI_Group_free(&all));
  return out;
}

MPI_Comm mpi_split(MPI_Comm parent, int color, int key, double timeout_s, const std::string& what) {
  MPI_Request b;
  MPI_CHECK(MPI_Ibarrier(parent, &b));
  mpi_wait(&b, timeout_s, what);
  MPI_Comm out = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(parent, color < 0 ? MPI_UNDEFINED : color, key, &out));
  if (out != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
  return out;
}

MPI_Comm mpi_dup_world(double timeout_s) {
  STRATA_CHECK(world().mpi,
               "a communicator over " << world().size << " ranks needs init_world() under mpirun");
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request r;
  MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &r));
  mpi_wait(&r, timeout_s, describe_collective("create group", "world", world().size, 0));
  MPI_CHECK(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  return dup;
}

std::unique_ptr<Communicator> make_mpi_world_communicator(double timeout_s) {
  return std::make_unique<MpiCommunicator>(mpi_dup_world(timeout_s), "world", timeout_s);
}

}  // namespace detail
}  // namespace strata
