// saver.cc — CheckpointSaver (save.h): the save protocol of save.cc with its step 2, the
// shard write, on a writer thread, so that training goes on while the shard reaches the disk.
//
// Thread-safety: the training thread owns the saver; the writer thread touches only its
// Pending (the snapshot, the entry it returns, `written`), and the training thread reads the
// entry only after joining it.
#include <atomic>
#include <chrono>
#include <thread>

#include "runtime/checkpoint/checkpoint_internal.h"
#include "runtime/checkpoint/save.h"
#include "runtime/comm/watchdog.h"

namespace strata {
using namespace checkpoint_internal;

struct CheckpointSaver::Pending {
  int64_t number = 0;
  int iteration = 0;
  std::string tmp, final_dir;
  nlohmann::json run_state;
  RankShard shard;       // the snapshot; released by the writer once it is on disk
  nlohmann::json entry;  // the writer's result
  std::atomic<bool> written{false};
  double write_s = 0;
  std::thread writer;
};

CheckpointSaver::CheckpointSaver(Communicator& host, std::string dir, int keep, bool background)
    : host_(host), dir_(std::move(dir)), keep_(keep), background_(background) {}

CheckpointSaver::~CheckpointSaver() {
  // An unpublished save stays a temporary directory, which the next start removes.
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

int64_t CheckpointSaver::pending() const {
  return pending_ ? pending_->number : -1;
}

bool CheckpointSaver::writing() const {
  return pending_ && !pending_->written.load();
}

std::string CheckpointSaver::save(int iteration, RankShard mine, nlohmann::json run_state) {
  // A second save waits for the first: at most one snapshot in memory, saves in order.
  publish(pending());
  exit_if_orphaned();  // a rank whose launcher is gone stops before it writes anything
  auto p = std::make_unique<Pending>();
  p->number = saves_++;
  p->iteration = iteration;
  p->final_dir = dir_ + "/iter_" + std::to_string(iteration);
  p->tmp = make_save_dir(host_, dir_, p->final_dir);
  p->run_state = std::move(run_state);
  p->shard = std::move(mine);
  const int rank = host_.rank(), world = host_.size();
  Pending* raw = p.get();
  auto write = [raw, rank, world] {
    const auto t0 = std::chrono::steady_clock::now();
    raw->entry = write_shard(raw->tmp, rank, world, raw->iteration, raw->shard);
    raw->shard = RankShard();
    raw->write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    raw->written.store(true);
  };
  pending_ = std::move(p);
  if (!background_) {
    write();
    return publish(pending());
  }
  pending_->writer = std::thread(write);
  return "";
}

std::string CheckpointSaver::publish(int64_t save) {
  if (!pending_ || pending_->number != save) return "";
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->writer.joinable()) p->writer.join();
  last_write_s_ = p->write_s;
  return publish_save(host_, dir_, p->iteration, p->entry, p->run_state, keep_, p->tmp,
                      p->final_dir, extras_);
}

}  // namespace strata
