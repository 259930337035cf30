// Lanes of a span (span_client.h: SpanTarget::lanes, SpanClient::add_lane): more peers running the
// same blocks at once, each for its share of the sequences. A step's sequences are split by lane,
// every lane's trip is sent before the span's runner computes its own part, and the answers are
// put back in the step's order — one trip per lane and step, all in flight together. A sequence
// stays on the lane it was given (its state lives there); a lane that fails is dropped and its
// sequences go back to the runner, replayed from the input log, so the output is unchanged.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "moesh/remote/span_client.h"
#include "remote/span_client_internal.h"

namespace moesh {

Status SpanClient::star_lanes(int k, const std::vector<Part>& parts, const SpanBatch& b, std::vector<float>* rows) {
  Runner& r = *runners_[static_cast<size_t>(k)];
  const int64_t Din = width_in(k), Dout = width_out(k);
  MOESH_RETURN_IF_ERROR(round_to_wire(rows, Din));
  // Where each sequence runs. One placed (it ran here since its request started) stays. One not
  // placed — new, or starting a new request (a cut or a prefix copy unplaces it: on_truncate,
  // on_copy) — goes where the fewest placed sequences are, staying where its cells are (its lane,
  // or the runner when that holds it) unless another has fewer: balance for the streams to come,
  // at the price of replaying its cells there once.
  std::map<int, int64_t> load{{0, 0}};
  for (const auto& l : r.lanes) load[l->id] = 0;
  auto lane_of = [&](int32_t seq) {
    auto it = r.lane_of.find(seq);
    return it != r.lane_of.end() && load.count(it->second) != 0 ? it->second : -1;
  };
  for (int32_t seq : r.placed) {
    const int id = lane_of(seq);
    if (id >= 0) ++load[id];
  }
  for (const Part& p : parts) {
    int cur = lane_of(p.seq);
    if (cur >= 0 && r.placed.count(p.seq) != 0) continue;
    if (cur < 0) {
      auto held = r.has.find(p.seq);
      cur = p.n_before > 0 && held != r.has.end() && held->second > 0 ? 0 : -1;
    }
    int best = cur >= 0 ? cur : 0;
    for (const auto& [id, n] : load)
      if (n < load[best]) best = id;
    r.lane_of[p.seq] = best;
    r.placed.insert(p.seq);
    ++load[best];
  }
  {
    std::lock_guard<std::mutex> vl(view_mu_);
    for (auto& l : r.lanes) l->view.sequences = static_cast<uint64_t>(load[l->id]);
  }

  struct Group {
    int id = 0;
    SpanLane* lane = nullptr;  // null: the runner
    std::vector<Part> parts;
    std::vector<float> rows;  // the parts' inputs, then their outputs
    wire::SpanStepMsg m;
    uint64_t replayed = 0;
    net::Deadline deadline{};
    std::chrono::steady_clock::time_point t0{};
    Status st = Status::ok();
    bool pending = false;  // its trip is started and not yet answered
  };
  std::vector<Group> groups;
  std::vector<std::pair<size_t, int64_t>> at;  // per part: its group, its first row there
  int64_t o = 0;
  for (const Part& p : parts) {
    const int id = r.lane_of[p.seq];
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.id == id; });
    if (g == groups.end()) {
      groups.push_back(Group{});
      g = groups.end() - 1;
      g->id = id;
      g->lane = id == 0 ? nullptr : r.lane(id);
    }
    at.emplace_back(static_cast<size_t>(g - groups.begin()), rows_of(g->parts));
    g->parts.push_back(p);
    const int64_t n = static_cast<int64_t>(p.rows.size());
    g->rows.insert(g->rows.end(), rows->begin() + o * Din, rows->begin() + (o + n) * Din);
    o += n;
  }
  if (groups.size() == 1 && groups[0].id == 0) return star_one(k, parts, b, rows);
  const uint64_t steps_before = stats_.steps;
  // Whatever way this returns, no lane request is left waiting in its link's mux.
  struct CancelPending {
    std::vector<Group>& groups;
    ~CancelPending() {
      for (Group& g : groups)
        if (g.pending && g.lane != nullptr) g.lane->link->mux->cancel(g.m.request_id);
    }
  } cancel_pending{groups};

  // 1. Every lane's trip, in flight before the runner's part is computed.
  for (Group& g : groups) {
    if (g.id == 0) continue;
    WorkerLink& link = *g.lane->link;
    MOESH_ASSIGN_OR_RETURN(g.m,
                           step_message(k, g.parts, b, g.rows, &g.replayed, g.lane->has, link.mux->next_request_id()));
    g.deadline = net::deadline_in(opts_.timeout);
    g.t0 = std::chrono::steady_clock::now();
    g.st = start_trip(link, g.m, g.deadline, &stats_);
    ++stats_.trips;
    ++stats_.lane_trips;
    g.pending = g.st.is_ok();
  }
  // 2. The runner's part meanwhile (resends, failover: star_one). If it cannot be done the step
  //    fails; the lanes' answers are not waited for (what they computed is cut back by the next
  //    step, which starts from what the backbone knows they hold).
  for (Group& g : groups) {
    if (g.id != 0) continue;
    MOESH_RETURN_IF_ERROR(star_one(k, g.parts, b, &g.rows));
  }
  // 3. Each lane's answer (resent with replay when it lacks inputs). A lane that fails is dropped
  //    and its part runs on the runner: the step's output does not change.
  for (Group& g : groups) {
    if (g.id == 0) continue;
    Status st = g.st;
    wire::SpanResultMsg res;
    if (st.is_ok()) st = finish_trip(*g.lane->link, g.m.request_id, g.deadline, &res, &stats_);
    g.pending = false;
    for (int resends = 0; st.is_ok() && !res.need.empty();) {
      if (++resends > kSpanMaxResends) {
        st =
            make_error(StatusCode::kInternal, "{} still lacks inputs after {} resends", g.lane->label, kSpanMaxResends);
        break;
      }
      ++stats_.resends;
      for (const wire::SpanHave& hv : res.need) g.lane->has[hv.seq] = static_cast<int64_t>(hv.have);
      MOESH_ASSIGN_OR_RETURN(
          g.m, step_message(k, g.parts, b, g.rows, &g.replayed, g.lane->has, g.lane->link->mux->next_request_id()));
      ++stats_.trips;
      ++stats_.lane_trips;
      res = wire::SpanResultMsg{};
      st = link_trip(*g.lane->link, g.m, &res, &stats_);
    }
    const int64_t n = rows_of(g.parts);
    if (st.is_ok() && (res.rows.n_rows != static_cast<uint32_t>(n) || res.rows.n_cols != static_cast<uint32_t>(Dout))) {
      st = make_error(StatusCode::kCorrupt, "{}: SPAN_RESULT has {}x{} rows, the step sent {}x{}", g.lane->label,
                      res.rows.n_rows, res.rows.n_cols, n, Dout);
    }
    if (st.is_ok()) {
      {
        std::lock_guard<std::mutex> vl(view_mu_);
        note_trip(&g.lane->view, std::chrono::duration<double>(std::chrono::steady_clock::now() - g.t0).count(), g.m,
                  res);
      }
      MOESH_RETURN_IF_ERROR(accept(k, g.parts, b, res, &g.rows, &g.lane->has));
      stats_.replayed_rows += g.replayed;
      stats_.lane_rows += static_cast<uint64_t>(n);
      continue;
    }
    drop_failed_lane(r, g.id, st);
    g.lane = nullptr;
    MOESH_RETURN_IF_ERROR(star_one(k, g.parts, b, &g.rows));
  }
  stats_.steps = steps_before + 1;  // one span step, however many parts

  // 4. The outputs in the step's order.
  std::vector<float> out(static_cast<size_t>(rows_of(parts) * Dout));
  int64_t oo = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Group& g = groups[at[i].first];
    const int64_t n = static_cast<int64_t>(parts[i].rows.size());
    std::copy(g.rows.begin() + at[i].second * Dout, g.rows.begin() + (at[i].second + n) * Dout,
              out.begin() + oo * Dout);
    oo += n;
  }
  *rows = std::move(out);
  return Status::ok();
}

