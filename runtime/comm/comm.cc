// comm.cc — the backend-neutral part of the communicator: requests, the factory, the world.
// MPI lives in comm_mpi.cc, NCCL in cuda/comm_nccl.cc; this file includes neither header.
#include "runtime/comm/comm.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "runtime/base/abort_hook.h"
#include "runtime/base/check.h"
#include "runtime/base/error.h"
#include "runtime/comm/watchdog.h"

namespace strata {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

const char* to_string(CommBackend b) {
  switch (b) {
    case CommBackend::kLocal:
      return "local";
    case CommBackend::kMPI:
      return "mpi";
    case CommBackend::kNCCL:
      return "nccl";
  }
  return "?";
}

// ---- Request ----

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    // The operation this handle held must finish before its handle is gone.
    if (impl_) impl_->wait();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Request::~Request() {
  if (impl_) impl_->wait();
}

void Request::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

bool Request::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

void wait_all(std::vector<Request>& requests) {
  for (Request& r : requests) r.wait();
}

// ---- Tensor forms ----

namespace {
void check_device(const Communicator& c, const Tensor& t, const char* op) {
  STRATA_CHECK(t.device() == c.device(), op << " on group " << c.name() << " ("
                                            << to_string(c.backend()) << ") needs "
                                            << to_string(c.device()) << " tensors, got a "
                                            << to_string(t.device()) << " tensor");
}
}  // namespace

Request Communicator::iall_reduce(const Tensor& t, ReduceOp op) {
  check_device(*this, t, "all_reduce");
  return iall_reduce(t.data(), static_cast<size_t>(t.numel()), t.dtype(), op);
}

void Communicator::broadcast(const Tensor& t, int root) {
  check_device(*this, t, "broadcast");
  broadcast(t.data(), static_cast<size_t>(t.numel()), t.dtype(), root);
}

Request Communicator::isend(const Tensor& t, int peer, int tag) {
  check_device(*this, t, "send");
  return isend(t.data(), static_cast<size_t>(t.numel()), t.dtype(), peer, tag);
}

Request Communicator::irecv(const Tensor& t, int peer, int tag) {
  check_device(*this, t, "recv");
  return irecv(t.data(), static_cast<size_t>(t.numel()), t.dtype(), peer, tag);
}

// ---- helpers ----

std::vector<size_t> chunk_counts(size_t total, int parts) {
  STRATA_CHECK(parts > 0, "chunk_counts into " << parts << " parts");
  std::vector<size_t> counts(static_cast<size_t>(parts), total / static_cast<size_t>(parts));
  for (size_t r = 0; r < total % static_cast<size_t>(parts); ++r) ++counts[r];
  return counts;
}

bool backend_available(CommBackend b) {
  switch (b) {
    case CommBackend::kLocal:
      return world().size == 1;
    case CommBackend::kMPI:
      return true;
    case CommBackend::kNCCL:
#if defined(STRATA_HAVE_CUDA)
      return cuda_device_count() > 0;
#else
      return false;
#endif
  }
  return false;
}

std::unique_ptr<Communicator> make_world_communicator(CommBackend b, double timeout_s) {
  const World& w = world();
  switch (b) {
    case CommBackend::kLocal:
      STRATA_CHECK(w.size == 1, "the local backend runs one rank, the world has " << w.size);
      return detail::make_local_communicator("world", 0, timeout_s);
    case CommBackend::kMPI:
      // One rank needs no transport; a Local communicator skips MPI entirely.
      if (w.size == 1) return detail::make_local_communicator("world", w.rank, timeout_s);
      return detail::make_mpi_world_communicator(timeout_s);
    case CommBackend::kNCCL:
#if defined(STRATA_HAVE_CUDA)
      return detail::make_nccl_world_communicator(timeout_s);
#else
      STRATA_CHECK(false, "the NCCL backend was requested but this build has no CUDA");
#endif
  }
  return nullptr;
}

std::string decide_on_rank0(Communicator& host_comm, const std::function<std::string()>& decide) {
  std::string choice;
  if (host_comm.rank() == 0) {
    try {
      choice = "ok:" + decide();
    } catch (const InputError& e) {
      // The parts travel separately so every rank rethrows the same InputError; they hold no
      // newline (InputError writes control bytes as \xNN).
      choice = "err:" + e.file() + '\n' + e.where() + '\n' + e.expected();
    }
  }
  choice = all_gather_strings(host_comm, choice)[0];
  if (choice.rfind("err:", 0) == 0) {
    const size_t a = choice.find('\n'), b = choice.find('\n', a + 1);
    throw InputError(choice.substr(4, a - 4), choice.substr(a + 1, b - a - 1),
                     choice.substr(b + 1));
  }
  return choice.substr(3);
}

std::vector<std::string> all_gather_strings(Communicator& host_comm, const std::string& s) {
  STRATA_CHECK(host_comm.device() == Device::kCPU,
               "all_gather_strings needs a host communicator, group "
                   << host_comm.name() << " is " << to_string(host_comm.backend()));
  const int n = host_comm.size();
  // Lengths first, then the characters packed four to an int32 word (DType has no byte type).
  std::vector<int32_t> lengths(static_cast<size_t>(n));
  const int32_t mine = static_cast<int32_t>(s.size());
  host_comm.all_gather(&mine, lengths.data(), 1, DType::kI32);
  std::vector<size_t> words(static_cast<size_t>(n));
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    words[r] = (static_cast<size_t>(lengths[r]) + 3) / 4;
    total += words[r];
  }
  std::vector<int32_t> packed_mine(words[static_cast<size_t>(host_comm.rank())], 0);
  if (!s.empty()) std::memcpy(packed_mine.data(), s.data(), s.size());
  std::vector<int32_t> packed_all(total);
  host_comm.all_gatherv(packed_mine.data(), packed_all.data(), words, DType::kI32);
  std::vector<std::string> out(static_cast<size_t>(n));
  size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    out[r].assign(reinterpret_cast<const char*>(packed_all.data() + offset),
                  static_cast<size_t>(lengths[r]));
    offset += words[r];
  }
  return out;
}

