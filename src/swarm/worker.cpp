// The worker server: an accept loop, one reader thread per backbone connection, and one shared
// compute pool used by one pass at a time (a request already uses every core, so running two at
// once would only interleave them). Requests that queue behind a pass are batched: the reader
// thread that finds the pool free takes the oldest waiting request and every other waiting one for
// the same layer, computes them together and hands each its outcome (detail::compute_batch).
//
// Each connection: HELLO handshake as acceptor, then frames until the peer leaves. A frame that
// fails header/checksum validation leaves the stream unreadable: ERROR MALFORMED (id 0) + close.
// A well-framed but invalid request gets ERROR with its id and the connection stays usable.
// FETCH (a backbone copying one expert's weights) is answered on the connection's own thread: it
// is a copy of mapped bytes, not compute.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "moesh/net/tls.h"
#include "moesh/net/transport.h"
#include "moesh/net/websocket.h"
#include "moesh/swarm/span_chain.h"
#include "moesh/swarm/span_host.h"
#include "moesh/util/process.h"
#include "swarm/worker_internal.h"

namespace moesh::swarm {

using namespace std::chrono_literals;

namespace {
constexpr auto kPollSlice = 100ms;  // how often idle loops look at the stop flag
constexpr auto kHandshakeTimeout = 5s;
constexpr auto kSendTimeout = 10s;
// A large reply on a slow link takes longer than kSendTimeout (16 MB of COMBINE is 13 s at
// 10 Mbit/s): its send may take as long as the link's floor rate of 1 Mbit/s needs, on top.
net::Deadline send_deadline(size_t bytes) {
  return net::deadline_in(kSendTimeout + std::chrono::milliseconds(static_cast<int64_t>(bytes / 125)));
}
}  // namespace

namespace {
// A dial-out connection is the worker's only way in, so it checks the path itself: after a
// quarter of the idle timeout without a frame it PINGs (the backbone's reader or the relay
// answers), and after the whole of it the connection is taken for dead.
struct Heartbeat {
  explicit Heartbeat(std::chrono::milliseconds idle_timeout)
      : idle(idle_timeout), last_frame(net::Clock::now()), last_ping(last_frame) {}
  void heard() { last_frame = net::Clock::now(); }
  // false: silent past the idle timeout.
  bool tick(net::Connection& conn) {
    const auto now = net::Clock::now();
    if (now - last_frame > idle) return false;
    if (now - last_frame > idle / 4 && now - last_ping > idle / 4) {
      last_ping = now;
      auto ping = wire::encode_ping(
          {.request_id = ++id, .send_time_ns = static_cast<uint64_t>(now.time_since_epoch().count())});
      if (ping) (void)conn.send_frame(*ping, net::deadline_in(kSendTimeout));
    }
    return true;
  }
  std::chrono::milliseconds idle;
  net::Clock::time_point last_frame, last_ping;
  uint64_t id = 0;
};
}  // namespace

struct Worker::Impl {
  ExpertStore* store = nullptr;
  // Lookups in the store (compute, FETCH, HELLO) hold it shared; absorbing a replica holds it
  // exclusively, so a pass never sees the block table change under it.
  mutable std::shared_mutex store_mu;
  WorkerOptions opts;
  std::unique_ptr<net::TcpListener> listener;
  std::unique_ptr<ThreadPool> pool;
  // The compute queue: requests wait here; one reader at a time (the one that finds `computing`
  // false) runs a pass for the oldest and the requests it can batch with, then wakes the rest.
  struct Job {
    const wire::DispatchMsg* req = nullptr;
    bool has_deadline = false;
    net::Clock::time_point deadline;
    detail::ComputeOutcome out;
    bool done = false;
    size_t backbone = 0;  // its ledger slot: which backbone asked
  };
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<Job*> queue;
  bool computing = false;
  detail::ComputeScratch scratch;      // the computing reader's
  std::atomic<bool> stop_flag{false};  // lock-free, so a signal handler may set it
  WorkerStats stats;

  // --emulate-speed F: a pass that took `us` here takes us / F on the machine emulated.
  void emulate_slower(uint64_t us) const {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(us * (1 / opts.emulate_speed - 1))));
  }
  uint32_t slower_us(uint32_t us) const {
    return static_cast<uint32_t>(std::min<double>(us / opts.emulate_speed, UINT32_MAX));
  }

  struct Peer {
    std::unique_ptr<net::ByteStream> raw;  // not yet a connection: TLS (if any) is set up by serve()
    bool accepted = false;                 // from the listener: TCP or WebSocket, told by its first bytes
    std::unique_ptr<net::Connection> conn;
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  std::mutex peers_mu;
  std::list<Peer> peers;

  // XXH3-64 of the gate/up/down slabs of each expert fetched so far: the mapped bytes never
  // change, so each is hashed once however often it is fetched.
  std::mutex hash_mu;
  std::map<std::pair<uint32_t, uint32_t>, std::array<uint64_t, 3>> slab_hashes;

  // The work ledger, one entry per backbone name (kept across its reconnections).
  mutable std::mutex ledger_mu;
  std::vector<LedgerEntry> ledger;
  // Dial-out threads (--join), one per target.
  std::vector<std::thread> joiners;

  bool stopping() const { return stop_flag.load(std::memory_order_relaxed); }
  // Serves one connection until it ends; false when the handshake failed. `idle_timeout` > 0:
  // the connection is dropped when nothing arrives for that long (joined connections).
  bool serve(Peer* peer, std::chrono::milliseconds idle_timeout = std::chrono::milliseconds(0));
  void join_loop(std::string host, uint16_t port, bool websocket);
  enum class JoinOutcome { kFailed, kServed, kSpliced };
  JoinOutcome join_once(const std::string& host, uint16_t port, bool websocket);
  void end_session(size_t led, net::Clock::time_point connected_at);
  size_t ledger_slot(const std::string& peer_name, const std::string& address);
  void handle_dispatch(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                       uint32_t max_send_bytes, size_t led);
  void handle_fetch(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                    const wire::Session& session, size_t led);
  void handle_store(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                    const wire::Session& session);
  // UNSTORE -> UNSTORED: lets go of a replica (unmapped, its file deleted).
  void handle_unstore(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                      const wire::Session& session);
  bool offers_store() const { return !opts.replica_dir.empty() && opts.replica_budget_bytes > 0; }
  // INFO -> INFO_REPLY: what this worker offers, for the backbone's registry.
  void handle_info(net::Connection& conn, const wire::Frame& f);
  // PROBE -> PROBE_REPLY: its TCP round trip to each address asked about (peer-to-peer RTTs).
  void handle_probe(net::Connection& conn, const wire::Frame& f);
  void handle_span(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                   const wire::Session& session);
  void handle_span_await(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                         const wire::Session& session);
  // SPAN_HOLD -> SPAN_HELD: load or let go of blocks (span_host.h SpanHosts), or list them.
  void handle_span_hold(net::Connection& conn, const wire::Frame& f, const wire::Session& session);
  // Chained spans: forwarded steps' results meet the backbones' SPAN_AWAITs here.
  SpanAwaits span_awaits;
  net::Clock::time_point started = net::Clock::now();
  // Maps the replicas a previous run left in opts.replica_dir.
  Status load_replicas();
  std::mutex replica_mu;  // one STORE at a time: budget and file names
  void reap(bool all);
  // Queues the job and returns once it is done (possibly computed by another reader's pass).
  void compute(Job* job);
  void run_pass(std::unique_lock<std::mutex>& lk);
};