void SpanClient::drop_failed_lane(Runner& r, int id, const Status& why) {
  std::lock_guard<std::mutex> vl(view_mu_);
  auto it = std::find_if(r.lanes.begin(), r.lanes.end(), [&](const auto& l) { return l->id == id; });
  if (it == r.lanes.end()) return;
  int64_t moved = 0;
  for (auto& [seq, lid] : r.lane_of) {
    if (lid != id) continue;
    lid = 0;  // the runner's now: it is replayed there
    ++moved;
  }
  spdlog::warn("span {}-{}: lane {} failed ({}); its {} sequences go back to {}", r.target.span.first,
               r.target.span.last, (*it)->label, why.to_string(), moved, r.local ? std::string("here") : r.label);
  if ((*it)->link) (*it)->link->shut_down();
  r.lanes.erase(it);
  ++stats_.lane_failures;
}

Status SpanClient::add_lane(const LayerSpan& sp, const std::string& to) {
  std::lock_guard<std::mutex> one_move(move_mu_);  // spans_ and runners_ stay as they are
  if (to == "here") {
    return make_error(StatusCode::kInvalidArgument,
                      "a lane is another peer running the blocks (span {}-{} itself may run here)", sp.first, sp.last);
  }
  MOESH_ASSIGN_OR_RETURN(WorkerAddress addr, parse_worker_address(to));
  int k = -1;
  for (size_t i = 0; i < spans_.size(); ++i)
    if (spans_[i] == sp) k = static_cast<int>(i);
  if (k < 0) return make_error(StatusCode::kNotFound, "no span {}-{} to add a lane to", sp.first, sp.last);
  {
    std::lock_guard<std::mutex> vl(view_mu_);
    const Runner& r = *runners_[static_cast<size_t>(k)];
    if (!r.view.local && r.view.address == addr.to_string()) {
      return make_error(StatusCode::kInvalidArgument, "{} runs span {}-{} already", to, sp.first, sp.last);
    }
    for (const auto& l : r.lanes) {
      if (l->addr.to_string() == addr.to_string()) {
        return make_error(StatusCode::kInvalidArgument, "{} is a lane of span {}-{} already", to, sp.first, sp.last);
      }
    }
  }
  MOESH_ASSIGN_OR_RETURN(NewRunner nr, dial(sp, to));
  auto lane = std::make_unique<SpanLane>();
  lane->addr = nr.addr;
  lane->link = std::move(nr.link);
  lane->label = nr.label;
  lane->loaded = nr.loaded;
  lane->view = view_of(sp, lane->label, lane->link.get());
  const std::string label = lane->label;
  size_t n_lanes = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::lock_guard<std::mutex> vl(view_mu_);
    Runner& r = *runners_[static_cast<size_t>(k)];
    // The sequences running now stay on the runner (their state is there), and count as its.
    for (const auto& [seq, log] : logs_) {
      if (static_cast<size_t>(k) < log.chain.size() && !log.chain[static_cast<size_t>(k)].empty() &&
          r.lane_of.count(seq) == 0) {
        r.lane_of[seq] = 0;
        r.placed.insert(seq);
      }
    }
    lane->id = r.next_lane_id++;
    r.lanes.push_back(std::move(lane));
    n_lanes = r.lanes.size();
    ++stats_.lanes_added;
    if (nr.loaded) ++stats_.loads;
  }
  spdlog::info("span {}-{}: {} is lane {} (new sequences go to the lane or runner with the fewest)", sp.first, sp.last,
               label, n_lanes);
  forget_running_idle();
  return Status::ok();
}