// ---- the world ----

namespace {
World g_world;
bool g_initialised = false;
bool g_we_started_mpi = false;
}  // namespace

World init_world(int* argc, char*** argv, double timeout_s) {
  if (g_initialised) return g_world;
  if (detail::launched_by_mpi()) {
    g_world = detail::mpi_init_world(argc, argv, &g_we_started_mpi, timeout_s);
  } else {
    g_world = World{};
    g_world.host = process_host();
  }
  set_process_identity(g_world.rank, g_world.size);
  // Oversubscribed ranks must give the core to their peers while they wait; ranks with a core
  // each poll without yielding, for latency. Open MPI's mpi_yield_when_idle, when given, decides.
  set_poll_yield(should_poll_yield(g_world.local_size, std::thread::hardware_concurrency(),
                                   std::getenv("OMPI_MCA_mpi_yield_when_idle")));
  g_initialised = true;
  return g_world;
}

void finalize_world(double timeout_s) {
  if (!g_initialised) return;
  if (g_world.mpi) {
    detail::mpi_finalize_world(g_we_started_mpi, timeout_s);
    set_abort_hook(nullptr);
  }
  g_initialised = false;
  g_we_started_mpi = false;
}

const World& world() {
  if (!g_initialised && g_world.host.empty()) g_world.host = process_host();
  return g_world;
}

int input_error_agreement(double wait_s) {
  if (!g_initialised || !g_world.mpi || g_world.size == 1) return 0;
  return detail::mpi_input_error_agreement(wait_s);
}

int cuda_device_count() {
#if defined(STRATA_HAVE_CUDA)
  return detail::cuda_device_count_impl();
#else
  return 0;
#endif
}

int local_device_index() {
  const int n = cuda_device_count();
  if (n <= 0) return 0;
  return world().local_rank % n;
}

}  // namespace strata
