// `moesh span`: a span peer — runs blocks FIRST-LAST of a model for backbones (docs/span.md).
//
// It is a worker (same port, handshake, swarm key, TLS) that also holds the span's attention and
// KV cache: a backbone started with --span FIRST-LAST@HOST:PORT sends it the rows entering the
// span once per step and gets back the rows leaving it. It serves the span's routed experts as an
// expert worker too, and may send its own MoE layers' experts to expert workers (--worker).
#include <httplib.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "command.h"
#include "http_cli.h"
#include "model_cli.h"
#include "moesh/remote/span_forward.h"
#include "moesh/swarm/span_host.h"
#include "moesh/swarm/swarm.h"
#include "moesh/wan/host_tcp.h"
#include "span_fetch.h"
#include "swarm_cli.h"

namespace moesh::cli {
namespace {

struct SpanArgs {
  LoadOptions::Memory memory = LoadOptions::Memory::kAuto;  // --mmap / --no-mmap
  std::string model;
  std::string fetch;      // --fetch URL: the span slice from a gateway (GET /swarm/slice)
  std::string admin_key;  // its --admin-key
  std::string offer;      // --offer URL: make this peer known to that gateway once it listens
  std::string advertise;  // --advertise HOST:PORT: the address the gateway dials (default: --listen's)
  std::string slice_dir;  // where the fetched slice is kept
  std::string layers;
  std::string listen = "127.0.0.1:0";
  int threads = 0;
  double emulate_speed = 1;  // --emulate-speed
  std::string name;
  std::string tls_cert, tls_key;  // --tls-cert, --tls-key
  int64_t ctx = 0;
  int max_seqs = 256;
  bool no_chain = false;    // --no-chain: answer star-style only
  std::string replica_dir;  // --replica-dir: keep expert replicas backbones send (an expert holder too)
  double replica_mb = 0;    // --replica-mb
  // --worker ...: expert workers for the span's own MoE layers; --swarm-key and --congestion
  // also apply to the backbones this peer serves.
  SwarmArgs swarm;
};

swarm::Worker* g_span_worker = nullptr;

Result<std::string> fetch_span_slice(const SpanArgs& a, const LayerSpan& sp) {
  return fetch_span_slice(SliceFetch{a.fetch, a.admin_key, a.slice_dir, "span"}, sp);
}

// --offer: tells a gateway (`moesh serve --admin-key`) this peer exists (POST /swarm/spans/add);
// it lists the peer idle until a re-plan gives it blocks, which it then loads.
Status offer_to_gateway(const SpanArgs& a, const std::string& address) {
  httplib::Client cli(base_url(a.offer));
  cli.set_connection_timeout(10, 0);
  cli.set_read_timeout(30, 0);
  httplib::Headers h;
  if (!a.admin_key.empty()) h.emplace("Authorization", "Bearer " + a.admin_key);
  auto res = cli.Post("/swarm/spans/add", h, nlohmann::json{{"address", address}}.dump(), "application/json");
  if (!res)
    return make_error(StatusCode::kUnavailable, "{}/swarm/spans/add: {}", a.offer, httplib::to_string(res.error()));
  if (res->status != 200) {
    return make_error(StatusCode::kUnavailable, "{}/swarm/spans/add: HTTP {}: {}", a.offer, res->status,
                      api_error_message(res->body));
  }
  return Status::ok();
}

extern "C" void on_span_stop_signal(int) {
  if (g_span_worker != nullptr) g_span_worker->stop();
}

int run_span(const SpanArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh span: error: %s\n", s.to_string().c_str());
    return 1;
  };
  if (!a.swarm.spans.empty())
    return fail(make_error(StatusCode::kInvalidArgument, "a span peer does not itself use --span"));
  // No --layers: a peer that runs no blocks until a gateway gives it some (a span, a lane; with
  // --replica-dir also experts): one process whose role the gateway's re-plan chooses.
  std::optional<LayerSpan> span;
  if (!a.layers.empty()) {
    auto sp = parse_layer_span(a.layers);
    if (!sp) return fail(sp.status().with_context("--layers"));
    span = *sp;
  } else if (a.model.empty()) {
    return fail(make_error(StatusCode::kInvalidArgument,
                           "--fetch needs --layers (the first blocks to fetch); without --layers give -m FULL_MODEL"));
  }
  auto where = parse_listen_address(a.listen);
  if (!where) return fail(make_error(StatusCode::kInvalidArgument, "--listen '{}' is not HOST:PORT", a.listen));
  if (a.model.empty() == a.fetch.empty())
    return fail(make_error(StatusCode::kInvalidArgument, "give exactly one of -m MODEL and --fetch GATEWAY"));
  std::string model_path = a.model;
  if (!a.fetch.empty()) {
    auto got = fetch_span_slice(a, *span);  // span is set: checked above
    if (!got) return fail(got.status().with_context("--fetch"));
    model_path = *got;
  }
  auto model = load_model_or_report(model_path, false, "span", a.memory);
  if (!model) return 1;
  std::shared_ptr<RemoteExecutor> remote;
  if (!open_remote_or_report(*model, a.swarm, "span", &remote)) return 1;
  if (!span && !swarm::slice_kind(model->file()).empty())
    return fail(make_error(StatusCode::kInvalidArgument,
                           "{} is a slice: a peer without --layers loads the blocks it is given from a full model",
                           model_path));
  swarm::SpanHostOptions ho;
  ho.span = span.value_or(LayerSpan{0, 0});
  ho.n_threads = a.threads;
  ho.n_ctx = a.ctx;
  ho.executor = remote;
  if (a.max_seqs < 1) return fail(make_error(StatusCode::kInvalidArgument, "--max-seqs must be >= 1"));
  ho.max_seqs = static_cast<size_t>(a.max_seqs);
  std::shared_ptr<swarm::SpanHost> first;
  if (span) {
    auto host = swarm::SpanHost::create(*model, ho);
    if (!host) return fail(host.status());
    first = std::move(*host);
  }
  auto own_id = swarm::model_identity(model->file());
  if (!own_id) return fail(own_id.status());
  // Other blocks on a backbone's word (SPAN_HOLD; docs/span.md#loading-blocks): from the model
  // itself when this peer holds all of it, else from a slice fetched from the gateway.
  const bool full = swarm::slice_kind(model->file()).empty();
  swarm::SpanLoader loader;
  if (full || !a.fetch.empty()) {
    const Model* whole = full ? model.get() : nullptr;
    loader = [a, ho, whole, id = *own_id](const LayerSpan& sp) -> Result<std::shared_ptr<swarm::SpanHost>> {
      swarm::SpanHostOptions o = ho;
      o.span = sp;
      if (whole != nullptr) {
        MOESH_ASSIGN_OR_RETURN(auto h, swarm::SpanHost::create(*whole, o));
        return std::shared_ptr<swarm::SpanHost>(std::move(h));
      }
      MOESH_ASSIGN_OR_RETURN(
          std::unique_ptr<Model> m,
          load_fetched_span(SliceFetch{a.fetch, a.admin_key, a.slice_dir, "span"}, sp, a.memory, id));
      // Its own experts: the slice holds them, and the expert workers of this peer's first
      // blocks need not hold these.
      o.executor = nullptr;
      o.model_owner = std::shared_ptr<const Model>(std::move(m));
      MOESH_ASSIGN_OR_RETURN(auto h, swarm::SpanHost::create(*o.model_owner, o));
      return std::shared_ptr<swarm::SpanHost>(std::move(h));
    };
  }
  auto hosts = std::make_shared<swarm::SpanHosts>(std::move(first), loader);

