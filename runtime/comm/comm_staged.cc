// comm_staged.cc — device buffers over a host communicator, through host copies (see comm.h).
//
// Every operation has the same three parts: copy the device inputs into host buffers owned by the
// operation, start the host communicator's operation on those, and when it completes copy the
// host results to the device buffers. In-place collectives stay in place on the host copy, so the
// host communicator sees exactly the call the caller made, with host addresses.
#include <numeric>

#include "runtime/base/check.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace {

// Host bytes of one device buffer, and where they go back when the operation completes.
struct Staged {
  std::vector<char> host;
  void* device_back = nullptr;  // null: nothing comes back (a send)
};

class StagedRequest final : public detail::RequestImpl {
 public:
  StagedRequest(std::vector<Staged> bufs, DeviceStaging* staging)
      : bufs_(std::move(bufs)), staging_(staging) {}
  // The host operation; set after construction, because it needs the host buffers' addresses.
  Request inner;

  bool test() override {
    if (done_) return true;
    if (!inner.test()) return false;
    copy_back();
    return true;
  }
  void wait() override {
    if (done_) return;
    inner.wait();
    copy_back();
  }

 private:
  void copy_back() {
    done_ = true;
    for (Staged& b : bufs_) {
      if (b.device_back && !b.host.empty())
        staging_->to_device(b.device_back, b.host.data(), b.host.size());
    }
  }