void Worker::Impl::compute(Job* job) {
  std::unique_lock<std::mutex> lk(queue_mu);
  queue.push_back(job);
  queue_cv.notify_all();  // a pass holding back for its batch window may want it
  while (!job->done) {
    if (computing) {
      queue_cv.wait(lk);
    } else {
      run_pass(lk);
    }
  }
}

void Worker::Impl::run_pass(std::unique_lock<std::mutex>& lk) {
  computing = true;
  if (opts.batch_window.count() > 0) {
    // Hold back for more requests of the head's layer: until every connected backbone has one
    // waiting (nobody else can join the batch), the batch is full, or the window ends.
    size_t connected = 0;
    {
      std::lock_guard<std::mutex> lk2(ledger_mu);
      for (const LedgerEntry& e : ledger) connected += e.connected ? 1 : 0;
    }
    const auto until = net::Clock::now() + opts.batch_window;
    auto full = [&] {
      uint64_t rows = 0;
      std::vector<size_t> who;
      for (Job* j : queue) {
        if (!detail::can_batch(*queue.front()->req, *j->req)) continue;
        rows += j->req->n_tokens();
        if (std::find(who.begin(), who.end(), j->backbone) == who.end()) who.push_back(j->backbone);
      }
      return stopping() || rows >= opts.max_batch_tokens || who.size() >= connected;
    };
    queue_cv.wait_until(lk, until, full);
  }
  // The oldest request and every waiting one it batches with, up to the token cap.
  std::vector<Job*> batch;
  uint64_t rows = 0;
  const wire::DispatchMsg& head = *queue.front()->req;
  for (auto it = queue.begin(); it != queue.end();) {
    const wire::DispatchMsg& r = *(*it)->req;
    if (detail::can_batch(head, r) && (batch.empty() || rows + r.n_tokens() <= opts.max_batch_tokens)) {
      rows += r.n_tokens();
      batch.push_back(*it);
      it = queue.erase(it);
    } else {
      ++it;
    }
  }
  lk.unlock();
  // Requests that cannot run are answered without compute; the rest share one pass.
  std::vector<Job*> run;
  std::vector<const wire::DispatchMsg*> reqs;
  const auto now = net::Clock::now();
  for (Job* j : batch) {
    if (stopping()) {
      j->out.error = wire::WireError::kShuttingDown;
      j->out.text = "worker is shutting down";
    } else if (j->has_deadline && now >= j->deadline) {
      j->out.error = wire::WireError::kDeadlineExceeded;
      j->out.text = fmt::format("deadline of {} ms passed while queued", j->req->deadline_ms);
    } else {
      run.push_back(j);
      reqs.push_back(j->req);
    }
  }
  if (!run.empty()) {
    std::vector<detail::ComputeOutcome> outs;
    {
      std::shared_lock<std::shared_mutex> held(store_mu);
      outs = detail::compute_batch(*store, reqs, &scratch, pool.get());
    }
    stats.computes.fetch_add(1);
    if (run.size() > 1) stats.batched.fetch_add(run.size());
    if (opts.emulate_speed < 1) {
      uint64_t us = 0;  // the pass's time (a batch's requests each carry their share)
      for (detail::ComputeOutcome& o : outs) us += o.combine.compute_us;
      emulate_slower(us);
      for (detail::ComputeOutcome& o : outs) o.combine.compute_us = slower_us(o.combine.compute_us);
    }
    const auto end = net::Clock::now();
    for (size_t i = 0; i < run.size(); ++i) {
      Job* j = run[i];
      j->out = std::move(outs[i]);
      if (j->out.ok && j->has_deadline && end > j->deadline) {
        j->out.ok = false;
        j->out.error = wire::WireError::kDeadlineExceeded;
        j->out.text = fmt::format("computing took longer than the {} ms deadline", j->req->deadline_ms);
      }
    }
  }
  lk.lock();
  for (Job* j : batch) j->done = true;
  computing = false;
  queue_cv.notify_all();
}

size_t Worker::Impl::ledger_slot(const std::string& peer_name, const std::string& address) {
  std::lock_guard<std::mutex> lk(ledger_mu);
  size_t i = 0;
  while (i < ledger.size() && ledger[i].peer != peer_name) ++i;
  if (i == ledger.size()) ledger.emplace_back().peer = peer_name;
  ledger[i].address = address;
  ledger[i].connected = true;
  return i;
}

