// `moesh worker`: serves routed-expert requests for the experts it holds (docs/worker.md).
#include <csignal>
#include <cstdio>
#include <string>

#include "command.h"
#include "model_cli.h"
#include "moesh/serve/worker_http.h"
#include "moesh/swarm/span_host.h"
#include "moesh/swarm/swarm.h"
#include "moesh/util/process.h"
#include "moesh/wan/host_tcp.h"
#include "span_fetch.h"

namespace moesh::cli {
namespace {

struct WorkerArgs {
  std::string model;
  std::string experts;
  std::string listen = "127.0.0.1:0";
  int threads = 0;
  std::string name;
  std::string congestion = "cubic";
  int poll_us = 0;
  std::string swarm_key;          // --swarm-key FILE
  std::vector<std::string> join;  // --join HOST:PORT (repeatable)
  std::string metrics;            // --metrics HOST:PORT
  std::string tls_cert, tls_key;  // --tls-cert, --tls-key
  bool listen_given = false;
  int64_t batch_window_us = 0;                              // --batch-window-us
  uint32_t max_batch_tokens = 4096;                         // --max-batch-tokens
  std::string replica_dir;                                  // --replica-dir
  double replica_mb = 0;                                    // --replica-mb
  double offer_mb = 0;                                      // --offer-mb
  double emulate_speed = 1;                                 // --emulate-speed
  LoadOptions::Memory memory = LoadOptions::Memory::kAuto;  // --mmap / --no-mmap
  bool no_blocks = false;                                   // --no-blocks
  std::string fetch_blocks;                                 // --fetch-blocks URL (a worker on a slice)
  std::string admin_key;                                    // that gateway's --admin-key
  std::string slice_dir;                                    // where fetched span slices are kept
  int64_t ctx = 0;                                          // -c: cells per sequence of blocks it is given
};

swarm::Worker* g_worker = nullptr;

extern "C" void on_stop_signal(int) {
  if (g_worker != nullptr) g_worker->stop();
}

// "host:port" or "[v6]:port".
bool split_host_port(const std::string& s, std::string* host, uint16_t* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 >= s.size()) return false;
  *host = s.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  unsigned long p = 0;
  try {
    size_t used = 0;
    p = std::stoul(s.substr(colon + 1), &used);
    if (used != s.size() - colon - 1 || p > 65535) return false;
  } catch (...) {
    return false;
  }
  *port = static_cast<uint16_t>(p);
  return !host->empty();
}

int run_worker(const WorkerArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh worker: error: %s\n", s.to_string().c_str());
    return 1;
  };
  swarm::WorkerOptions o;
  if (!split_host_port(a.listen, &o.host, &o.port)) {
    return fail(make_error(StatusCode::kInvalidArgument, "--listen '{}' is not HOST:PORT", a.listen));
  }
  // A joining worker needs no inbound port: it listens only when --listen is given as well.
  o.listen = a.join.empty() || a.listen_given;
  for (const std::string& j : a.join) {
    // ws://HOST:PORT[/]: the same, over WebSocket (for networks that only let HTTP out).
    const bool ws = j.rfind("ws://", 0) == 0;
    std::string hp = ws ? j.substr(5) : j;
    if (ws && !hp.empty() && hp.back() == '/') hp.pop_back();
    std::string host;
    uint16_t port = 0;
    if (!split_host_port(hp, &host, &port) || port == 0)
      return fail(make_error(StatusCode::kInvalidArgument, "--join '{}' is not HOST:PORT or ws://HOST:PORT", j));
    (ws ? o.join_ws : o.join).emplace_back(host, port);
  }
  std::string metrics_host;
  uint16_t metrics_port = 0;
  if (!a.metrics.empty() && !split_host_port(a.metrics, &metrics_host, &metrics_port))
    return fail(make_error(StatusCode::kInvalidArgument, "--metrics '{}' is not HOST:PORT", a.metrics));
  auto file = gguf::File::open(a.model);
  if (!file) return fail(file.status());
  swarm::ExpertSet held;
  if (!a.experts.empty()) {
    auto shape = swarm::model_shape(**file);
    if (!shape) return fail(shape.status());
    auto set = swarm::parse_expert_spec(a.experts, *shape);
    if (!set) return fail(set.status());
    held = std::move(*set);
  } else if (swarm::slice_kind(**file).empty()) {
    return fail(
        make_error(StatusCode::kInvalidArgument, "--experts is required with a full model (e.g. --experts '*:0-7')"));
  }
  const uint64_t rss0 = resident_bytes();
  auto store = swarm::ExpertStore::open(std::move(*file), held);
  if (!store) return fail(store.status());
  if (!place_slabs(store->get(), a.memory, "worker")) return 1;
  const uint64_t rss1 = resident_bytes();
  o.n_threads = a.threads;
  o.congestion = a.congestion;
  o.poll_us = a.poll_us;
  o.name = a.name;
  if (a.batch_window_us < 0)
    return fail(make_error(StatusCode::kInvalidArgument, "--batch-window-us must be >= 0, got {}", a.batch_window_us));
  o.batch_window = std::chrono::microseconds(a.batch_window_us);
  if (a.max_batch_tokens == 0)
    return fail(make_error(StatusCode::kInvalidArgument, "--max-batch-tokens must be >= 1 (1: no batching)"));
  o.max_batch_tokens = a.max_batch_tokens;
  if (a.replica_dir.empty() != (a.replica_mb <= 0))
    return fail(make_error(StatusCode::kInvalidArgument, "--replica-dir and --replica-mb (> 0) go together"));
  o.replica_dir = a.replica_dir;
  o.replica_budget_bytes = static_cast<uint64_t>(a.replica_mb * 1048576.0);
  if (a.offer_mb < 0)
    return fail(make_error(StatusCode::kInvalidArgument, "--offer-mb must be >= 0, got {}", a.offer_mb));
  o.offer_bytes = static_cast<uint64_t>(a.offer_mb * 1048576.0);
  o.emulate_speed = a.emulate_speed;
  if (!a.swarm_key.empty()) {
    auto key = net::SwarmKey::load(a.swarm_key);
    if (!key) return fail(key.status());
    o.swarm_key = std::move(*key);
  }
  if (a.tls_cert.empty() != a.tls_key.empty())
    return fail(make_error(StatusCode::kInvalidArgument, "--tls-cert and --tls-key go together"));
  if (!a.tls_cert.empty()) {
    auto id = net::TlsIdentity::load(a.tls_cert, a.tls_key);
    if (!id) return fail(id.status());
    o.tls = std::move(*id);
  }
  // A worker on the full model may be given whole blocks too (a span, SPAN_HOLD): a backbone's
  // re-plan can turn it from an expert holder into a span peer without a restart. The blocks come
  // from the same file, mapped (no second copy of the weights in memory); their experts are
  // computed here.
  const bool full = swarm::slice_kind((*store)->file()).empty();
  if (!a.fetch_blocks.empty() && (full || a.no_blocks))
    return fail(make_error(StatusCode::kInvalidArgument,
                           "--fetch-blocks is for a worker on an expert slice (one on the full model loads blocks from "
                           "its own file), and not with --no-blocks"));
  const bool blocks = !a.no_blocks && (full || !a.fetch_blocks.empty());
  if (blocks && !full) {
    // On an expert slice: the span slice of the blocks it is given is fetched from the gateway,
    // checked by hash, its tensors and model identity against this worker's.
    auto hp = load_hparams((*store)->file());
    if (!hp) return fail(hp.status());
    swarm::SpanLoader loader = [fetch = SliceFetch{a.fetch_blocks, a.admin_key, a.slice_dir, "worker"},
                                threads = a.threads, ctx = a.ctx, memory = a.memory, id = (*store)->identity()](
                                   const LayerSpan& sp) -> Result<std::shared_ptr<swarm::SpanHost>> {
      MOESH_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_fetched_span(fetch, sp, memory, id));
      swarm::SpanHostOptions ho;
      ho.span = sp;
      ho.n_threads = threads;
      ho.n_ctx = ctx;
      ho.model_owner = std::shared_ptr<const Model>(std::move(m));
      MOESH_ASSIGN_OR_RETURN(auto h, swarm::SpanHost::create(*ho.model_owner, ho));
      return std::shared_ptr<swarm::SpanHost>(std::move(h));
    };
    o.span = std::make_shared<swarm::SpanHosts>(nullptr, std::move(loader), hp->max_span_row_width());
  }
  if (blocks && full) {
    LoadOptions lo;
    lo.memory = LoadOptions::Memory::kMap;
    auto whole = Model::load(a.model, lo);
    if (!whole) return fail(whole.status().with_context("loading the model for blocks (--no-blocks: never)"));
    std::shared_ptr<const Model> model(std::move(*whole));
    const int64_t width = model->hparams().max_span_row_width();
    swarm::SpanLoader loader = [model, threads = a.threads,
                                ctx = a.ctx](const LayerSpan& sp) -> Result<std::shared_ptr<swarm::SpanHost>> {
      swarm::SpanHostOptions ho;
      ho.span = sp;
      ho.n_threads = threads;
      ho.n_ctx = ctx;
      ho.model_owner = model;
      MOESH_ASSIGN_OR_RETURN(auto h, swarm::SpanHost::create(*model, ho));
      return std::shared_ptr<swarm::SpanHost>(std::move(h));
    };
    o.span = std::make_shared<swarm::SpanHosts>(nullptr, std::move(loader), width);
  }
  auto worker = swarm::Worker::start(store->get(), o);
  if (!worker) return fail(worker.status());
  // Host TCP settings that only the operator can change (docs/wan-emu.md): say so at start-up.
  for (const std::string& w : wan::check_host_tcp_settings(a.congestion)) {
    std::fprintf(stderr, "moesh worker: warning: %s\n", w.c_str());
  }

  const swarm::ExpertStore& s = **store;
  std::printf("model %s (id %s)\n", s.file().path().c_str(), s.identity().hex().c_str());
  std::printf("held experts: %llu (%s)\n", static_cast<unsigned long long>(s.held().n_pairs()),
              s.held().to_string().c_str());
  std::printf("slab bytes: %llu (%.2f MiB, %s)\n", static_cast<unsigned long long>(s.slab_bytes()),
              s.slab_bytes() / 1048576.0, s.in_memory() ? "in huge-page memory" : "mapped");
  std::printf("rss: %llu bytes (%.2f MiB; %.2f MiB before touching slabs)\n", static_cast<unsigned long long>(rss1),
              rss1 / 1048576.0, rss0 / 1048576.0);
  if (o.swarm_key) std::printf("swarm key: %s (backbones must prove it)\n", o.swarm_key->fingerprint().c_str());
  std::printf("name: %s\n", (*worker)->name().c_str());
  std::printf("runs blocks on a backbone's word: %s\n",
              blocks && full ? "yes, from the model file (a re-plan may make it a span peer)"
              : blocks       ? "yes, fetched from the gateway (a re-plan may make it a span peer)"
              : a.no_blocks  ? "no (--no-blocks)"
                             : "no (an expert slice; --fetch-blocks GATEWAY to fetch them)");
  if (!o.replica_dir.empty())
    std::printf("replicas: up to %.2f MiB in %s (%.2f MiB mapped from earlier runs; held now: %s)\n", a.replica_mb,
                o.replica_dir.c_str(), (*worker)->stats().replica_bytes.load() / 1048576.0,
                s.held().to_string().c_str());
  if (o.tls)
    std::printf("tls: certificate sha256 %s (backbones pass --tls-pin with it)\n", o.tls->fingerprint().c_str());
  std::unique_ptr<serve::WorkerHttp> http;
  if (!a.metrics.empty()) {
    auto h = serve::WorkerHttp::start(worker->get(), metrics_host, metrics_port);
    if (!h) return fail(h.status());
    http = std::move(*h);
    std::printf("metrics on http://%s:%d (/metrics, /swarm/ledger, /health)\n", metrics_host.c_str(), http->port());
  }
  for (const std::string& j : a.join) std::printf("joining %s (dial-out, re-dialled when lost)\n", j.c_str());
  if (o.listen) std::printf("listening on %s:%u\n", o.host.c_str(), static_cast<unsigned>((*worker)->port()));
  std::fflush(stdout);

  g_worker = worker->get();
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  (*worker)->run();
  g_worker = nullptr;
  http.reset();
  const auto& st = (*worker)->stats();
  std::printf(
      "worker stopped: %llu connections (%llu refused), %llu dispatches in %llu passes (%llu batched), %llu errors\n",
      static_cast<unsigned long long>(st.connections.load()), static_cast<unsigned long long>(st.refused.load()),
      static_cast<unsigned long long>(st.dispatches.load()), static_cast<unsigned long long>(st.computes.load()),
      static_cast<unsigned long long>(st.batched.load()), static_cast<unsigned long long>(st.errors.load()));
  std::fflush(stdout);
  return 0;
}

