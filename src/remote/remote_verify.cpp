// Lying-worker detection (RemoteOptions::verify_rate): a sampled request is recomputed on the
// backbone, or — for a backbone slice — on a second holder, a third deciding a disagreement.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>

#include "remote/remote_executor_internal.h"

namespace moesh {

namespace {
// The largest difference between two results of the same request, relative to each row's
// magnitude, counting only differences beyond `tol` (0: every bit counts); NaN counts as infinite.
double result_difference(const std::vector<float>& want, const std::vector<float>& got, int64_t D, double tol) {
  if (want.size() != got.size()) return INFINITY;
  double worst = 0;
  const size_t rows = want.size() / static_cast<size_t>(D);
  for (size_t i = 0; i < rows; ++i) {
    const float* a = want.data() + i * D;
    const float* b = got.data() + i * D;
    float mag = 0;
    for (int64_t d = 0; d < D; ++d) mag = std::max(mag, std::fabs(a[d]));
    for (int64_t d = 0; d < D; ++d) {
      const double diff = std::fabs(static_cast<double>(a[d]) - b[d]);
      if (tol == 0 ? std::memcmp(&a[d], &b[d], sizeof(float)) != 0 : !(diff <= tol * mag))
        worst = std::max(worst, std::isnan(diff) ? INFINITY : diff / std::max(mag, 1e-30f));
    }
  }
  return worst;
}
}  // namespace

double RemoteExecutor::Impl::verify_tolerance_for(int w, int layer) const {
  if (opts.verify_tolerance > 0) return opts.verify_tolerance;
  const bool exact_rows = opts.combine == wire::CombineMode::kExact && opts.return_wire == wire::WireDType::kF32 &&
                          hidden_dtype(static_cast<size_t>(w), layer) == wire::WireDType::kF32;
  return exact_rows ? 0.0 : (hidden_dtype(static_cast<size_t>(w), layer) == wire::WireDType::kF32 ? 0.02 : 0.1);
}

void RemoteExecutor::Impl::evict(Job& job, int w, const std::string& why) {
  ++fo.mismatches;
  ++fo.evictions;
  health[static_cast<size_t>(w)].evicted = true;
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    ++workers[static_cast<size_t>(w)].mismatches;
    workers[static_cast<size_t>(w)].evicted = true;
  }
  // Whatever it returned in this call is not used: failover recomputes those pairs.
  for (size_t i = 0; i < job.n_reqs; ++i)
    if (job.reqs[i].worker == w) job.reqs[i].failed = true;
  spdlog::error("remote executor: {}", why);
}

std::vector<int> RemoteExecutor::Impl::checkers(const Job& job, const Request& r, int skip) const {
  std::vector<int> out;
  const Placement& p = planner.placement();
  for (size_t w = 0; w < fan->size(); ++w) {
    const int wi = static_cast<int>(w);
    if (wi == r.worker || wi == skip || health[w].down || health[w].evicted || planner.excluded(wi)) continue;
    bool holds = true;
    for (const wire::ExpertPair& pr : r.msg.pairs) {
      const auto hs = p.holders(job.layer, static_cast<int>(pr.expert));
      if (std::find(hs.begin(), hs.end(), wi) == hs.end()) {
        holds = false;
        break;
      }
    }
    if (holds) out.push_back(wi);
  }
  return out;
}