void Worker::Impl::handle_dispatch(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                                   uint32_t max_send_bytes, size_t led) {
  const auto received = net::Clock::now();
  stats.dispatches.fetch_add(1);
  {
    std::lock_guard<std::mutex> lk(ledger_mu);
    ++ledger[led].requests;
    ledger[led].dispatch_bytes += wire::kHeaderBytes + f.payload.size();
  }
  auto note_error = [&] {
    stats.errors.fetch_add(1);
    std::lock_guard<std::mutex> lk(ledger_mu);
    ++ledger[led].errors;
  };
  auto req = wire::decode_dispatch(f, lim);
  if (!req) {
    note_error();
    net::send_error(conn, f.request_id(), wire::WireError::kMalformed, req.status().message(),
                    net::deadline_in(kSendTimeout));
    return;
  }
  const bool has_deadline = req->deadline_ms != 0;
  const auto deadline = received + std::chrono::milliseconds(req->deadline_ms);
  Job job;
  job.req = &*req;
  job.has_deadline = has_deadline;
  job.deadline = deadline;
  job.backbone = led;
  compute(&job);
  detail::ComputeOutcome& out = job.out;
  if (out.ok) {
    auto frame = wire::encode_combine(out.combine);
    if (frame && frame->size() - wire::kHeaderBytes <= max_send_bytes) {
      // The backbone waits for this reply until the request's deadline, so sending may take
      // that long too.
      net::Deadline d = send_deadline(frame->size());
      if (has_deadline) d = std::max(d, deadline);
      // Counted before sending: the backbone may read the ledger as soon as the reply is in.
      {
        std::lock_guard<std::mutex> lk(ledger_mu);
        LedgerEntry& e = ledger[led];
        ++e.dispatches;
        e.pairs += req->pairs.size();
        e.tokens += out.combine.rows.n_rows;
        e.combine_bytes += frame->size();
        e.compute_seconds += out.combine.compute_us * 1e-6;
      }
      if (Status st = conn.send_frame(*frame, d); !st.is_ok()) {
        std::lock_guard<std::mutex> lk(ledger_mu);
        LedgerEntry& e = ledger[led];
        --e.dispatches;
        e.pairs -= req->pairs.size();
        e.tokens -= out.combine.rows.n_rows;
        e.combine_bytes -= frame->size();
        e.compute_seconds -= out.combine.compute_us * 1e-6;
        ++e.errors;
      }
      return;
    }
    out.error = wire::WireError::kInternal;
    out.text = frame ? "COMBINE exceeds the peer's frame limit" : frame.status().message();
  }
  note_error();
  spdlog::debug("request {} failed: {} {}", req->request_id, wire::wire_error_name(uint16_t(out.error)), out.text);
  net::send_error(conn, req->request_id, out.error, out.text, net::deadline_in(kSendTimeout));
}

void Worker::Impl::handle_fetch(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                                const wire::Session& session, size_t led) {
  stats.fetches.fetch_add(1);
  auto fail = [&](wire::WireError code, const std::string& text) {
    stats.errors.fetch_add(1);
    {
      std::lock_guard<std::mutex> lk(ledger_mu);
      ++ledger[led].errors;
    }
    spdlog::debug("FETCH {} failed: {} {}", f.request_id(), wire::wire_error_name(uint16_t(code)), text);
    net::send_error(conn, f.request_id(), code, text, net::deadline_in(kSendTimeout));
  };
  auto req = wire::decode_fetch(f, lim);
  if (!req) return fail(wire::WireError::kMalformed, req.status().message());
  // Like a dtype, a feature is only used when both HELLOs offered it.
  if ((session.features & wire::kFeatureFetch) == 0)
    return fail(wire::WireError::kUnsupported, "FETCH was not negotiated (the backbone's HELLO lacks the feature)");
  if (!store->shape().is_moe(req->layer))
    return fail(wire::WireError::kNotHeld, fmt::format("layer {} has no routed experts", req->layer));
  // Under the lookups' lock until the slabs are copied into the message: an UNSTORE may unmap a
  // replica as soon as it is released.
  std::shared_lock<std::shared_mutex> held(store_mu);
  const ExpertStore::Slot slot = store->find(req->layer, req->expert);
  if (slot.weights == nullptr) {
    const std::string held_text = store->held().to_string();
    held.unlock();
    return fail(wire::WireError::kNotHeld, fmt::format("layer {} expert {} is not held by this worker (it holds {})",
                                                       req->layer, req->expert, held_text));
  }
  const TensorView* views[3] = {&slot.weights->gate, &slot.weights->up, &slot.weights->down};
  const uint8_t* data[3];
  size_t n[3];
  for (int t = 0; t < 3; ++t) {
    data[t] = views[t]->data + expert_slab_offset(*views[t], slot.index);
    n[t] = expert_slab_bytes(*views[t]);
  }
  // Checked before copying anything: an expert too large for one frame cannot be fetched.
  const size_t payload = wire::slab_payload_bytes(n[0], n[1], n[2]);
  if (payload > session.max_send_bytes) {
    held.unlock();
    return fail(wire::WireError::kUnsupported,
                fmt::format("SLAB of layer {} expert {} is {} bytes, over the backbone's frame limit of {}", req->layer,
                            req->expert, payload, session.max_send_bytes));
  }
  std::array<uint64_t, 3> hashes;
  {
    std::lock_guard<std::mutex> lock(hash_mu);
    auto [it, fresh] = slab_hashes.try_emplace({req->layer, req->expert});
    if (fresh)
      for (int t = 0; t < 3; ++t) it->second[t] = slab_hash(data[t], n[t]);
    hashes = it->second;
  }
  wire::SlabMsg m = slab_of(*slot.weights, slot.index, req->layer, req->expert, &hashes);
  held.unlock();
  m.request_id = req->request_id;
  auto frame = wire::encode_slab(m);
  if (!frame) return fail(wire::WireError::kInternal, frame.status().message());
  if (conn.send_frame(*frame, send_deadline(frame->size())).is_ok()) {
    std::lock_guard<std::mutex> lk(ledger_mu);
    ++ledger[led].fetches;
    ledger[led].fetch_bytes += frame->size();
  }
}