Status SpanClient::drop_lane(const LayerSpan& sp, const std::string& address) {
  std::lock_guard<std::mutex> one_move(move_mu_);
  MOESH_ASSIGN_OR_RETURN(WorkerAddress addr, parse_worker_address(address));
  std::unique_ptr<SpanLane> gone;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::lock_guard<std::mutex> vl(view_mu_);
    for (auto& r : runners_) {
      if (!(r->target.span == sp)) continue;
      auto it = std::find_if(r->lanes.begin(), r->lanes.end(),
                             [&](const auto& l) { return l->addr.to_string() == addr.to_string(); });
      if (it == r->lanes.end()) break;
      for (auto& [seq, id] : r->lane_of)
        if (id == (*it)->id) id = 0;
      gone = std::move(*it);
      r->lanes.erase(it);
    }
  }
  if (!gone) return make_error(StatusCode::kNotFound, "span {}-{} has no lane at {}", sp.first, sp.last, address);
  spdlog::info("span {}-{}: lane {} let go (its sequences go back to the span's runner)", sp.first, sp.last,
               gone->label);
  if (let_go(sp, std::move(gone->link))) {
    std::lock_guard<std::mutex> again(mu_);
    ++stats_.drops;
  }
  return Status::ok();
}

std::vector<SpanPeerView> SpanClient::lanes_view() const {
  std::lock_guard<std::mutex> lk(view_mu_);
  std::vector<SpanPeerView> out;
  for (const auto& r : runners_) {
    for (const auto& l : r->lanes) out.push_back(l->view);
  }
  return out;
}

}  // namespace moesh