  // The span's routed experts, served to backbones as an expert worker as well.
  auto file = gguf::File::open(model_path);
  if (!file) return fail(file.status());
  auto shape = swarm::model_shape(**file);
  if (!shape) return fail(shape.status());
  std::vector<wire::ExpertRange> ranges;
  for (uint32_t l : shape->moe_layers) {
    if (span && static_cast<int>(l) >= span->first && static_cast<int>(l) <= span->last)
      ranges.push_back({l, 0, shape->n_expert});
  }
  // Dense blocks only (a model's leading dense layers): a peer that serves no experts.
  const bool dense = ranges.empty();
  auto store = swarm::ExpertStore::open(std::move(*file), swarm::canonicalize(std::move(ranges)), dense);
  if (!store) return fail(store.status());

  swarm::WorkerOptions o;
  o.host = where->host;
  o.port = where->port;
  o.n_threads = a.threads;
  o.emulate_speed = a.emulate_speed;
  o.congestion = a.swarm.congestion;
  o.poll_us = a.swarm.poll_us;
  o.name = !a.name.empty() ? a.name : span ? fmt::format("span-{}-{}", span->first, span->last) : "span-peer";
  if (!a.swarm.swarm_key.empty()) {
    auto key = net::SwarmKey::load(a.swarm.swarm_key);
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
  o.span = hosts;
  // Replicas (STORE): a re-plan may make this peer an expert holder of other layers.
  if (a.replica_dir.empty() != (a.replica_mb <= 0))
    return fail(make_error(StatusCode::kInvalidArgument, "--replica-dir and --replica-mb (> 0) go together"));
  o.replica_dir = a.replica_dir;
  o.replica_budget_bytes = static_cast<uint64_t>(a.replica_mb * 1048576.0);
  if (!a.no_chain) {
    // Chained spans: this peer passes chained steps on to the next span's peer itself, with its
    // own swarm key and socket settings (TLS-pinned swarms are not chained by backbones).
    auto ro = remote_options(a.swarm);
    if (!ro) return fail(ro.status());
    SpanForwardOptions fo;
    fo.link = ro->link_options();
    fo.name = o.name;
    auto fwd = SpanForwardLinks::create(*model, fo);
    if (!fwd) return fail(fwd.status());
    o.span_forwarder = std::move(*fwd);
  }
  auto worker = swarm::Worker::start(store->get(), o);
  if (!worker) return fail(worker.status());
  for (const std::string& w : wan::check_host_tcp_settings(a.swarm.congestion)) {
    std::fprintf(stderr, "moesh span: warning: %s\n", w.c_str());
  }
  std::printf("model %s (id %s)\n", model_path.c_str(), (*store)->identity().hex().c_str());
  if (span)
    std::printf("span: blocks %d-%d of %lld\n", span->first, span->last,
                static_cast<long long>(model->hparams().n_layer));
  else
    std::printf("span: none yet (runs the blocks a gateway gives it, of %lld)\n",
                static_cast<long long>(model->hparams().n_layer));
  std::printf("held experts: %llu (%s)\n", static_cast<unsigned long long>((*store)->held().n_pairs()),
              (*store)->held().to_string().c_str());
  std::printf("name: %s\n", (*worker)->name().c_str());
  std::printf("loads other blocks: %s\n", !hosts->can_load() ? "no (started from a slice without --fetch)"
                                          : full             ? "yes, from the model file"
                                                             : "yes, fetched from the gateway");
  if (o.swarm_key) std::printf("swarm key: %s (backbones must prove it)\n", o.swarm_key->fingerprint().c_str());
  if (o.tls) std::printf("tls: certificate sha256 %s\n", o.tls->fingerprint().c_str());
  std::printf("listening on %s:%u\n", o.host.c_str(), static_cast<unsigned>((*worker)->port()));
  std::fflush(stdout);

  std::string offer_address = a.advertise;
  if (!a.offer.empty() && offer_address.empty()) {
    if (o.host == "0.0.0.0" || o.host == "::" || o.host.empty())
      return fail(make_error(StatusCode::kInvalidArgument,
                             "--offer with --listen {}: give --advertise HOST:PORT (where the gateway reaches this "
                             "peer)",
                             a.listen));
    offer_address =
        fmt::format("{}:{}", o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host, (*worker)->port());
  }
  g_span_worker = worker->get();
  struct sigaction sa = {};
  sa.sa_handler = on_span_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // --offer once the worker serves: the gateway dials this peer while answering.
  std::atomic<bool> offer_failed{false};
  std::thread offer;
  if (!a.offer.empty()) {
    offer = std::thread([&] {
      Status st = offer_to_gateway(a, offer_address);
      if (st.is_ok()) {
        std::printf("offered to %s as %s\n", a.offer.c_str(), offer_address.c_str());
        std::fflush(stdout);
        return;
      }
      std::fprintf(stderr, "moesh span: error: --offer: %s\n", st.to_string().c_str());
      offer_failed = true;
      (*worker)->stop();
    });
  }
  (*worker)->run();
  if (offer.joinable()) offer.join();
  g_span_worker = nullptr;
  if (offer_failed) return 1;
  std::shared_ptr<swarm::SpanHost> first_host = span ? hosts->find(*span) : nullptr;
  swarm::SpanHostStats none;
  const swarm::SpanHostStats& hs = first_host ? first_host->stats() : none;
  std::printf(
      "span peer stopped: %llu steps, %llu rows (%llu replayed), %llu answered with missing inputs, %llu prefix "
      "copies, %llu evictions, %llu errors; %llu expert dispatches; chained: %llu received from a peer, %llu "
      "passed on (%llu failed), %llu awaits\n",
      static_cast<unsigned long long>(hs.steps.load()), static_cast<unsigned long long>(hs.rows.load()),
      static_cast<unsigned long long>(hs.replayed_rows.load()), static_cast<unsigned long long>(hs.needs.load()),
      static_cast<unsigned long long>(hs.prefix_copies.load()), static_cast<unsigned long long>(hs.evictions.load()),
      static_cast<unsigned long long>(hs.errors.load()),
      static_cast<unsigned long long>((*worker)->stats().dispatches.load()),
      static_cast<unsigned long long>((*worker)->stats().span_forwarded.load()),
      static_cast<unsigned long long>((*worker)->stats().span_forwards.load()),
      static_cast<unsigned long long>((*worker)->stats().span_forward_errors.load()),
      static_cast<unsigned long long>((*worker)->stats().span_awaits.load()));
  std::fflush(stdout);
  return 0;
}

const CommandRegistrar kRegisterSpan{Command{
    "span", "Run blocks FIRST-LAST of a model for backbones (a span peer; backbones use --span)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<SpanArgs>();
      sub->add_option("-m,--model", a->model, "Model GGUF (or a span slice of it)");
      sub->add_option("--fetch", a->fetch,
                      "Instead of -m: download the span slice from a gateway (http://HOST:PORT of moesh serve "
                      "--admin-key), checked by hash");
      sub->add_option("--admin-key", a->admin_key, "The gateway's --admin-key (with --fetch or --offer)");
      sub->add_option("--offer", a->offer,
                      "http://HOST:PORT of a gateway (moesh serve --admin-key) to tell of this peer once it listens: "
                      "it lists it idle until a re-plan gives it blocks, which it then loads");
      sub->add_option("--advertise", a->advertise,
                      "HOST:PORT the gateway dials this peer at (with --offer; default: the --listen address)");
      sub->add_option("--slice-dir", a->slice_dir,
                      "Where --fetch keeps the slice (default $TMPDIR, else /var/tmp): span-FIRST-LAST.gguf");
      add_memory_flags(sub, &a->memory);
      sub->add_option("--layers", a->layers,
                      "Blocks to run: FIRST-LAST (e.g. 12-23); none (with -m on the full model): no blocks until a "
                      "gateway gives it some (a span, a lane; with --replica-dir also experts), so its re-plan "
                      "chooses this peer's role");
      sub->add_option("--listen", a->listen, "HOST:PORT to listen on (port 0: any free port)")->capture_default_str();
      sub->add_option("-t,--threads", a->threads, "Compute threads (0: all cores)");
      sub->add_option("--emulate-speed", a->emulate_speed,
                      "Compute as a machine this fast relative to this one, (0, 1]: each step waits out the "
                      "difference (benchmarks and tests of a mixed swarm on one host)")
          ->check(CLI::Range(0.001, 1.0));
      sub->add_option("--name", a->name, "Name announced in the handshake (default span-FIRST-LAST)");
      sub->add_option("-c,--ctx-size", a->ctx, "Cells per sequence (0: the model's context length)");
      sub->add_option("--max-seqs", a->max_seqs,
                      "Sequences kept over all backbones; the least recently used beyond it is dropped "
                      "(its backbone replays it)")
          ->capture_default_str();
      sub->add_flag("--no-chain", a->no_chain,
                    "Do not take chained steps (pass rows on to the next span's peer); backbones then use star "
                    "trips");
      sub->add_option("--replica-dir", a->replica_dir,
                      "Keep replicas of experts backbones send (STORE) in this folder, as `moesh worker` does: a "
                      "gateway's re-plan may make this peer an expert holder (docs/span.md#loading-blocks)");
      sub->add_option("--replica-mb", a->replica_mb, "Most MiB of replica slabs to keep (with --replica-dir)");
      sub->add_option("--tls-cert", a->tls_cert, "PEM certificate: every connection must use TLS");
      sub->add_option("--tls-key", a->tls_key, "PEM private key of --tls-cert");
      add_swarm_options(sub, &a->swarm);
      return [a] { return run_span(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