void Worker::Impl::handle_store(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                                const wire::Session& session) {
  auto refuse = [&](wire::WireError code, const std::string& text) {
    stats.store_refusals.fetch_add(1);
    spdlog::warn("{}: STORE {} refused: {}", conn.describe(), f.request_id(), text);
    net::send_error(conn, f.request_id(), code, text, net::deadline_in(kSendTimeout));
  };
  if ((session.features & wire::kFeatureStore) == 0)
    return refuse(wire::WireError::kUnsupported,
                  offers_store() ? "STORE was not negotiated (the backbone's HELLO lacks the feature)"
                                 : "this worker keeps no replicas (started without --replica-dir/--replica-mb)");
  // decode_store checks each tensor's bytes against the hash it came with (the transfer).
  auto slab = wire::decode_store(f, lim);
  if (!slab) return refuse(wire::WireError::kMalformed, slab.status().message());
  std::lock_guard<std::mutex> one(replica_mu);
  bool already = false;
  uint64_t used = stats.replica_bytes.load();
  {
    std::shared_lock<std::shared_mutex> held(store_mu);
    already = store->find(slab->layer, slab->expert).weights != nullptr;
  }
  if (!already) {
    uint64_t bytes = 0;
    for (const wire::SlabTensor& t : slab->tensors) bytes += t.bytes.size();
    if (used + bytes > opts.replica_budget_bytes) {
      return refuse(wire::WireError::kOverloaded,
                    fmt::format("layer {} expert {}: {} bytes would exceed the replica budget ({} of {} bytes used)",
                                slab->layer, slab->expert, bytes, used, opts.replica_budget_bytes));
    }
    // Against the model's own hashes and layout (the sender is not trusted with other
    // backbones' answers), then to disk and mapped from there.
    const std::string path = fmt::format("{}/replica-{}-{}.gguf", opts.replica_dir, slab->layer, slab->expert);
    Status st = write_replica_slice(store->file(), *slab, path);
    if (!st.is_ok()) {
      return refuse(st.code() == StatusCode::kIoError ? wire::WireError::kInternal : wire::WireError::kMalformed,
                    st.message());
    }
    auto file = gguf::File::open(path);
    auto replica =
        file ? ExpertStore::open(std::move(*file), ExpertSet{}) : Result<std::unique_ptr<ExpertStore>>(file.status());
    if (!replica) return refuse(wire::WireError::kInternal, replica.status().to_string());
    (*replica)->prefault();
    const uint64_t added = (*replica)->slab_bytes();
    {
      std::unique_lock<std::shared_mutex> excl(store_mu);
      st = store->absorb(std::move(*replica));
    }
    if (!st.is_ok()) return refuse(wire::WireError::kInternal, st.to_string());
    used = stats.replica_bytes.fetch_add(added) + added;
    stats.stores.fetch_add(1);
    spdlog::info("{}: now holds a replica of layer {} expert {} ({} of {} replica bytes)", conn.describe(), slab->layer,
                 slab->expert, used, opts.replica_budget_bytes);
  }
  auto ok = wire::encode_stored({.request_id = slab->request_id,
                                 .layer = slab->layer,
                                 .expert = slab->expert,
                                 .replica_bytes = used,
                                 .budget_bytes = std::max(used, opts.replica_budget_bytes)});
  if (ok) (void)conn.send_frame(*ok, net::deadline_in(kSendTimeout));
}

void Worker::Impl::handle_unstore(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                                  const wire::Session& session) {
  auto refuse = [&](wire::WireError code, const std::string& text) {
    stats.errors.fetch_add(1);
    spdlog::warn("{}: UNSTORE {} refused: {}", conn.describe(), f.request_id(), text);
    net::send_error(conn, f.request_id(), code, text, net::deadline_in(kSendTimeout));
  };
  if ((session.features & wire::kFeatureUnstore) == 0)
    return refuse(wire::WireError::kUnsupported,
                  offers_store() ? "UNSTORE was not negotiated (the backbone's HELLO lacks the feature)"
                                 : "this worker keeps no replicas (started without --replica-dir/--replica-mb)");
  auto req = wire::decode_unstore(f, lim);
  if (!req) return refuse(wire::WireError::kMalformed, req.status().message());
  std::lock_guard<std::mutex> one(replica_mu);
  Result<std::unique_ptr<ExpertStore>> gone = Status(StatusCode::kInternal, "");
  {
    // No pass, FETCH or HELLO reads the store while the replica leaves its table.
    std::unique_lock<std::shared_mutex> excl(store_mu);
    gone = store->release(req->layer, req->expert);
  }
  if (!gone) {
    return refuse(
        gone.status().code() == StatusCode::kNotFound ? wire::WireError::kNotHeld : wire::WireError::kUnsupported,
        gone.status().message());
  }
  // Nothing reads its weights any more: unmap it, then delete its file so a restart does not map
  // it again. A file that cannot be deleted is said; the expert is let go of all the same.
  const std::string path = (*gone)->file().path();
  const uint64_t bytes = (*gone)->slab_bytes();
  gone->reset();
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) spdlog::warn("replica {} let go of, but its file stays: {}", path, ec.message());
  {
    std::lock_guard<std::mutex> lock(hash_mu);
    slab_hashes.erase({req->layer, req->expert});
  }
  uint64_t used = stats.replica_bytes.load();
  used = used >= bytes ? used - bytes : 0;
  stats.replica_bytes.store(used);
  stats.unstores.fetch_add(1);
  spdlog::info("{}: let go of its replica of layer {} expert {} ({} of {} replica bytes)", conn.describe(), req->layer,
               req->expert, used, opts.replica_budget_bytes);
  auto ok = wire::encode_unstored({.request_id = req->request_id,
                                   .layer = req->layer,
                                   .expert = req->expert,
                                   .replica_bytes = used,
                                   .budget_bytes = std::max(used, opts.replica_budget_bytes)});
  if (ok) (void)conn.send_frame(*ok, net::deadline_in(kSendTimeout));
}

void Worker::Impl::handle_info(net::Connection& conn, const wire::Frame& f) {
  auto id = wire::decode_info_request(f);
  if (!id) {
    net::send_error(conn, f.request_id(), wire::WireError::kMalformed, id.status().message(),
                    net::deadline_in(kSendTimeout));
    return;
  }
  wire::InfoMsg m;
  m.request_id = *id;
  m.threads = static_cast<uint32_t>(std::max(pool->n_threads(), 1));
  m.cores = std::thread::hardware_concurrency();
  {
    std::shared_lock<std::shared_mutex> held(store_mu);
    m.slab_bytes = store->slab_bytes();
  }
  m.replica_budget_bytes = offers_store() ? opts.replica_budget_bytes : 0;
  m.replica_bytes = std::min({stats.replica_bytes.load(), m.replica_budget_bytes, m.slab_bytes});
  m.rss_bytes = resident_bytes();
  const SystemMemory mem = system_memory();
  m.mem_total_bytes = mem.total_bytes;
  m.mem_available_bytes = std::min(mem.available_bytes, mem.total_bytes);
  m.offer_bytes = opts.offer_bytes;
  m.uptime_ms =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(net::Clock::now() - started).count());
  auto reply = wire::encode_info(m);
  if (reply) (void)conn.send_frame(*reply, net::deadline_in(kSendTimeout));
}