Result<std::vector<float>> RemoteExecutor::Impl::recompute_on(Job& job, const Request& r, int c) {
  wire::DispatchMsg m = r.msg;  // the same pairs; the hidden rows are encoded again for c
  const size_t nt = r.tokens.size();
  rows_f32.resize(nt * static_cast<size_t>(n_embd));
  for (size_t j = 0; j < nt; ++j)
    std::copy_n(job.x + static_cast<int64_t>(r.tokens[j]) * n_embd, n_embd, rows_f32.data() + j * n_embd);
  MOESH_ASSIGN_OR_RETURN(m.hidden, wire::encode_rows(hidden_dtype(static_cast<size_t>(c), job.layer), rows_f32.data(),
                                                     static_cast<uint32_t>(nt), static_cast<uint32_t>(n_embd)));
  m.request_id = fan->next_request_id(static_cast<size_t>(c));
  MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> frame, wire::encode_dispatch(m));
  const WorkerLink& link = fan->link(static_cast<size_t>(c));
  const net::Deadline deadline = net::deadline_in(opts.timeout);
  MOESH_RETURN_IF_ERROR(fan->start(static_cast<size_t>(c), m.request_id, frame, deadline));
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    ++workers[static_cast<size_t>(c)].requests;
    workers[static_cast<size_t>(c)].bytes_sent += frame.size();
  }
  const FanOut::Outstanding one{static_cast<size_t>(c), m.request_id};
  Result<std::vector<float>> out = Status(StatusCode::kInternal, "no reply");
  fan->gather(std::span<const FanOut::Outstanding>(&one, 1), deadline, [&](FanOut::Reply&& rep) {
    if (!rep.frame) {
      out = rep.frame.status();
      return;
    }
    std::lock_guard<std::mutex> lk(worker_mu);
    WorkerTraffic& wt = workers[static_cast<size_t>(c)];
    wt.bytes_received += wire::kHeaderBytes + rep.frame->payload.size();
    auto reply = wire::decode_combine(*rep.frame, link.limits);
    if (!reply) {
      out = reply.status();
      return;
    }
    reply->request_id = rep.frame->request_id();
    if (Status st = wire::check_combine_matches(m, *reply); !st.is_ok()) {
      out = st;
      return;
    }
    std::vector<float> rows(static_cast<size_t>(reply->rows.n_rows) * static_cast<size_t>(n_embd));
    wire::decode_rows(reply->rows, rows.data());
    ++wt.completed;
    wt.pairs += m.pairs.size();
    wt.tokens += reply->rows.n_rows;
    wt.compute_sum_seconds += reply->compute_us * 1e-6;
    out = std::move(rows);
  });
  if (!out) note_error(c);
  return out;
}

Status RemoteExecutor::Impl::verify(Job& job, size_t q) {
  Request& r = job.reqs[q];
  const RoutingPlan& plan = *job.plan;
  const int k = plan.k;
  const size_t n = r.slots.size();
  if (n == 0) return Status::ok();
  // The backbone's own copy of every expert of the request, else a second replica checks it.
  lids.resize(n);
  for (size_t i = 0; i < n; ++i) {
    lids[i] = mine->slot(job.layer, plan.ids[r.slots[i]]);
    if (lids[i] < 0) return verify_on_replica(job, q);
  }
  xl.resize(n * static_cast<size_t>(n_embd));
  lw.assign(n, 1.0f);
  for (size_t i = 0; i < n; ++i)
    std::copy_n(job.x + static_cast<int64_t>(r.slots[i] / k) * n_embd, n_embd, xl.data() + i * n_embd);
  MOESH_RETURN_IF_ERROR(
      make_plan(job.layer, lids.data(), lw.data(), static_cast<int64_t>(n), 1, n_expert, &local_plan));
  auto res = local->wait(local->submit(job.layer, xl.data(), static_cast<int64_t>(n), local_plan));
  if (!res) return res.status().with_context("verifying a worker's result");
  // What the worker should have returned: the raw outputs (exact), or per token the weighted sum
  // of its pairs in rank order (partial).
  const int64_t D = n_embd;
  const bool exact = r.msg.mode == wire::CombineMode::kExact;  // prefix-sum requests went as PARTIAL
  if (exact) {
    verify_rows.assign(res->begin(), res->end());
  } else {
    verify_rows.assign(r.tokens.size() * static_cast<size_t>(D), 0.0f);
    size_t j = 0;
    for (size_t i = 0; i < n; ++i) {
      while (r.tokens[j] != r.slots[i] / k) ++j;
      const bool first = i == 0 || r.slots[i - 1] / k != r.slots[i] / k;
      rank_sum_step(verify_rows.data() + j * D, res->data() + i * D, plan.weights[r.slots[i]], D, first);
    }
  }
  const double tol = verify_tolerance_for(r.worker, job.layer);
  const double worst = result_difference(verify_rows, r.rows, D, tol);
  ++fo.verified;
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    ++workers[r.worker].verified;
  }
  if (worst == 0) return Status::ok();
  Status st = make_error(StatusCode::kCorrupt,
                         "{}: result differs from the backbone's recomputation (largest difference {:.3g} of the row's "
                         "magnitude, tolerance {:.3g}); worker evicted",
                         where(job, r), worst, tol);
  evict(job, r.worker, st.message());
  return st;
}

