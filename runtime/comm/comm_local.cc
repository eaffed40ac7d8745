// comm_local.cc — the single-process communicator: world size 1 and MPI groups of size 1.
//
// With one rank every collective is the identity: all_reduce and broadcast leave the buffer as it
// is, reduce_scatter and all_gather copy. Sends to oneself are matched with receives exactly as
// MPI does (per tag, in posting order), so code written for p ranks runs unchanged with p = 1.
// Host buffers only; a group of size 1 on NCCL stays an NCCL communicator.
#include <cstring>
#include <deque>
#include <map>

#include "runtime/base/check.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/watchdog.h"

namespace strata {
namespace {

void copy_elems(void* dst, const void* src, size_t count, DType dtype) {
  const size_t bytes = count * dtype_size(dtype);
  if (bytes == 0 || dst == src) return;
  std::memcpy(dst, src, bytes);
}

// A receive posted before its send: filled in when the send arrives.
struct PendingRecv {
  void* buf = nullptr;
  size_t bytes = 0;
  bool done = false;
};

// Messages to oneself, matched per tag in posting order.
struct Mailbox {
  std::map<int, std::deque<std::vector<char>>> unexpected;         // sent, not yet received
  std::map<int, std::deque<std::shared_ptr<PendingRecv>>> posted;  // received, not yet sent
};

class LocalRecvRequest final : public detail::RequestImpl {
 public:
  LocalRecvRequest(std::shared_ptr<PendingRecv> r, std::string group, int world_rank, int tag)
      : r_(std::move(r)), group_(std::move(group)), world_rank_(world_rank), tag_(tag) {}
  bool test() override { return r_->done; }
  void wait() override {
    // One rank, one thread: a receive still open when waited on has no send that could match it.
    STRATA_CHECK(r_->done, describe_p2p(false, world_rank_, group_, r_->bytes)
                               << " (tag " << tag_
                               << "): no matching send to self was posted before the wait, so "
                                  "it would wait forever");
  }

 private:
  std::shared_ptr<PendingRecv> r_;
  std::string group_;
  int world_rank_;
  int tag_;
};

// The receives of a batch, completed together.
class LocalBatchRequest final : public detail::RequestImpl {
 public:
  std::vector<Request> parts;
  bool test() override {
    for (Request& r : parts) {
      if (!r.test()) return false;
    }
    return true;
  }
  void wait() override { wait_all(parts); }
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::string name, int world_rank, double timeout_s)
      : name_(std::move(name)), world_rank_(world_rank), timeout_s_(timeout_s) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  CommBackend backend() const override { return CommBackend::kLocal; }
  Device device() const override { return Device::kCPU; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int group_rank) const override {
    check_rank(group_rank, "rank");
    return world_rank_;
  }
  double timeout_s() const override { return timeout_s_; }

  Request iall_reduce(void*, size_t, DType, ReduceOp) override { return {}; }
  Request ireduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                          ReduceOp) override {
    copy_elems(recv, send, recv_count, dtype);
    return {};
  }
  Request ireduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts,
                           DType dtype, ReduceOp) override {
    STRATA_CHECK(counts.size() == 1, "reduce_scatterv on group " << name_ << ": " << counts.size()
                                                                 << " counts for 1 rank");
    copy_elems(recv, send, counts[0], dtype);
    return {};
  }
  Request iall_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    copy_elems(recv, send, send_count, dtype);
    return {};
  }
  Request iall_gatherv(const void* send, void* recv, const std::vector<size_t>& counts,
                       DType dtype) override {
    STRATA_CHECK(counts.size() == 1,
                 "all_gatherv on group " << name_ << ": " << counts.size() << " counts for 1 rank");
    copy_elems(recv, send, counts[0], dtype);
    return {};
  }
  Request iall_to_allv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                       const std::vector<size_t>& recv_counts, DType dtype) override {
    STRATA_CHECK(
        send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0],
        "all_to_allv on group " << name_ << ": counts for one rank must be one each, "
                                << "equal");
    copy_elems(recv, send, send_counts[0], dtype);
    return {};
  }
  Request ibroadcast(void*, size_t, DType, int root) override {
    check_rank(root, "broadcast root");
    return {};
  }

  Request isend(const void* buf, size_t count, DType dtype, int peer, int tag) override {
    check_rank(peer, "send peer");
    const size_t bytes = count * dtype_size(dtype);
    auto& waiting = mail_->posted[tag];
    if (!waiting.empty()) {
      std::shared_ptr<PendingRecv> r = waiting.front();
      waiting.pop_front();
      check_fits(bytes, r->bytes, tag);
      if (bytes > 0) std::memcpy(r->buf, buf, bytes);
      r->done = true;
      return {};
    }
    const char* p = static_cast<const char*>(buf);
    mail_->unexpected[tag].emplace_back(p, p + bytes);
    return {};
  }

  Request irecv(void* buf, size_t count, DType dtype, int peer, int tag) override {
    check_rank(peer, "recv peer");
    auto r = std::make_shared<PendingRecv>();
    r->buf = buf;
    r->bytes = count * dtype_size(dtype);
    auto& arrived = mail_->unexpected[tag];
    if (!arrived.empty()) {
      const std::vector<char> msg = std::move(arrived.front());
      arrived.pop_front();
      check_fits(msg.size(), r->bytes, tag);
      if (!msg.empty()) std::memcpy(buf, msg.data(), msg.size());
      return {};
    }
    mail_->posted[tag].push_back(r);
    return Request(std::make_unique<LocalRecvRequest>(r, name_, world_rank_, tag));
  }

  Request ibatch(const std::vector<P2POp>& ops) override {
    // Sends first: a batch that receives what it sends to itself must match inside the batch.
    auto batch = std::make_unique<LocalBatchRequest>();
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::Kind::kSend) isend(op.buf, op.count, op.dtype, op.peer, op.tag);
    }
    for (const P2POp& op : ops) {
      if (op.kind == P2POp::Kind::kRecv) {
        batch->parts.push_back(irecv(op.buf, op.count, op.dtype, op.peer, op.tag));
      }
    }
    return Request(std::move(batch));
  }

  void barrier() override {}

  std::unique_ptr<Communicator> split(int color, int, const std::string& name) override {
    if (color < 0) return nullptr;
    return std::make_unique<LocalCommunicator>(name, world_rank_, timeout_s_);
  }

 private:
  void check_rank(int r, const char* what) const {
    STRATA_CHECK(r == 0, what << " " << r << " on group " << name_ << " of 1 rank");
  }
  void check_fits(size_t sent, size_t room, int tag) const {
    STRATA_CHECK(sent <= room, "group " << name_ << ": a send to self of " << sent << " bytes (tag "
                                        << tag << ") matched a recv of " << room << " bytes");
  }

  std::string name_;
  int world_rank_;
  double timeout_s_;
  std::shared_ptr<Mailbox> mail_ = std::make_shared<Mailbox>();
};

}  // namespace

namespace detail {
std::unique_ptr<Communicator> make_local_communicator(const std::string& name, int world_rank,
                                                      double timeout_s) {
  return std::make_unique<LocalCommunicator>(name, world_rank, timeout_s);
}
}  // namespace detail

}  // namespace strata