void Worker::Impl::handle_probe(net::Connection& conn, const wire::Frame& f) {
  auto m = wire::decode_probe(f);
  if (!m) {
    net::send_error(conn, f.request_id(), wire::WireError::kMalformed, m.status().message(),
                    net::deadline_in(kSendTimeout));
    return;
  }
  // Three rounds, all addresses at once: within about 3 x the largest RTT, never past the timeout.
  const std::vector<double> rtts =
      net::connect_rtts(m->targets, 3, net::deadline_in(std::chrono::milliseconds(m->timeout_ms)));
  wire::ProbeReplyMsg r;
  r.request_id = m->request_id;
  for (const double s : rtts)
    r.rtt_us.push_back(s < 0 ? wire::kProbeFailed
                             : static_cast<uint32_t>(std::min(s * 1e6, static_cast<double>(wire::kProbeFailed - 1))));
  auto reply = wire::encode_probe_reply(r);
  if (reply) (void)conn.send_frame(*reply, net::deadline_in(kSendTimeout));
}

void Worker::Impl::handle_span(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                               const wire::Session& session) {
  stats.span_steps.fetch_add(1);
  auto fail = [&](wire::WireError code, const std::string& text) {
    stats.errors.fetch_add(1);
    net::send_error(conn, f.request_id(), code, text, net::deadline_in(kSendTimeout));
  };
  if (!opts.span || (session.features & wire::kFeatureSpan) == 0) {
    fail(wire::WireError::kUnsupported, "this worker runs no layer span");
    return;
  }
  auto req = wire::decode_span_step(f, lim);
  if (!req) {
    fail(wire::WireError::kMalformed, req.status().message());
    return;
  }
  // A forwarded step (chained, sent by the previous span's peer) names the backbone whose
  // sequences it carries; its result goes to that backbone's SPAN_AWAIT, never back here.
  const bool forwarded = !req->origin.empty();
  if (req->chain_id != 0 && (!opts.span_forwarder || (session.features & wire::kFeatureSpanChain) == 0)) {
    fail(wire::WireError::kUnsupported, "this span peer does not chain spans");
    return;
  }
  const std::string owner = forwarded ? req->origin : session.peer.name;
  if (forwarded) stats.span_forwarded.fetch_add(1);
  auto res = opts.span->step(owner, *req);
  if (res && opts.emulate_speed < 1) {
    emulate_slower(res->compute_us);
    res->compute_us = slower_us(res->compute_us);
  }
  if (res && res->need.empty() && !req->next.empty()) {
    // Pass the rows on before answering: the next span's compute is the critical path.
    auto hop = make_hop_step(*req, owner, *res);
    Status st = hop ? opts.span_forwarder->forward(req->next.front().address, std::move(*hop)) : hop.status();
    stats.span_forwards.fetch_add(1);
    if (!st.is_ok()) {
      stats.span_forward_errors.fetch_add(1);
      res->forward_error = st.message().substr(0, wire::kMaxTextBytes);
      spdlog::warn("span step of '{}': not passed on to {}: {}", owner, req->next.front().address, st.to_string());
    }
  }
  if (forwarded) {
    if (!res) stats.errors.fetch_add(1);
    span_awaits.deliver(owner, req->chain_id, req->first, std::move(res));
    return;
  }
  if (!res) {
    fail(wire::status_code_to_wire_error(res.status().code()), res.status().message());
    return;
  }
  auto frame = wire::encode_span_result(*res);
  if (!frame || frame->size() - wire::kHeaderBytes > session.max_send_bytes) {
    fail(wire::WireError::kInternal, frame ? "SPAN_RESULT exceeds the peer's frame limit" : frame.status().message());
    return;
  }
  (void)conn.send_frame(*frame, send_deadline(frame->size()));
}

void Worker::Impl::handle_span_await(net::Connection& conn, const wire::Frame& f, const wire::DecodeLimits& lim,
                                     const wire::Session& session) {
  stats.span_awaits.fetch_add(1);
  if (!opts.span || (session.features & wire::kFeatureSpanChain) == 0) {
    stats.errors.fetch_add(1);
    net::send_error(conn, f.request_id(), wire::WireError::kUnsupported, "this span peer does not chain spans",
                    net::deadline_in(kSendTimeout));
    return;
  }
  auto m = wire::decode_span_await(f, lim);
  if (!m) {
    stats.errors.fetch_add(1);
    net::send_error(conn, f.request_id(), wire::WireError::kMalformed, m.status().message(),
                    net::deadline_in(kSendTimeout));
    return;
  }
  if (!opts.span->find({static_cast<int>(m->first), static_cast<int>(m->last)})) {
    stats.errors.fetch_add(1);
    net::send_error(
        conn, f.request_id(), wire::WireError::kNotHeld,
        fmt::format("this span peer runs blocks {}, the await names {}-{}", opts.span->describe(), m->first, m->last),
        net::deadline_in(kSendTimeout));
    return;
  }
  span_awaits.await(&conn, session.peer.name, *m);
}

void Worker::Impl::handle_span_hold(net::Connection& conn, const wire::Frame& f, const wire::Session& session) {
  auto fail = [&](wire::WireError code, const std::string& text) {
    stats.errors.fetch_add(1);
    net::send_error(conn, f.request_id(), code, text, net::deadline_in(kSendTimeout));
  };
  if (!opts.span || (session.features & wire::kFeatureSpanLoad) == 0) {
    fail(wire::WireError::kUnsupported, "this worker loads no layer spans");
    return;
  }
  auto m = wire::decode_span_hold(f);
  if (!m) {
    fail(wire::WireError::kMalformed, m.status().message());
    return;
  }
  stats.span_holds.fetch_add(1);
  auto held = opts.span->hold(session.peer.name, *m);
  if (!held) {
    fail(wire::status_code_to_wire_error(held.status().code()), held.status().message());
    return;
  }
  auto frame = wire::encode_span_held(*held);
  if (!frame) {
    fail(wire::WireError::kInternal, frame.status().message());
    return;
  }
  (void)conn.send_frame(*frame, net::deadline_in(kSendTimeout));
}