  std::vector<Staged> bufs_;
  DeviceStaging* staging_;
  bool done_ = false;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<DeviceStaging> staging)
      : inner_(std::move(inner)), staging_(std::move(staging)) {
    STRATA_CHECK(inner_->device() == Device::kCPU,
                 "a staged communicator runs over a host communicator, group "
                     << inner_->name() << " is " << to_string(inner_->backend()));
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  CommBackend backend() const override { return inner_->backend(); }
  Device device() const override { return staging_->device(); }
  const std::string& name() const override { return inner_->name(); }
  int world_rank_of(int group_rank) const override { return inner_->world_rank_of(group_rank); }
  double timeout_s() const override { return inner_->timeout_s(); }

  Request iall_reduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    Op o(this);
    char* h = o.in_out(buf, bytes(count, dtype));
    return o.start(inner_->iall_reduce(h, count, dtype, op));
  }

  Request ireduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                          ReduceOp op) override {
    Op o(this);
    const char* hs = o.in(send, bytes(recv_count * static_cast<size_t>(size()), dtype));
    char* hr = o.out(recv, bytes(recv_count, dtype));
    return o.start(inner_->ireduce_scatter(hs, hr, recv_count, dtype, op));
  }

  Request ireduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts,
                           DType dtype, ReduceOp op) override {
    STRATA_CHECK(counts.size() == static_cast<size_t>(size()),
                 "reduce_scatterv on group " << name() << ": " << counts.size() << " counts for "
                                             << size() << " ranks");
    Op o(this);
    const char* hs = o.in(send, bytes(total(counts), dtype));
    char* hr = o.out(recv, bytes(counts[static_cast<size_t>(rank())], dtype));
    return o.start(inner_->ireduce_scatterv(hs, hr, counts, dtype, op));
  }

  Request iall_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    std::vector<size_t> counts(static_cast<size_t>(size()), send_count);
    return gather(send, recv, counts, dtype, /*even=*/true);
  }

  Request iall_gatherv(const void* send, void* recv, const std::vector<size_t>& counts,
                       DType dtype) override {
    STRATA_CHECK(counts.size() == static_cast<size_t>(size()),
                 "all_gatherv on group " << name() << ": " << counts.size() << " counts for "
                                         << size() << " ranks");
    return gather(send, recv, counts, dtype, /*even=*/false);
  }

  Request iall_to_allv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                       const std::vector<size_t>& recv_counts, DType dtype) override {
    STRATA_CHECK(send_counts.size() == static_cast<size_t>(size()) &&
                     recv_counts.size() == static_cast<size_t>(size()),
                 "all_to_allv on group " << name() << ": " << send_counts.size() << " and "
                                         << recv_counts.size() << " counts for " << size()
                                         << " ranks");
    Op o(this);
    const char* hs = o.in(send, bytes(total(send_counts), dtype));
    char* hr = o.out(recv, bytes(total(recv_counts), dtype));
    return o.start(inner_->iall_to_allv(hs, send_counts, hr, recv_counts, dtype));
  }

  Request ibroadcast(void* buf, size_t count, DType dtype, int root) override {
    Op o(this);
    // Only the root's bytes matter; the others receive into an uninitialised host buffer.
    char* h = rank() == root ? o.in_out(buf, bytes(count, dtype)) : o.out(buf, bytes(count, dtype));
    return o.start(inner_->ibroadcast(h, count, dtype, root));
  }

  Request isend(const void* buf, size_t count, DType dtype, int peer, int tag) override {
    Op o(this);
    const char* h = o.in(buf, bytes(count, dtype));
    return o.start(inner_->isend(h, count, dtype, peer, tag));
  }

  Request irecv(void* buf, size_t count, DType dtype, int peer, int tag) override {
    Op o(this);
    char* h = o.out(buf, bytes(count, dtype));
    return o.start(inner_->irecv(h, count, dtype, peer, tag));
  }

  Request ibatch(const std::vector<P2POp>& ops) override {
    Op o(this);
    std::vector<P2POp> host_ops = ops;
    for (P2POp& p : host_ops) {
      const size_t n = bytes(p.count, p.dtype);
      p.buf = p.kind == P2POp::Kind::kSend ? const_cast<char*>(o.in(p.buf, n)) : o.out(p.buf, n);
    }
    return o.start(inner_->ibatch(host_ops));
  }

  void barrier() override { inner_->barrier(); }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::unique_ptr<Communicator> sub = inner_->split(color, key, name);
    if (!sub) return nullptr;
    return std::make_unique<StagedCommunicator>(std::move(sub), staging_);
  }

 private:
  static size_t bytes(size_t count, DType dtype) { return count * dtype_size(dtype); }
  static size_t total(const std::vector<size_t>& counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }

  // The host side of one operation under construction; its buffers move into the request (a
  // vector's heap block keeps its address when the vector moves, so handed-out addresses stay
  // valid).
  class Op {
   public:
    explicit Op(StagedCommunicator* c) : c_(c) {}

    // A device input: copied to host now.
    const char* in(const void* device, size_t n) {
      return add(const_cast<void*>(device), n, true, false);
    }
    // A device output: copied back to the device when the operation completes.
    char* out(void* device, size_t n) { return add(device, n, false, true); }
    char* in_out(void* device, size_t n) { return add(device, n, true, true); }

    Request start(Request inner) {
      auto r = std::make_unique<StagedRequest>(std::move(bufs_), c_->staging_.get());
      r->inner = std::move(inner);
      return Request(std::move(r));
    }

   private:
    char* add(void* device, size_t n, bool copy_in, bool copy_back) {
      bufs_.push_back(Staged{std::vector<char>(n), copy_back ? device : nullptr});
      char* h = bufs_.back().host.data();
      if (copy_in && n > 0) c_->staging_->to_host(h, device, n);
      return h;
    }

    StagedCommunicator* c_;
    std::vector<Staged> bufs_;
  };

  // all_gather(v): in place when send sits at this rank's offset in recv, as on every backend; on
  // the host it always runs in place, from this rank's block of the host copy of recv.
  Request gather(const void* send, void* recv, const std::vector<size_t>& counts, DType dtype,
                 bool even) {
    const size_t es = dtype_size(dtype);
    size_t before = 0;
    for (int r = 0; r < rank(); ++r) before += counts[static_cast<size_t>(r)];
    const size_t mine = counts[static_cast<size_t>(rank())];
    Op o(this);
    char* hr = o.out(recv, total(counts) * es);
    if (mine > 0) staging_->to_host(hr + before * es, send, mine * es);
    Request inner = even ? inner_->iall_gather(hr + before * es, hr, mine, dtype)
                         : inner_->iall_gatherv(hr + before * es, hr, counts, dtype);
    return o.start(std::move(inner));
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<DeviceStaging> staging_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host_comm,
                                                       std::shared_ptr<DeviceStaging> staging) {
  STRATA_CHECK(host_comm != nullptr && staging != nullptr,
               "make_staged_communicator: null argument");
  return std::make_unique<StagedCommunicator>(std::move(host_comm), std::move(staging));
}

}  // namespace strata
