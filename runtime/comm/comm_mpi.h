// comm_mpi.h — internal to the communicator backends (comm_mpi.cc, cuda/comm_nccl.cc): MPI_CHECK,
// the MPI datatype and operation of each DType / ReduceOp, and GroupCommunicator, what both
// backends' communicators know of their group. Includes mpi.h, so nothing outside runtime/ may
// include it.
//
// Thread-safety: mpi_op() creates the bf16 operations on first use; call it from the thread that
// drives MPI. A GroupCommunicator is immutable once its derived constructor has set it.
#pragma once

#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "runtime/base/check.h"
#include "runtime/comm/comm.h"

namespace strata {
namespace detail {
// "MPI_ERR_TRUNCATE: message truncated" style text for an MPI error code.
std::string mpi_error_string(int code);
MPI_Datatype mpi_type(DType t);
// bf16 has no MPI type: it travels as MPI_UINT16_T and reduces with user-defined operations that
// round to nearest even after each pairwise step, as NCCL does.
MPI_Op mpi_op(ReduceOp op, DType t);
// The bf16 reductions (MPI user-function signature): inout[i] = op(in[i], inout[i]).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* type);
void bf16_max(void* in, void* inout, int* len, MPI_Datatype* type);

// Completes one request by polling it against the watchdog deadline; `what` names it on expiry.
void mpi_wait(MPI_Request* r, double timeout_s, const std::string& what);
// World rank of every rank of `c`, in rank order (local, no communication).
std::vector<int> mpi_world_ranks(MPI_Comm c);
// MPI_Comm_split of `parent` behind a watched barrier (MPI has no non-blocking split, so a rank
// that never arrives is reported by the barrier instead of hanging the split). MPI_COMM_NULL for
// color < 0. The result has MPI_ERRORS_RETURN. Collective over parent.
MPI_Comm mpi_split(MPI_Comm parent, int color, int key, double timeout_s, const std::string& what);
// A watched MPI_Comm_idup of MPI_COMM_WORLD, with MPI_ERRORS_RETURN.
MPI_Comm mpi_dup_world(double timeout_s);
}  // namespace detail

// What a communicator of several ranks knows of its group, the same for MPI and NCCL: its name,
// this rank's index, the size, each member's world rank and the watchdog timeout; and the checks
// of rank and count arguments against it. The derived constructor sets rank_, size_ and
// world_ranks_ before any use.
class GroupCommunicator : public Communicator {
 public:
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int group_rank) const override {
    check_rank(group_rank, "rank");
    return world_ranks_[static_cast<size_t>(group_rank)];
  }
  double timeout_s() const override { return timeout_s_; }

 protected:
  GroupCommunicator(std::string name, double timeout_s)
      : name_(std::move(name)), timeout_s_(timeout_s) {}

  void check_rank(int r, const char* what) const {
    STRATA_CHECK(r >= 0 && r < size_,
                 what << " " << r << " on group " << name_ << " of " << size_ << " ranks");
  }
  void check_counts(const std::vector<size_t>& counts, const char* what) const {
    STRATA_CHECK(counts.size() == static_cast<size_t>(size_),
                 what << " on group " << name_ << ": " << counts.size() << " counts for " << size_
                      << " ranks");
  }

  std::string name_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;  // [group rank]
  double timeout_s_;
};

}  // namespace strata

// MPI_CHECK(MPI_Isend(...)): on failure prints the call, file:line, rank, host and MPI's error
// string, then aborts the job. Communicators use MPI_ERRORS_RETURN so that errors reach it.
#define MPI_CHECK(expr)                                                       \
  do {                                                                        \
    const int strata_mpi_rc_ = (expr);                                        \
    if (strata_mpi_rc_ != MPI_SUCCESS) {                                      \
      ::strata::fatal(std::string("MPI call failed: " #expr ": ") +           \
                          ::strata::detail::mpi_error_string(strata_mpi_rc_), \
                      __FILE__, __LINE__);                                    \
    }                                                                         \
  } while (0)