Status Worker::Impl::load_replicas() {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(opts.replica_dir, ec);
  if (ec) return make_error(StatusCode::kIoError, "replica dir {}: {}", opts.replica_dir, ec.message());
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(opts.replica_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("replica-") && name.ends_with(".gguf")) paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  for (const std::string& p : paths) {
    auto file = gguf::File::open(p);
    auto replica =
        file ? ExpertStore::open(std::move(*file), ExpertSet{}) : Result<std::unique_ptr<ExpertStore>>(file.status());
    if (!replica) {
      // A damaged replica is only a lost copy: say so and go on without it.
      spdlog::warn("replica {} not mapped: {}", p, replica.status().to_string());
      continue;
    }
    const uint64_t bytes = (*replica)->slab_bytes();
    const std::string what = (*replica)->held().to_string();
    if (stats.replica_bytes.load() + bytes > opts.replica_budget_bytes) {
      spdlog::warn("replica {} ({}) not mapped: over the replica budget of {} bytes", p, what,
                   opts.replica_budget_bytes);
      continue;
    }
    (*replica)->prefault();
    if (Status st = store->absorb(std::move(*replica)); !st.is_ok()) {
      spdlog::warn("replica {} not mapped: {}", p, st.to_string());
      continue;
    }
    stats.replica_bytes.fetch_add(bytes);
    spdlog::info("mapped replica {} ({})", p, what);
  }
  return Status::ok();
}

bool Worker::Impl::serve(Peer* peer, std::chrono::milliseconds idle_timeout) {
  if (!peer->conn) {
    // A raw stream (accepted, or dialled out after its ROUTE exchange): TLS first when this
    // worker has a certificate, then frames.
    std::unique_ptr<net::ByteStream> stream = std::move(peer->raw);
    if (peer->accepted) {
      const std::string who = stream->describe();
      auto upgraded = net::accept_tcp_or_websocket(std::move(stream), net::deadline_in(kHandshakeTimeout));
      if (!upgraded && upgraded.status().message() == net::kClosedBeforeAByte) {
        // A PROBE's connect (another worker measuring its round trip here) or a health check.
        spdlog::debug("{}: {}", who, net::kClosedBeforeAByte);
        peer->finished = true;
        return false;
      }
      if (!upgraded) {
        stats.refused.fetch_add(1);
        spdlog::warn("{}: refused: {}", who, upgraded.status().to_string());
        peer->finished = true;
        return false;
      }
      stream = std::move(*upgraded);
    }
    if (opts.tls) {
      const std::string who = stream->describe();
      auto tls = net::tls_server(std::move(stream), *opts.tls, net::deadline_in(kHandshakeTimeout));
      if (!tls) {
        stats.refused.fetch_add(1);
        spdlog::warn("{}: refused: {}", who, tls.status().to_string());
        peer->finished = true;
        return false;
      }
      stream = std::move(*tls);
    }
    net::ConnectionOptions copts;
    copts.max_frame_bytes = opts.max_frame_bytes;
    peer->conn = net::make_stream_connection(std::move(stream), copts);
  }
  net::Connection& conn = *peer->conn;
  wire::Hello hello;
  {
    std::shared_lock<std::shared_mutex> held(store_mu);
    hello = make_hello(wire::PeerRole::kWorker, store->identity(), store->shape(), store->held(), opts.name);
    hello.layer_act = detail::layer_activation_dtypes(*store);
  }
  if (offers_store()) hello.features |= wire::kFeatureStore | wire::kFeatureUnstore;
  if (opts.span) hello.features |= wire::kFeatureSpan;
  if (opts.span && opts.span_forwarder) hello.features |= wire::kFeatureSpanChain;
  if (opts.span) hello.features |= wire::kFeatureSpanLoad;
  auto session =
      net::handshake(conn, hello, /*initiator=*/false, net::deadline_in(kHandshakeTimeout), opts.swarm_key.get());
  if (!session) {
    stats.refused.fetch_add(1);
    spdlog::warn("{}: refused in the handshake: {}", conn.describe(), session.status().to_string());
    conn.close();
    peer->finished = true;
    return false;
  }
  spdlog::info("{}: backbone '{}' connected", conn.describe(), session->peer.name);
  const size_t led = ledger_slot(session->peer.name, conn.describe());
  const auto connected_at = net::Clock::now();
  if (idle_timeout.count() > 0) stats.joins.fetch_add(1);
  Heartbeat beat(idle_timeout);
  wire::DecodeLimits lim;
  lim.max_frame_bytes = opts.max_frame_bytes;
  lim.n_expert = store->shape().n_expert;
  lim.n_layer = store->shape().n_layer;
  if (opts.span) {
    // Span rows may be wider than n_embd: they carry cross-layer residual checkpoints (kimi-k3) or
    // a reused indexer selection (glm-dsa).
    lim.max_n_embd = std::max<uint32_t>(lim.max_n_embd, static_cast<uint32_t>(opts.span->max_row_width()));
  }
  // Awaits waiting on this connection are forgotten when it ends (the object outlives serve()).
  struct AwaitsOf {
    SpanAwaits& a;
    net::Connection* c;
    ~AwaitsOf() { a.drop(c); }
  } awaits_of{span_awaits, &conn};
  while (!stopping()) {
    auto f = conn.recv_frame(net::deadline_in(kPollSlice));
    if (opts.span_forwarder) span_awaits.sweep(&conn);
    if (!f) {
      if (f.status().code() == StatusCode::kTimeout) {
        if (idle_timeout.count() > 0 && !beat.tick(conn)) {
          spdlog::warn("{}: nothing from backbone '{}' for {} ms, dropping the connection", conn.describe(),
                       session->peer.name, idle_timeout.count());
          break;
        }
        continue;
      }
      if (f.status().code() == StatusCode::kCorrupt || f.status().code() == StatusCode::kUnsupported ||
          f.status().code() == StatusCode::kOutOfRange) {
        stats.errors.fetch_add(1);
        spdlog::warn("{}: bad frame, closing: {}", conn.describe(), f.status().to_string());
        net::send_error(conn, 0, wire::WireError::kMalformed, f.status().message(), net::deadline_in(1s));
      }
      break;
    }
    beat.heard();
    switch (f->type()) {
      case wire::MsgType::kDispatch:
        handle_dispatch(conn, *f, lim, session->max_send_bytes, led);
        break;
      case wire::MsgType::kFetch:
        handle_fetch(conn, *f, lim, *session, led);
        break;
      case wire::MsgType::kStore:
        handle_store(conn, *f, lim, *session);
        break;
      case wire::MsgType::kUnstore:
        handle_unstore(conn, *f, lim, *session);
        break;
      case wire::MsgType::kInfo:
        handle_info(conn, *f);
        break;
      case wire::MsgType::kProbe:
        handle_probe(conn, *f);
        break;
      case wire::MsgType::kSpanStep:
        handle_span(conn, *f, lim, *session);
        break;
      case wire::MsgType::kSpanAwait:
        handle_span_await(conn, *f, lim, *session);
        break;
      case wire::MsgType::kSpanHold:
        handle_span_hold(conn, *f, *session);
        break;
      case wire::MsgType::kPing: {
        auto p = wire::decode_ping(*f);
        if (!p) {
          net::send_error(conn, f->request_id(), wire::WireError::kMalformed, p.status().message(),
                          net::deadline_in(kSendTimeout));
          break;
        }
        const uint64_t now = static_cast<uint64_t>(net::Clock::now().time_since_epoch().count());
        auto pong = wire::encode_pong({.request_id = p->request_id,
                                       .ping_time_ns = p->send_time_ns,
                                       .reply_time_ns = now,
                                       .pad_bytes = p->reply_pad_bytes});
        if (pong) (void)conn.send_frame(*pong, net::deadline_in(kSendTimeout));
        break;
      }
      case wire::MsgType::kPong:  // the answer to a heartbeat: the path is alive
        break;
      case wire::MsgType::kGoodbye:
        spdlog::info("{}: backbone said goodbye", conn.describe());
        conn.close();
        peer->finished = true;
        end_session(led, connected_at);
        return true;
      case wire::MsgType::kError:
        // A connection-level ERROR means the peer is closing; request-level ones are not ours.
        if (f->request_id() == 0) {
          conn.close();
          peer->finished = true;
          end_session(led, connected_at);
          return true;
        }
        break;
      default:
        // HELLO again, COMBINE or SLAB: valid frames a worker never expects.
        net::send_error(conn, f->request_id(), wire::WireError::kProtocol,
                        fmt::format("unexpected {} frame on a worker connection", wire::msg_type_name(f->type())),
                        net::deadline_in(kSendTimeout));
        break;
    }
  }
  if (stopping()) {
    auto bye =
        wire::encode_goodbye({.reason = uint16_t(wire::WireError::kShuttingDown), .text = "worker shutting down"});
    if (bye) (void)conn.send_frame(*bye, net::deadline_in(1s));
  }
  conn.close();
  peer->finished = true;
  end_session(led, connected_at);
  return true;
}