// A backbone without the weights (a backbone slice) asks another holder: the same pairs, the same
// rows. Two workers computing the same request agree bit for bit (the numerics contract), so any
// difference means one of them is wrong; a third holder decides which, and the odd one out is
// evicted. With no third holder the call fails rather than go on with an answer that may be wrong.
Status RemoteExecutor::Impl::verify_on_replica(Job& job, size_t q) {
  const Request& r = job.reqs[q];
  std::vector<int> cands = checkers(job, r, -1);
  if (cands.empty()) {
    ++fo.unverifiable;
    return Status::ok();
  }
  const int c = cands[static_cast<size_t>(verify_rng() % cands.size())];
  auto theirs = recompute_on(job, r, c);
  if (!theirs) {  // the checker failing is not the checked worker's fault
    ++fo.unverifiable;
    spdlog::warn("remote executor: verifying {} on {} failed: {}", where(job, r),
                 fan->link(static_cast<size_t>(c)).label, theirs.status().to_string());
    return Status::ok();
  }
  const int64_t D = n_embd;
  // Same dtypes both ways: bit for bit; otherwise within the wire's tolerance.
  const double tol =
      hidden_dtype(static_cast<size_t>(c), job.layer) == hidden_dtype(static_cast<size_t>(r.worker), job.layer) &&
              opts.verify_tolerance <= 0
          ? 0.0
          : verify_tolerance_for(r.worker, job.layer);
  const double diff = result_difference(*theirs, r.rows, D, tol);
  ++fo.verified;
  {
    std::lock_guard<std::mutex> lk(worker_mu);
    ++workers[r.worker].verified;
  }
  if (diff == 0) return Status::ok();
  const std::string subject = fan->link(static_cast<size_t>(r.worker)).label;
  const std::string checker = fan->link(static_cast<size_t>(c)).label;
  std::vector<int> thirds = checkers(job, r, c);
  if (thirds.empty()) {
    ++fo.mismatches;
    return make_error(StatusCode::kCorrupt,
                      "{}: the results of {} and {} differ (largest difference {:.3g} of the row's magnitude) and no "
                      "third holder of these experts can tell which is right; the call fails rather than use either",
                      where(job, r), subject, checker, diff);
  }
  const int t = thirds[static_cast<size_t>(verify_rng() % thirds.size())];
  auto third = recompute_on(job, r, t);
  if (!third)
    return make_error(StatusCode::kCorrupt, "{}: {} and {} differ and the third holder {} failed: {}", where(job, r),
                      subject, checker, fan->link(static_cast<size_t>(t)).label, third.status().to_string());
  const bool subject_right = result_difference(*third, r.rows, D, tol) == 0;
  const bool checker_right = result_difference(*third, *theirs, D, tol) == 0;
  if (subject_right == checker_right)
    return make_error(StatusCode::kCorrupt, "{}: {}, {} and {} give three different results", where(job, r), subject,
                      checker, fan->link(static_cast<size_t>(t)).label);
  const int liar = subject_right ? c : r.worker;
  Status st = make_error(StatusCode::kCorrupt,
                         "{}: {} disagrees with {} and {} (largest difference {:.3g} of the row's magnitude); worker "
                         "evicted",
                         where(job, r), fan->link(static_cast<size_t>(liar)).label,
                         fan->link(static_cast<size_t>(liar == c ? r.worker : c)).label,
                         fan->link(static_cast<size_t>(t)).label, diff);
  evict(job, liar, st.message());
  // Only when a request of this call is now failed does the call need failover.
  for (size_t i = 0; i < job.n_reqs; ++i)
    if (job.reqs[i].failed) return st;
  return Status::ok();
}

}  // namespace moesh
