// comm.h — the one interface for everything Strata moves between ranks, and the process world.
//
// A Communicator is one group of ranks (the world, a tensor-parallel group, a pipeline...). Three
// backends sit behind one factory:
//   kMPI   (comm_mpi.cc)         host buffers, Open MPI; the CPU transport and portable fallback.
//   kNCCL  (cuda/comm_nccl.cc)   device buffers; one NCCL communicator per group, its unique id
//                                broadcast over MPI; work on a dedicated communication stream.
//   kLocal (comm_local.cc)       one rank, host buffers, no MPI; used for world size 1 and for MPI
//                                groups of size 1 (collectives become copies or no-ops).
// Nothing outside runtime/ and launch/ includes mpi.h or nccl.h; this header names neither.
//
// Conventions, identical across backends:
//   - counts are elements of `dtype`, never bytes; peers and roots are ranks *in this group*
//     (world_rank_of() maps them for messages);
//   - every operation is collective over the group except isend/irecv/batch; all members call
//     collectives in the same order;
//   - i*-calls start the operation and return a Request; the buffers belong to the operation until
//     wait() returns. The blocking forms are the i*-form followed by wait().
//   - Completion. MPI/Local: after wait() the host may read the result. NCCL: wait() never blocks
//     the host; it makes the compute stream (set_compute_stream) wait for the operation, so every
//     kernel or copy enqueued there afterwards sees the result (read it on the host after
//     synchronising the compute stream). barrier() is the one call that blocks the host on NCCL.
//   - Watchdog (watchdog.h): every wait has the deadline timeout_s(). On expiry the rank prints one
//     line naming group, operation, peer, bytes and the schedule step (set_wait_context), then the
//     whole job aborts with a non-zero status. No silent hangs.
//   - Failures of the library (MPI/NCCL/CUDA errors) abort the job with full context (check.h);
//     misuse (bad root or peer, count not fitting) is a STRATA_CHECK failure.
//
// Thread-safety: a Communicator and its Requests are used by one thread at a time. init_world()
// and finalize_world() are called once from the main thread. set_wait_context() is per thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/memory/tensor.h"

namespace strata {

enum class ReduceOp { kSum, kMax };
enum class CommBackend { kLocal, kMPI, kNCCL };
const char* to_string(ReduceOp op);
const char* to_string(CommBackend b);  // "local", "mpi", "nccl"

// ---- the process world ----

struct World {
  int rank = 0, size = 1;              // in the job
  int local_rank = 0, local_size = 1;  // on this host
  std::string host;
  bool mpi = false;  // MPI is initialised (launched by mpirun/srun)
};

// Starts MPI when a launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK or
// PMI_SIZE in the environment); otherwise world size 1 and MPI is never touched. Installs the
// job-wide abort hook (MPI_Abort) and set_process_identity(). Idempotent; adopts an MPI that the
// caller already initialised (and then leaves finalising it to the caller).
// Start-up is bounded by timeout_s (the watchdog, watchdog.h): MPI_Init, then every rank
// reporting to rank 0, which names the ranks that never arrive; a process a launcher started
// stops at once when the launcher is gone (watch_launcher). 300 s is comm.timeout_s's default.
World init_world(int* argc, char*** argv, double timeout_s = 300);
// Finalises MPI if init_world started it, within timeout_s (MPI_Finalize waits for the launcher
// and every rank: a stopped one ends this process with the watchdog line and status 1). Destroy
// every Communicator first.
void finalize_world(double timeout_s = 300);
// The world of init_world(); the size-1 default before it.
const World& world();

// After this rank found bad input (an InputError): the lowest world rank that found one too, if
// every rank of the world did within wait_s (bad input in the config or in a file every rank
// reads is found alike everywhere: that rank prints the one line); -1 when some rank did not
// (it is busy elsewhere, in the training's collectives: a token only this rank read was bad),
// and this rank must print its error and end the job. A world of one rank: 0. Only ranks that
// found bad input call it, on a communicator of its own.
int input_error_agreement(double wait_s);
// The wait both callers (launch/cli.cc, the batch prefetcher) give it.
constexpr double kInputErrorAgreementS = 5.0;

// The CUDA device this rank drives: local_rank modulo the device count; 0 without CUDA or without
// devices.
int local_device_index();
// Number of visible CUDA devices; 0 in a build without CUDA.
int cuda_device_count();

// ---- requests ----

namespace detail {
// One in-flight operation of a backend. wait() blocks until completion or the watchdog fires.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  virtual bool test() = 0;  // true when complete (drives MPI progress); never blocks
  virtual void wait() = 0;
};
}  // namespace detail

