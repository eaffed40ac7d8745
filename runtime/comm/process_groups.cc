#include "runtime/comm/process_groups.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "runtime/base/check.h"
#include "runtime/base/error.h"

namespace strata {

RankCoord GroupLayout::coord(int world_rank) const {
  STRATA_CHECK(world_rank >= 0 && world_rank < world_size(),
               "world rank " << world_rank << " outside a world of " << world_size());
  RankCoord c;
  c.tp = world_rank % tensor;
  c.cp = (world_rank / tensor) % context;
  c.dp = (world_rank / (tensor * context)) % data;
  c.pp = world_rank / (tensor * context * data);
  c.replica = c.cp + context * c.dp;
  return c;
}

int GroupLayout::tp_group_of(int r) const {
  const RankCoord c = coord(r);
  return c.replica + context * data * c.pp;
}
int GroupLayout::dp_group_of(int r) const {
  const RankCoord c = coord(r);
  return c.tp + tensor * c.pp;
}
int GroupLayout::pp_group_of(int r) const {
  const RankCoord c = coord(r);
  return c.tp + tensor * c.replica;
}
int GroupLayout::mp_group_of(int r) const {
  return coord(r).replica;
}
int GroupLayout::embedding_group_of(int r) const {
  const RankCoord c = coord(r);
  if (c.pp != 0 && c.pp != pipeline - 1) return -1;
  return c.tp + tensor * c.replica;
}
int GroupLayout::cp_group_of(int r) const {
  const RankCoord c = coord(r);
  return c.tp + tensor * (c.dp + data * c.pp);
}

int GroupLayout::ep_group_of(int r) const {
  const RankCoord c = coord(r);
  return ((c.tp + tensor * c.pp) * context + c.cp) * (data / expert) + c.dp / expert;
}
int GroupLayout::edp_group_of(int r) const {
  const RankCoord c = coord(r);
  return (c.tp + tensor * c.pp) * expert + c.dp % expert;
}

GroupLayout group_layout(int t, int p, int d, int e, int cx) {
  STRATA_CHECK(t >= 1 && p >= 1 && d >= 1 && e >= 1 && cx >= 1 && d % e == 0,
               "parallel sizes must be >= 1 and expert must divide data: tensor "
                   << t << ", context " << cx << ", pipeline " << p << ", data " << d << ", expert "
                   << e);
  GroupLayout g;
  g.tensor = t;
  g.pipeline = p;
  g.data = d;
  g.expert = e;
  g.context = cx;
  const int reps = d * cx;
  if (e > 1) {
    g.ep_groups.assign(static_cast<size_t>(t * p * cx * (d / e)), {});
    g.edp_groups.assign(static_cast<size_t>(t * p * e), {});
  }
  if (cx > 1) g.cp_groups.assign(static_cast<size_t>(t * d * p), {});
  g.tp_groups.assign(static_cast<size_t>(reps * p), {});
  g.dp_groups.assign(static_cast<size_t>(t * p), {});
  g.pp_groups.assign(static_cast<size_t>(t * reps), {});
  g.mp_groups.assign(static_cast<size_t>(reps), std::vector<int>(static_cast<size_t>(t * p)));
  g.embedding_groups.assign(static_cast<size_t>(t * reps), {});
  // Appending in increasing world rank leaves every list in group-rank order.
  for (int r = 0; r < g.world_size(); ++r) {
    const RankCoord c = g.coord(r);
    g.tp_groups[static_cast<size_t>(g.tp_group_of(r))].push_back(r);
    g.dp_groups[static_cast<size_t>(g.dp_group_of(r))].push_back(r);
    g.pp_groups[static_cast<size_t>(g.pp_group_of(r))].push_back(r);
    g.mp_groups[static_cast<size_t>(g.mp_group_of(r))][static_cast<size_t>(c.tp + t * c.pp)] = r;
    if (c.pp == 0 || c.pp == p - 1)
      g.embedding_groups[static_cast<size_t>(g.embedding_group_of(r))].push_back(r);
    if (cx > 1) g.cp_groups[static_cast<size_t>(g.cp_group_of(r))].push_back(r);
    if (e > 1) {
      g.ep_groups[static_cast<size_t>(g.ep_group_of(r))].push_back(r);
      g.edp_groups[static_cast<size_t>(g.edp_group_of(r))].push_back(r);
    }
  }
  return g;
}

void ProcessGroups::set_compute_stream(void* stream) {
  for (auto* c : {&world, &tp, &dp, &pp, &mp, &embedding, &ep, &edp, &cp}) {
    if (*c) (*c)->set_compute_stream(stream);
  }
}

Transport choose_transport(Device tensors, int world_size, int ranks_per_host, int devices_per_host,
                           bool nccl_built, bool needs_buffered_sends) {
  Transport t;
  const CommBackend host = world_size == 1 ? CommBackend::kLocal : CommBackend::kMPI;
  const bool nccl = world_size > 1 && nccl_built && devices_per_host >= ranks_per_host;
  if (tensors == Device::kCPU) {
    t.backend = host;
  } else if (nccl && !needs_buffered_sends) {
    t.backend = CommBackend::kNCCL;
  } else {
    t.for_buffered_sends = nccl;
    t.backend = host;
    t.staged = true;
  }
  return t;
}

std::string to_string(const Transport& t) {
  std::string s = to_string(t.backend);
  if (t.staged) s += ", staged through host memory";
  if (t.for_buffered_sends)
    s += " (the pipeline schedule needs buffered sends, which NCCL's are not; docs/schedules.md)";
  return s;
}

ProcessGroups make_process_groups(int t, int p, int d, CommBackend backend, double timeout_s,
                                  std::shared_ptr<DeviceStaging> staging, int e, int cx) {
  const World& w = world();
  if (t < 1 || p < 1 || d < 1 || cx < 1 || t * cx * p * d != w.size) {
    std::ostringstream os;
    os << "tensor x " << (cx != 1 ? "context x " : "") << "pipeline x data = " << t << " x "
       << (cx != 1 ? std::to_string(cx) + " x " : "") << p << " x " << d << " = " << t * cx * p * d
       << " ranks, but the world has " << w.size << " ranks";
    throw InputError("<command line>", "parallel", os.str());
  }
  if (e < 1 || d % e != 0) {
    throw InputError("<command line>", "parallel.expert",
                     "expert " + std::to_string(e) + " must divide data " + std::to_string(d));
  }
  ProcessGroups g;
  g.tensor = t;
  g.pipeline = p;
  g.data = d;
  g.expert = e;
  g.context = cx;
  g.backend = backend;
  g.layout = group_layout(t, p, d, e, cx);
  const RankCoord c = g.layout.coord(w.rank);
  g.tp_rank = c.tp;
  g.dp_rank = c.dp;
  g.pp_rank = c.pp;
  g.cp_rank = c.cp;
  g.prev_stage_rank = c.pp > 0 ? g.layout.world_rank(c.tp, c.dp, c.pp - 1, c.cp) : -1;
  g.next_stage_rank = c.pp < p - 1 ? g.layout.world_rank(c.tp, c.dp, c.pp + 1, c.cp) : -1;

  const CommBackend host_backend = w.size == 1 ? CommBackend::kLocal : CommBackend::kMPI;
  g.host = make_world_communicator(host_backend, timeout_s);
  g.world = make_world_communicator(backend, timeout_s);
  if (staging) {
    STRATA_CHECK(backend != CommBackend::kNCCL, "staged groups over NCCL");
    g.world = make_staged_communicator(std::move(g.world), staging);
    g.staged = true;
  }
  // Every rank splits for every kind in the same order (split is collective over the world).
  // The key is the coordinate that orders the group, so group rank = that coordinate.
  Communicator& all = *g.world;
  g.tp = all.split(g.layout.tp_group_of(w.rank), c.tp, "tp");
  g.dp = all.split(g.layout.dp_group_of(w.rank), c.replica, "dp");
  g.pp = all.split(g.layout.pp_group_of(w.rank), c.pp, "pp");
  g.mp = all.split(g.layout.mp_group_of(w.rank), c.tp + t * c.pp, "mp");
  g.embedding = all.split(g.layout.embedding_group_of(w.rank), c.pp, "embedding");
  if (cx > 1) {
    g.cp = all.split(g.layout.cp_group_of(w.rank), c.cp, "cp");
    STRATA_CHECK(g.cp->size() == cx && g.cp->rank() == c.cp, "cp group of world rank " << w.rank);
  }
  g.ep_rank = c.dp % e;
  g.edp_rank = c.cp + cx * (c.dp / e);
  if (e > 1) {
    g.ep = all.split(g.layout.ep_group_of(w.rank), c.dp % e, "ep");
    g.edp = all.split(g.layout.edp_group_of(w.rank), g.edp_rank, "edp");
    STRATA_CHECK(g.ep->size() == e && g.ep->rank() == c.dp % e,
                 "ep group of world rank " << w.rank);
    STRATA_CHECK(g.edp->size() == cx * d / e && g.edp->rank() == g.edp_rank,
                 "edp group of world rank " << w.rank);
  }

  STRATA_CHECK(g.tp->size() == t && g.tp->rank() == c.tp, "tp group of world rank " << w.rank);
  STRATA_CHECK(g.dp->size() == d * cx && g.dp->rank() == c.replica,
               "dp group of world rank " << w.rank);
  STRATA_CHECK(g.pp->size() == p && g.pp->rank() == c.pp, "pp group of world rank " << w.rank);
  return g;
}

std::string rank_table(const ProcessGroups& g, const std::string& device_name) {
  STRATA_CHECK(g.host != nullptr, "rank_table before make_process_groups");
  const World& w = world();
  std::ostringstream mine;
  mine << g.tp_rank << ' ' << g.dp_rank << ' ' << g.pp_rank << ' ' << g.cp_rank << ' ' << w.host
       << ' ' << device_name;
  const std::vector<std::string> rows = all_gather_strings(*g.host, mine.str());
  if (w.rank != 0) return "";

  struct Row {
    int tp = 0, dp = 0, pp = 0, cp = 0;
    std::string host, device;
  };
  std::vector<Row> parsed(rows.size());
  size_t host_width = 4;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::istringstream is(rows[r]);
    is >> parsed[r].tp >> parsed[r].dp >> parsed[r].pp >> parsed[r].cp >> parsed[r].host >>
        parsed[r].device;
    host_width = std::max(host_width, parsed[r].host.size());
  }
  std::ostringstream os;
  os << "world " << w.size << " = tensor " << g.tensor;
  if (g.context > 1) os << " x context " << g.context;
  os << " x pipeline " << g.pipeline << " x data " << g.data;
  // With context or expert parallelism, each rank's place in those groups as columns.
  const bool cp = g.context > 1, ep = g.expert > 1;
  if (cp) os << ", context groups of " << g.context << " ranks";
  if (ep) os << ", expert groups of " << g.expert << " data ranks";
  os << " (backend " << to_string(Transport{g.backend, g.staged}) << ")\n";
  char line[512];
  std::snprintf(line, sizeof line, "%5s %4s%s %4s %4s%s  %-*s  %s\n", "rank", "tp",
                cp ? "   cp" : "", "dp", "pp", ep ? "   ep" : "", static_cast<int>(host_width),
                "host", "device");
  os << line;
  for (size_t r = 0; r < parsed.size(); ++r) {
    char context[16] = "", expert[16] = "";
    if (cp) std::snprintf(context, sizeof context, " %4d", parsed[r].cp);
    if (ep) std::snprintf(expert, sizeof expert, " %4d", parsed[r].dp % g.expert);
    std::snprintf(line, sizeof line, "%5zu %4d%s %4d %4d%s  %-*s  %s\n", r, parsed[r].tp, context,
                  parsed[r].dp, parsed[r].pp, expert, static_cast<int>(host_width),
                  parsed[r].host.c_str(), parsed[r].device.c_str());
    os << line;
  }
  return os.str();
}

ProcessGroups make_single_process_groups(double timeout_s, std::shared_ptr<DeviceStaging> staging) {
  ProcessGroups g;
  g.backend = CommBackend::kLocal;
  g.staged = staging != nullptr;
  g.layout = group_layout(1, 1, 1);
  const int r = world().rank;
  auto make = [&](const char* name) {
    std::unique_ptr<Communicator> c = detail::make_local_communicator(name, r, timeout_s);
    return staging ? make_staged_communicator(std::move(c), staging) : std::move(c);
  };
  g.host = detail::make_local_communicator("host", r, timeout_s);
  g.world = make("world");
  g.tp = make("tp");
  g.dp = make("dp");
  g.pp = make("pp");
  g.mp = make("mp");
  g.embedding = make("embedding");
  return g;
}

}  // namespace strata