void Worker::Impl::end_session(size_t led, net::Clock::time_point connected_at) {
  std::lock_guard<std::mutex> lk(ledger_mu);
  ledger[led].connected_seconds += std::chrono::duration<double>(net::Clock::now() - connected_at).count();
  ledger[led].connected = false;
}

Worker::Impl::JoinOutcome Worker::Impl::join_once(const std::string& host, uint16_t port, bool websocket) {
  const std::string target = fmt::format("{}{}:{}", websocket ? "ws://" : "", host, port);
  net::TcpOptions tcp;
  tcp.congestion = opts.congestion;
  tcp.poll_us = opts.poll_us;
  auto s = websocket ? net::ws_connect(host, port, tcp, net::deadline_in(kHandshakeTimeout))
                     : net::tcp_connect(host, port, tcp, net::deadline_in(kHandshakeTimeout));
  if (!s) {
    spdlog::warn("join {}: {}", target, s.status().to_string());
    return JoinOutcome::kFailed;
  }
  std::unique_ptr<net::ByteStream> stream = std::move(*s);
  stats.connections.fetch_add(1);
  // JOIN first: the far end is a backbone's registry or a relay, and says which. The ROUTE
  // frames are read exactly, so TLS and the connection take the stream over where they end.
  auto join = wire::encode_route({.op = wire::RouteMsg::kJoin, .name = opts.name});
  if (!join || !stream->write_all(*join, net::deadline_in(kHandshakeTimeout)).is_ok()) return JoinOutcome::kFailed;
  net::FrameReader reader;
  bool relay = false;
  // A relay standby heartbeats on the raw stream (PING frames before any TLS).
  auto last_frame = net::Clock::now(), last_ping = last_frame;
  uint64_t ping_id = 0;
  const auto idle = opts.join_idle_timeout;
  for (;;) {
    if (stopping()) return JoinOutcome::kFailed;
    // The first answer comes at once; a relay standby then waits (heartbeating) for a backbone.
    auto f = reader.read(*stream, net::deadline_in(relay ? kPollSlice : kHandshakeTimeout));
    if (!f) {
      if (relay && f.status().code() == StatusCode::kTimeout) {
        const auto now = net::Clock::now();
        if (now - last_frame <= idle) {
          if (now - last_frame > idle / 4 && now - last_ping > idle / 4) {
            last_ping = now;
            auto ping = wire::encode_ping(
                {.request_id = ++ping_id, .send_time_ns = static_cast<uint64_t>(now.time_since_epoch().count())});
            if (ping) (void)stream->write_all(*ping, net::deadline_in(kSendTimeout));
          }
          continue;
        }
        spdlog::warn("join {}: the relay has been silent for {} ms, re-dialling", target, idle.count());
      } else {
        spdlog::warn("join {}: {}", target, f.status().to_string());
      }
      return JoinOutcome::kFailed;
    }
    last_frame = net::Clock::now();
    if (f->type() == wire::MsgType::kError) {
      auto e = wire::decode_error(*f);
      spdlog::warn("join {}: refused: {}", target, e ? e->text : e.status().to_string());
      return JoinOutcome::kFailed;
    }
    if (f->type() == wire::MsgType::kPong) continue;
    if (f->type() == wire::MsgType::kAuth && !relay) {
      // A relay that admits only holders of the swarm key challenges before it registers us.
      if (!opts.swarm_key) {
        spdlog::warn("join {}: the relay admits only holders of the swarm key (start with --swarm-key)", target);
        return JoinOutcome::kFailed;
      }
      Status st =
          net::relay_auth_dial(*stream, reader, *f, *opts.swarm_key, opts.name, net::deadline_in(kHandshakeTimeout));
      if (!st.is_ok()) {
        spdlog::warn("join {}: refused by the relay: {}", target, st.to_string());
        return JoinOutcome::kFailed;
      }
      continue;
    }
    auto r = f->type() == wire::MsgType::kRoute
                 ? wire::decode_route(*f)
                 : Result<wire::RouteMsg>(make_error(StatusCode::kCorrupt, "{} frame before the join was answered",
                                                     wire::msg_type_name(f->type())));
    if (!r) {
      spdlog::warn("join {}: {}", target, r.status().to_string());
      return JoinOutcome::kFailed;
    }
    if (r->op == wire::RouteMsg::kJoinedBackbone && !relay) {
      Peer p;
      p.raw = std::move(stream);
      return serve(&p, opts.join_idle_timeout) ? JoinOutcome::kServed : JoinOutcome::kFailed;
    }
    if (r->op == wire::RouteMsg::kJoinedRelay && !relay) {
      relay = true;
      spdlog::info("join {}: registered at the relay as '{}', waiting for a backbone", target, opts.name);
      continue;
    }
    if (r->op == wire::RouteMsg::kSpliced && relay) {
      // A backbone came through the relay: it is served on a thread of its own, and the next
      // standby is dialled at once so other backbones can reach this worker too.
      std::lock_guard<std::mutex> lock(peers_mu);
      Peer& p = peers.emplace_back();
      p.raw = std::move(stream);
      p.thread = std::thread([this, pp = &p] { serve(pp, opts.join_idle_timeout); });
      return JoinOutcome::kSpliced;
    }
    spdlog::warn("join {}: unexpected ROUTE {}", target, wire::route_op_name(r->op));
    return JoinOutcome::kFailed;
  }
}