// A move-only handle to a started operation. A default Request is complete. Destroying a Request
// that was not waited on waits for it first: its buffers must not be reused while in flight.
// Requests complete before the Communicator that made them is destroyed.
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<detail::RequestImpl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  // Completes the operation (see the completion rule at the top). Idempotent.
  void wait();
  // True once complete; never blocks. On MPI this is also what makes a started operation progress.
  bool test();
  bool pending() const { return impl_ != nullptr; }

 private:
  std::unique_ptr<detail::RequestImpl> impl_;
};

// Waits for every request, in order.
void wait_all(std::vector<Request>& requests);

// ---- point-to-point batches ----

// One send or receive of a batch. Sends and receives of one batch are posted together and waited
// together, so a rank that sends forward while receiving backward (1F1B) cannot deadlock, whatever
// its neighbours post first.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  void* buf = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  int peer = 0;  // group rank
  int tag = 0;   // MPI only; NCCL matches per peer in posting order
  // What the transfer is, for the watchdog's line ("ring step 2 of 4"); empty: nothing.
  std::string what;

  static P2POp send(const void* buf, size_t count, DType dtype, int peer, int tag = 0) {
    return {Kind::kSend, const_cast<void*>(buf), count, dtype, peer, tag, {}};
  }
  static P2POp recv(void* buf, size_t count, DType dtype, int peer, int tag = 0) {
    return {Kind::kRecv, buf, count, dtype, peer, tag, {}};
  }
};

// ---- the communicator ----

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual CommBackend backend() const = 0;
  // Where buffers must live: kCPU for MPI/Local, kCUDA for NCCL.
  virtual Device device() const = 0;
  // The group's name in messages ("world", "tp", "dp", "pp", "mp", "embedding").
  virtual const std::string& name() const = 0;
  // World rank of a rank of this group.
  virtual int world_rank_of(int group_rank) const = 0;
  virtual double timeout_s() const = 0;

  // In place: buf (count) becomes the reduction over the group.
  virtual Request iall_reduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // send (size() * recv_count) is reduced; rank r receives elements [r*recv_count,
  // (r+1)*recv_count) in recv (recv_count). Out of place only. A total that does not divide by
  // size() cannot be expressed here: use ireduce_scatterv (uneven chunks) or pad the buffer.
  virtual Request ireduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                  ReduceOp op) = 0;
  // Uneven chunks: counts[r] elements to rank r, chunks laid out in rank order in send
  // (sum(counts)); recv holds counts[rank()]. counts has size() entries; chunk_counts() gives the
  // usual near-equal split.
  virtual Request ireduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts,
                                   DType dtype, ReduceOp op) = 0;
  // recv (size() * send_count) holds every rank's send, in rank order. In place when
  // send == recv + rank() * send_count.
  virtual Request iall_gather(const void* send, void* recv, size_t send_count, DType dtype) = 0;
  // Uneven: rank r contributes counts[r] elements, laid out in rank order in recv. In place when
  // send == recv + (sum of counts before rank()).
  virtual Request iall_gatherv(const void* send, void* recv, const std::vector<size_t>& counts,
                               DType dtype) = 0;
  // All-to-all with uneven chunks: send holds send_counts[r] elements for rank r, chunks in rank
  // order; recv receives recv_counts[r] elements from rank r, chunks in rank order. Each rank's
  // recv_counts[r] must equal rank r's send_counts[rank()] (exchange the counts first, with an
  // even all-to-all of one count per rank: the mixture of experts' dispatch does). Out of place
  // only. NCCL: one group of sends and receives (NCCL has no uneven all-to-all).
  virtual Request iall_to_allv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                               const std::vector<size_t>& recv_counts, DType dtype) = 0;
  // buf (count) of `root` is copied to every rank.
  virtual Request ibroadcast(void* buf, size_t count, DType dtype, int root) = 0;

  virtual Request isend(const void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;
  virtual Request irecv(void* buf, size_t count, DType dtype, int peer, int tag = 0) = 0;
  // All ops posted together; the Request completes when all have.
  virtual Request ibatch(const std::vector<P2POp>& ops) = 0;

  // Returns when every rank of the group has entered it (blocks the host on every backend).
  virtual void barrier() = 0;

  // A new group of the ranks that pass the same color >= 0, ordered by (key, rank). Collective
  // over this group; ranks passing a negative color get nullptr. MPI groups of size 1 become
  // Local communicators.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // NCCL: the stream that compute kernels run on (a cudaStream_t; nullptr is the legacy default
  // stream). Operations wait for the work already enqueued there, and wait() orders the compute
  // stream after them. Ignored by host backends.
  virtual void set_compute_stream(void* stream) { (void)stream; }
  // Whether a send holds up the group's later operations until its receive is posted (NCCL: a
  // send blocks its stream; only sends and receives of one batch() progress together). False
  // for MPI, whose sends never keep later operations from starting. The pipeline executor then
  // posts each schedule group's sends and receives as one batch.
  virtual bool rendezvous_sends() const { return false; }

  // Blocking forms.
  void all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
    iall_reduce(buf, count, dtype, op).wait();
  }
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) {
    ireduce_scatter(send, recv, recv_count, dtype, op).wait();
  }
  void reduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op) {
    ireduce_scatterv(send, recv, counts, dtype, op).wait();
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) {
    iall_gather(send, recv, send_count, dtype).wait();
  }
  void all_gatherv(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype) {
    iall_gatherv(send, recv, counts, dtype).wait();
  }
  void all_to_allv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                   const std::vector<size_t>& recv_counts, DType dtype) {
    iall_to_allv(send, send_counts, recv, recv_counts, dtype).wait();
  }
  void broadcast(void* buf, size_t count, DType dtype, int root) {
    ibroadcast(buf, count, dtype, root).wait();
  }
  void send(const void* buf, size_t count, DType dtype, int peer, int tag = 0) {
    isend(buf, count, dtype, peer, tag).wait();
  }
  void recv(void* buf, size_t count, DType dtype, int peer, int tag = 0) {
    irecv(buf, count, dtype, peer, tag).wait();
  }
  void batch(const std::vector<P2POp>& ops) { ibatch(ops).wait(); }

  // Tensor forms: whole tensor, checked to live on device().
  Request iall_reduce(const Tensor& t, ReduceOp op);
  void all_reduce(const Tensor& t, ReduceOp op) { iall_reduce(t, op).wait(); }
  void broadcast(const Tensor& t, int root);
  Request isend(const Tensor& t, int peer, int tag = 0);
  Request irecv(const Tensor& t, int peer, int tag = 0);
};