const CommandRegistrar kRegisterWorker{
    Command{"worker", "Serve routed experts of a model or expert slice to backbones over TCP",
            [](CLI::App* sub) -> std::function<int()> {
              auto a = std::make_shared<WorkerArgs>();
              sub->add_option("-m,--model", a->model, "Model GGUF or expert slice")->required();
              sub->add_option("--experts", a->experts,
                              "Experts to hold: LAYERS:EXPERTS items, e.g. '*:0-63' or '0-23:*,24-47:0-7' "
                              "(default with a slice: all it holds)");
              sub->add_option("--listen", a->listen,
                              "HOST:PORT to listen on (port 0: any free port; with --join only when given)")
                  ->each([a](const std::string&) { a->listen_given = true; });
              sub->add_option("--join", a->join,
                              "Dial out to a backbone's --accept-workers port (or a relay) and serve it over that "
                              "connection; repeatable. No inbound port needed. ws://HOST:PORT: over WebSocket");
              sub->add_option("--metrics", a->metrics,
                              "HOST:PORT for GET /metrics, /swarm/ledger and /health (port 0: any free port)");
              sub->add_option("-t,--threads", a->threads, "Compute threads (0: all cores)");
              sub->add_option("--name", a->name, "Name announced in the handshake");
              sub->add_option("--swarm-key", a->swarm_key,
                              "Swarm key file: only backbones proving the same key are served (mutual HMAC "
                              "challenge in the handshake)");
              sub->add_option("--tls-cert", a->tls_cert,
                              "PEM certificate (self-signed is fine): every connection must use TLS, backbones pin "
                              "its SHA-256 fingerprint (printed at start-up)");
              sub->add_option("--tls-key", a->tls_key, "PEM private key of --tls-cert");
              sub->add_option("--batch-window-us", a->batch_window_us,
                              "Hold a compute pass back this long for more backbones' requests of the same layer "
                              "(they are batched anyway when they queue; default 0)");
              sub->add_option("--max-batch-tokens", a->max_batch_tokens,
                              "Most token rows in one compute pass of batched requests (1: one request per pass)")
                  ->capture_default_str();
              sub->add_option("--replica-dir", a->replica_dir,
                              "Keep replicas of hot experts backbones send (STORE) in this folder: checked "
                              "against the model's hashes, mapped from disk, mapped again at the next start");
              sub->add_option("--replica-mb", a->replica_mb, "Most MiB of replica slabs to keep (with --replica-dir)");
              sub->add_option("--offer-mb", a->offer_mb,
                              "Memory this machine offers the swarm for model weights and state, MiB: what `moesh "
                              "swarm plan --status` may give it (default: what it holds plus half the free memory)");
              sub->add_option("--emulate-speed", a->emulate_speed,
                              "Compute as a machine this fast relative to this one, (0, 1]: each compute pass "
                              "waits out the difference (benchmarks and tests of a mixed swarm on one host)")
                  ->check(CLI::Range(0.001, 1.0));
              sub->add_option("--congestion", a->congestion, "TCP congestion control (\"\": system default)");
              add_poll_flag(sub, &a->poll_us, "the next request");
              add_memory_flags(sub, &a->memory);
              sub->add_flag("--no-blocks", a->no_blocks,
                            "Never run whole blocks (a span) on a backbone's word; by default a worker on the full "
                            "model may be given some by a re-plan (docs/span.md#loading-blocks)");
              sub->add_option("--fetch-blocks", a->fetch_blocks,
                              "On an expert slice: blocks it is given are fetched from this gateway (http://HOST:PORT "
                              "of moesh serve --admin-key; GET /swarm/slice, checked by hash)");
              sub->add_option("--admin-key", a->admin_key, "The gateway's --admin-key (with --fetch-blocks)");
              sub->add_option("--slice-dir", a->slice_dir,
                              "Where --fetch-blocks keeps span slices (default $TMPDIR, else /var/tmp)");
              sub->add_option("-c,--ctx-size", a->ctx,
                              "Cells per sequence of the blocks it is given (0: the model's context length)");
              return [a] { return run_worker(*a); };
            }}};

}  // namespace
}  // namespace moesh::cli