void Worker::Impl::join_loop(std::string host, uint16_t port, bool websocket) {
  const std::string target = fmt::format("{}{}:{}", websocket ? "ws://" : "", host, port);
  auto backoff = opts.join_backoff;
  while (!stopping()) {
    const JoinOutcome out = join_once(host, port, websocket);
    reap(/*all=*/false);
    if (stopping()) break;
    if (out == JoinOutcome::kSpliced) {
      backoff = opts.join_backoff;
      continue;  // the next standby now
    }
    if (out == JoinOutcome::kServed) {
      backoff = opts.join_backoff;  // it worked: the next loss is a fresh one
    } else {
      stats.join_failures.fetch_add(1);
    }
    spdlog::info("join {}: re-dialling in {} ms", target, backoff.count());
    const auto until = net::Clock::now() + backoff;
    while (!stopping() && net::Clock::now() < until)
      std::this_thread::sleep_for(std::min<net::Clock::duration>(kPollSlice, until - net::Clock::now()));
    if (out == JoinOutcome::kFailed) backoff = std::min(backoff * 2, opts.join_backoff_max);
  }
}

void Worker::Impl::reap(bool all) {
  std::lock_guard<std::mutex> lock(peers_mu);
  for (auto it = peers.begin(); it != peers.end();) {
    if (all || it->finished) {
      if (it->thread.joinable()) it->thread.join();
      it = peers.erase(it);
    } else {
      ++it;
    }
  }
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Worker::~Worker() {
  stop();
  // Joiners first: one may still hand a spliced connection to a new peer thread.
  for (std::thread& t : impl_->joiners)
    if (t.joinable()) t.join();
  impl_->reap(/*all=*/true);
}

Result<std::unique_ptr<Worker>> Worker::start(ExpertStore* store, const WorkerOptions& opts) {
  auto impl = std::make_unique<Impl>();
  impl->store = store;
  impl->opts = opts;
  if (!opts.listen && opts.join.empty() && opts.join_ws.empty())
    return make_error(StatusCode::kInvalidArgument, "worker: neither listening nor joining a backbone");
  if (opts.listen) {
    net::TcpOptions tcp;
    tcp.congestion = opts.congestion;
    tcp.poll_us = opts.poll_us;
    auto l = net::TcpListener::listen(opts.host, opts.port, tcp);
    if (!l) return l.status().with_context(fmt::format("listening on {}:{}", opts.host, opts.port));
    impl->listener = std::move(*l);
  }
  if (impl->opts.name.empty()) {
    // A joining worker's name must stay the same across restarts (it is its identity in the
    // backbone's registry), so it is not derived from a port picked at random.
    impl->opts.name = impl->listener ? fmt::format("worker@{}:{}", opts.host, impl->listener->port())
                                     : fmt::format("worker@{}", opts.host);
  }
  if (impl->offers_store()) MOESH_RETURN_IF_ERROR(impl->load_replicas());
  impl->pool = std::make_unique<ThreadPool>(opts.n_threads);
  Impl* m = impl.get();
  for (const auto& [host, port] : opts.join)
    m->joiners.emplace_back([m, h = host, p = port] { m->join_loop(h, p, false); });
  for (const auto& [host, port] : opts.join_ws)
    m->joiners.emplace_back([m, h = host, p = port] { m->join_loop(h, p, true); });
  return std::unique_ptr<Worker>(new Worker(std::move(impl)));
}

uint16_t Worker::port() const {
  return impl_->listener ? impl_->listener->port() : 0;
}

std::vector<LedgerEntry> Worker::ledger() const {
  std::lock_guard<std::mutex> lk(impl_->ledger_mu);
  return impl_->ledger;
}

const std::string& Worker::name() const {
  return impl_->opts.name;
}

const WorkerStats& Worker::stats() const {
  return impl_->stats;
}

void Worker::stop() {
  impl_->stop_flag.store(true, std::memory_order_relaxed);
}

void Worker::serve_connection(std::unique_ptr<net::Connection> conn) {
  Impl& m = *impl_;
  m.reap(/*all=*/false);
  m.stats.connections.fetch_add(1);
  std::lock_guard<std::mutex> lock(m.peers_mu);
  Impl::Peer& p = m.peers.emplace_back();
  p.conn = std::move(conn);
  p.thread = std::thread([&m, pp = &p] { m.serve(pp); });
}

void Worker::run() {
  Impl& m = *impl_;
  while (!m.stopping() && !m.listener) std::this_thread::sleep_for(kPollSlice);  // joined backbones only
  while (!m.stopping() && m.listener) {
    auto s = m.listener->accept(net::deadline_in(kPollSlice));
    m.reap(/*all=*/false);
    if (!s) {
      if (s.status().code() == StatusCode::kTimeout) continue;
      spdlog::error("accept failed: {}", s.status().to_string());
      std::this_thread::sleep_for(kPollSlice);
      continue;
    }
    net::ConnectionOptions copts;
    copts.max_frame_bytes = m.opts.max_frame_bytes;
    m.stats.connections.fetch_add(1);
    std::lock_guard<std::mutex> lock(m.peers_mu);
    Impl::Peer& p = m.peers.emplace_back();
    p.raw = std::move(*s);
    p.accepted = true;
    p.thread = std::thread([&m, pp = &p] { m.serve(pp); });
  }
  if (m.listener) m.listener->close();
  for (std::thread& t : m.joiners)
    if (t.joinable()) t.join();
  // Each reader notices the flag within one poll slice and says GOODBYE on its connection.
  m.reap(/*all=*/true);
}

}  // namespace moesh::swarm