// Near-equal split of `total` into `parts`: the first total % parts chunks get one more element.
std::vector<size_t> chunk_counts(size_t total, int parts);

// ---- device buffers over a host transport ----

// Moves bytes between a backend's memory and host memory, for a staged communicator. The CUDA
// backend provides one (Backend::comm_staging) that copies on its compute stream.
class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  // Where the staged communicator's buffers live.
  virtual Device device() const = 0;
  // host (bytes) = the device bytes once every operation enqueued on the device so far has
  // finished; returns with host filled.
  virtual void to_host(void* host, const void* device, size_t bytes) = 0;
  // device (bytes) = host; returns when work enqueued on the device afterwards sees the bytes and
  // host may be reused.
  virtual void to_device(void* device, const void* host, size_t bytes) = 0;
};

// A communicator on staging->device() buffers over a host communicator (MPI or Local): for the
// ranks that share one GPU, where NCCL refuses a communicator with two ranks on one device. Each
// operation copies its device inputs into host buffers the operation owns, runs host_comm's
// operation on them, and copies the results back to the device when it completes (test() or
// wait()). Same conventions and watchdog as host_comm; backend() is host_comm's, device() the
// staging's. Every operation synchronises the device, so nothing overlaps: a correctness path,
// not a fast one. split() gives staged groups again.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host_comm,
                                                       std::shared_ptr<DeviceStaging> staging);

// True when this build and process can create communicators of `b` (kNCCL needs CUDA built in).
bool backend_available(CommBackend b);

// A communicator over the whole world: Local when the world has one rank and b is not kNCCL.
// Collective over the world. Requires init_world().
std::unique_ptr<Communicator> make_world_communicator(CommBackend b, double timeout_s);

// Every rank's string, in rank order, on every rank (host backends: MPI or Local).
std::vector<std::string> all_gather_strings(Communicator& host_comm, const std::string& s);

// What rank 0 of `host_comm` decides, on every rank: `decide` runs on rank 0 only (checks of
// files and paths, made once), and its result, or the InputError it throws, reaches every rank,
// which returns the same string or throws the same InputError; so bad input ends every rank
// with status 2 and none is left waiting in a collective. Collective over host_comm.
std::string decide_on_rank0(Communicator& host_comm, const std::function<std::string()>& decide);

namespace detail {
// Backend constructors behind make_world_communicator (MPI and NCCL need an initialised MPI when
// the world has more than one rank).
std::unique_ptr<Communicator> make_local_communicator(const std::string& name, int world_rank,
                                                      double timeout_s);
std::unique_ptr<Communicator> make_mpi_world_communicator(double timeout_s);
std::unique_ptr<Communicator> make_nccl_world_communicator(double timeout_s);  // CUDA builds only
// MPI start-up and shut-down (comm_mpi.cc), so that comm.cc needs no MPI header.
bool launched_by_mpi();
World mpi_init_world(int* argc, char*** argv, bool* we_initialised, double timeout_s);
// Frees Strata's MPI objects; finalises if asked, within timeout_s.
void mpi_finalize_world(bool we_initialised, double timeout_s);
int mpi_input_error_agreement(double wait_s);
int cuda_device_count_impl();  // CUDA builds only (cuda/comm_nccl.cc)
}  // namespace detail

}  // namespace strata
