// Shared vocabulary of the swarm: which experts a process holds (expert specs), which model it
// serves (model identity), the HELLO values both roles announce, expert slices, and the worker.
//
// Backbone (src/remote/remote_executor.cpp, src/remote/placement.cpp) and worker (src/swarm/worker*)
// both code against this header, so a spec, an identity or a HELLO means the same on both ends.
//
// Expert spec (CLI `--experts`): comma-separated `LAYERS:EXPERTS` items; each side is an
// inclusive range `a-b`, a single number, or `*`. `*` layers = every MoE layer; `*` experts =
// 0..n_expert-1. A layer range may span dense layers (they are skipped) but must contain at least
// one MoE layer; a single dense layer is an error. Examples: `*:0-63`, `0-23:*,24-47:0-7`.
// The parsed form is canonical: ranges sorted by (layer, first), overlaps and adjacent ranges
// merged, so two specs that select the same experts compare equal.
//
// Model identity: XXH3-128 over a canonical serialization of the GGUF metadata KVs (file order,
// every key except the `moesh.slice.*` ones) and the tensor table (name, type, dims, ne; never the
// data). A slice file (experts or backbone) stores the identity of the model it was cut from
// under `moesh.slice.model_id` (32 lowercase hex chars), and model_identity() returns that, so a
// worker started from a slice and a backbone started from the full model (or a backbone slice)
// agree in the HELLO.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/moe/executor.h"
#include "moesh/net/auth.h"
#include "moesh/net/tls.h"
#include "moesh/net/transport.h"
#include "moesh/util/status.h"
#include "moesh/wire/wire.h"

namespace moesh::swarm {

// ---- metadata keys written into slice files (docs/slice.md) ---------------------------------
inline constexpr const char* kKeyModelId = "moesh.slice.model_id";      // hex of the identity
inline constexpr const char* kKeyKind = "moesh.slice.kind";             // "experts" | "backbone"
inline constexpr const char* kKeyExperts = "moesh.slice.experts";       // canonical spec text
inline constexpr const char* kKeyMoeLayers = "moesh.slice.moe_layers";  // i32 array
// Per slice tensor T: `moesh.slice.hash.` + T = u64 array, XXH3-64 of each expert slab in T.
inline constexpr const char* kKeyHashPrefix = "moesh.slice.hash.";
// Backbone and span slices, per tensor T that is not a stacked expert tensor (attention, norms,
// router, shared experts, embeddings): `moesh.slice.tensor_hash.` + T = u64, XXH3-64 of T's bytes.
inline constexpr const char* kKeyTensorHashPrefix = "moesh.slice.tensor_hash.";
// Backbone slices: [ggml type, ne0, ne1, ne2] of each stacked `*_exps` tensor left out, so a
// backbone knows what an expert copy costs before it fetches one.
inline constexpr const char* kKeyLayoutPrefix = "moesh.slice.layout.";
inline constexpr const char* kKindExperts = "experts";
inline constexpr const char* kKindBackbone = "backbone";
inline constexpr const char* kKindSpan = "span";
inline constexpr const char* kKeySpan = "moesh.slice.span";  // i32 [first, last] of a span slice

// ---- model shape -----------------------------------------------------------------------------

// What specs and HELLOs are checked against.
struct ModelShape {
  uint32_t n_layer = 0;
  uint32_t n_expert = 0;
  uint32_t n_embd = 0;
  std::vector<uint32_t> moe_layers;  // ascending: layers with routed experts
  ExpertFfn expert_ffn;              // the architecture's routed expert definition (sent in HELLO v4)
  bool is_moe(uint32_t layer) const;
};

// n_layer/n_expert/n_embd from the architecture's metadata (load_hparams); MoE layers from
// `moesh.slice.moe_layers` in a slice, else the layers with `blk.N.ffn_gate_exps.weight`.
Result<ModelShape> model_shape(const gguf::File& f);

// ---- expert specs ----------------------------------------------------------------------------

// A canonical set of held (layer, expert) pairs: ranges sorted by (layer, first), disjoint and
// non-adjacent within a layer (adjacent ranges are merged), each count >= 1.
struct ExpertSet {
  std::vector<wire::ExpertRange> ranges;

  bool empty() const { return ranges.empty(); }
  bool holds(uint32_t layer, uint32_t expert) const;
  bool contains(const ExpertSet& other) const;  // every pair of `other` is held
  uint64_t n_pairs() const;                     // number of (layer, expert) pairs
  // Canonical text, one item per range: "0:0-7,1:3" (parse_expert_spec reads it back).
  std::string to_string() const;
  bool operator==(const ExpertSet&) const = default;
};

// Sorts and merges ranges (no validation against a model).
ExpertSet canonicalize(std::vector<wire::ExpertRange> ranges);
// Parses `spec` against the model's shape. kInvalidArgument naming the item and the reason
// (garbage, reversed range "5-3", layer/expert out of range, dense layer, empty spec).
Result<ExpertSet> parse_expert_spec(std::string_view spec, const ModelShape& shape);
// Checks a range list received in a HELLO against the shape and canonicalizes it.
Result<ExpertSet> expert_set_from_ranges(const std::vector<wire::ExpertRange>& ranges, const ModelShape& shape);

// ---- model identity ----------------------------------------------------------------------------

struct ModelIdentity {
  std::array<uint8_t, 16> bytes{};  // XXH3-128, big-endian canonical form (XXH128_canonical_t)
  std::string hex() const;          // 32 lowercase hex chars
  static Result<ModelIdentity> from_hex(std::string_view hex);
  bool operator==(const ModelIdentity&) const = default;
};

// The identity of the file's model: stored `moesh.slice.model_id` if present, else the hash of
// the metadata (minus `moesh.slice.*` keys) and tensor table.
Result<ModelIdentity> model_identity(const gguf::File& f);
// Always hashes (ignores a stored id); slice writers and tests use it.
ModelIdentity compute_model_identity(const gguf::File& f);

// ---- handshake values --------------------------------------------------------------------------

// Capabilities a moesh worker offers: every wire dtype (F32, F16, BF16, Q8) and both combine
// modes (EXACT, PARTIAL). A backbone announces what it is willing to use (normally the same).
inline constexpr uint32_t kAllDTypes = (1u << static_cast<int>(wire::WireDType::kCOUNT)) - 1;
inline constexpr uint32_t kAllModes = (1u << static_cast<int>(wire::CombineMode::kCOUNT)) - 1;

// The HELLO a process sends: model_id_bytes = 16 with the identity bytes, n_layer/n_expert/
// n_embd from the shape, dtypes = kAllDTypes, modes = kAllModes, features = kFeatureFetch (a
// worker serves FETCH, a backbone may send it), kFeatureInfo (a worker answers INFO with its
// capacity) and, for a backbone, kFeatureStore and kFeatureUnstore (it may send STORE and UNSTORE;
// a worker with a replica folder adds the bits itself), the held experts' ranges (empty for a backbone),
// the name.
wire::Hello make_hello(wire::PeerRole role, const ModelIdentity& id, const ModelShape& shape, const ExpertSet& held,
                       std::string name);

// ---- held expert slabs ---------------------------------------------------------------------

// Zero-copy views of the held experts of a full model or an expert slice. Lookup gives the
// stacked ExpertWeights containing (layer, expert) and the expert's index inside it, to be passed
// to expert_ffn: for a full model the layer's whole stacked tensors and the expert id itself; for
// a slice the range tensor and expert - first.
class ExpertStore {
 public:
  // `held` empty: everything the file holds (a slice's experts; all experts of a full model).
  // Otherwise every held pair must be in the file (kNotFound naming it). A slice's slab hashes
  // are verified for the held slabs (kCorrupt naming the tensor and expert on mismatch).
  // hold_none: `held` is ignored and the store holds no expert — the model's identity and shape
  // only (a span peer whose blocks are all dense serves no experts).
  static Result<std::unique_ptr<ExpertStore>> open(std::unique_ptr<gguf::File> file, const ExpertSet& held,
                                                   bool hold_none = false);
  ~ExpertStore();

  struct Slot {
    const ExpertWeights* weights = nullptr;
    int64_t index = 0;
  };
  // weights == nullptr when not held.
  Slot find(uint32_t layer, uint32_t expert) const;

  const ExpertSet& held() const { return held_; }
  const ModelShape& shape() const { return shape_; }
  const ModelIdentity& identity() const { return id_; }
  const gguf::File& file() const { return *file_; }
  // Bytes of the held slabs (gate + up + down of every held expert).
  uint64_t slab_bytes() const { return slab_bytes_; }
  // Advises the kernel the held slabs are needed and reads one byte per page of each, so the
  // first request does not page-fault and RSS reflects the held bytes.
  void prefault() const;
  // Copies the held slabs (and bias rows) into one anonymous region advised MADV_HUGEPAGE,
  // read-only afterwards, and serves them from there; the file's pages of those slabs are
  // dropped from this process's mapping, so RSS still ~ slab bytes. Why: on 4 KiB page-cache
  // pages every expert matrix walk misses the TLB — a MoE call of the 30B-A3B-shaped model took
  // 1.35-1.44 ms mapped against 1.08-1.11 ms in huge pages (docs/PERFORMANCE.md). Bits are the
  // same (same bytes). kIoError when the memory cannot be had (the store keeps serving
  // the mapping). Replicas absorbed later stay mapped.
  Status load_into_memory();
  bool in_memory() const { return region_ != nullptr; }
  // Takes over the experts of `other` (a replica slice of the same model, e.g. received in a
  // STORE and written to disk): held() and find() include them from now on, their file stays
  // mapped. kInvalidArgument for another model or when a pair is already held. Not thread-safe: the worker excludes
  // lookups while it runs.
  Status absorb(std::unique_ptr<ExpertStore> other);
  // Lets go of the replica holding (layer, expert) (a store absorb() took): held() and find() no
  // longer include it, and the replica is handed back so the caller unmaps it (by destroying it)
  // once no lookup can still read its weights — the worker holds its lookups' lock meanwhile.
  // kNotFound when the expert is not held; kUnsupported when it is part of this store's own
  // file (not a replica) or its replica holds other experts too (it goes only whole). Not
  // thread-safe, like absorb().
  Result<std::unique_ptr<ExpertStore>> release(uint32_t layer, uint32_t expert);

 private:
  ExpertStore() = default;
  struct Block {  // a run of held experts of one layer inside one stacked (or range) tensor
    uint32_t layer = 0, first = 0, count = 0;  // global expert ids [first, first + count)
    int64_t index_base = 0;                    // index in `w` of expert `first`
    size_t w_index = 0;                        // into weights_
  };
  std::unique_ptr<gguf::File> file_;
  ModelShape shape_;
  ModelIdentity id_;
  ExpertSet held_;
  std::vector<std::unique_ptr<ExpertWeights>> weights_;
  std::vector<Block> blocks_;  // sorted by (layer, first)
  uint64_t slab_bytes_ = 0;
  std::vector<std::unique_ptr<ExpertStore>> absorbed_;  // keep the absorbed files mapped
  struct Region;                                        // load_into_memory's copy
  std::unique_ptr<Region> region_;
};

// The definition of the model's routed experts (activation, biases, input scaling) as its
// architecture's file in the model registry declares it (load_hparams).
Result<ExpertFfn> expert_ffn_of(const gguf::File& f);

// ---- slices --------------------------------------------------------------------------------

// Expert slice: for each held range of each layer, tensors `blk.L.ffn_{gate,up,down}_exps.weight`
// + `@F-L` (inclusive global expert ids) holding those slabs stacked; all metadata of the model
// (minus moesh.slice.*), kind, spec, MoE layers, the identity and a slab hash array per tensor;
// and, like a backbone slice, the slab hashes and layout of every stacked expert tensor of the
// model, so the worker can check any expert it is later sent (STORE) against the model.
// `model` (a full model or an expert slice) must come from File::open: its path is reopened.
Status write_expert_slice(const gguf::File& model, const ExpertSet& experts, const std::string& out);
// Backbone slice: every tensor except `*_exps`, the metadata, kind = backbone, MoE layers, the
// identity, and for each stacked (3-D) `*_exps` tensor of the model its slab hash array
// (`moesh.slice.hash.` + name, one XXH3-64 per expert), so experts received later can be checked.
Status write_backbone_slice(const gguf::File& model, const std::string& out);
// Span slice (`moesh slice --layers F-L`, for `moesh span`): every tensor of blocks F..L, the
// global tensors the blocks read (norms, rope factors; not token_embd / output), the metadata,
// kind = span, the span, MoE layers and the identity. Model::load binds only those blocks.
Status write_span_slice(const gguf::File& model, int first, int last, const std::string& out);
// XXH3-128 of a whole file as 32 hex digits: what a gateway sends with a slice it cuts for a peer
// (`GET /swarm/slice`) and the peer checks its download against (`moesh span --fetch`).
Result<std::string> file_hash_hex(const std::string& path);
// Replicas (wire STORE): checks one expert's slabs against the model `f` describes — each tensor's
// type and 2-D shape against the stacked tensor's layout, its bytes' hash against the model's own
// slab hash (a full model's data, or the arrays every slice carries for every stacked tensor) —
// so a worker keeps only the model's real weights, whoever sent them. kCorrupt naming the tensor
// and what differs; kNotFound when `f` has no hashes or layout to check with (a slice cut before
// they were recorded); kUnsupported for experts with biases (a SLAB carries no bias rows).
Status check_slab_for_model(const gguf::File& f, const wire::SlabMsg& slab);
// Writes a one-expert expert slice of `slab` (checked with check_slab_for_model) to `out` — the
// model's metadata from `f`, the three slab tensors `blk.L.ffn_*_exps.weight@E-E` and their hashes
// — through a temporary file renamed into place, so a crash never leaves a half-written replica.
Status write_replica_slice(const gguf::File& f, const wire::SlabMsg& slab, const std::string& out);

// The name of the slice tensor holding experts [first, last] of `base` (e.g.
// "blk.3.ffn_up_exps.weight@0-7").
std::string slice_tensor_name(const std::string& base, uint32_t first, uint32_t last);
// XXH3-64 of one slab (what the hash arrays hold).
uint64_t slab_hash(const uint8_t* data, size_t n_bytes);
// A copy of expert `index` of stacked weights `w` (gate, up, down slabs, bytes as mapped) as a SLAB
// / STORE message for (layer, expert), request id 0; each tensor's hash from `hashes` when given
// (a cache), else computed.
wire::SlabMsg slab_of(const ExpertWeights& w, int64_t index, uint32_t layer, uint32_t expert,
                      const std::array<uint64_t, 3>* hashes = nullptr);
// The slab hashes of stacked expert tensor `tensor_name` (one per expert, in stacking order):
// the stored `moesh.slice.hash.<name>` array when the file has it (backbone and expert slices;
// kCorrupt if its length is not the expert count), else computed from the tensor's data (a full
// model). kNotFound when the file has neither (e.g. a backbone slice from before the hashes);
// kInvalidArgument when the tensor is not 3-D.
Result<std::vector<uint64_t>> expert_slab_hashes(const gguf::File& f, const std::string& tensor_name);
// Type and shape of stacked expert tensor `tensor_name`: from the file's tensor table, or from a
// backbone slice's `moesh.slice.layout.<name>`; kNotFound with neither, kCorrupt for a bad entry.
struct ExpertTensorLayout {
  GgmlType type = GgmlType::F32;
  uint64_t ne0 = 0, ne1 = 0, ne2 = 0;  // ne2: experts
};
Result<ExpertTensorLayout> expert_tensor_layout(const gguf::File& f, const std::string& tensor_name);
// "experts", "backbone", or "" for a full model.
std::string slice_kind(const gguf::File& f);
// Checks every non-expert tensor of a backbone or span slice against its stored
// `moesh.slice.tensor_hash.` (expert slabs are checked per slab when an ExpertStore maps them), so
// a damaged slice cannot run attention or a router on wrong bytes. OK (and *n_checked = 0) for a
// full model or an expert slice; kCorrupt naming the first tensor whose bytes differ, or a tensor
// without a hash in a slice that has hashes; kNotFound when the slice has no tensor hashes at all
// (cut before they were recorded: the caller warns and runs unverified).
Status verify_slice_tensors(const gguf::File& f, int* n_checked = nullptr);

// ---- the worker process ------------------------------------------------------------------------

class SpanHost;
class SpanHosts;
class SpanForwarder;

struct WorkerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                 // 0: any free port (printed)
  int n_threads = 0;                 // compute threads; <= 0: hardware concurrency
  std::string name;                  // announced in HELLO; empty: "worker@HOST:PORT"
  std::string congestion = "cubic";  // TCP_CONGESTION, set before listen()
  int poll_us = 0;                   // busy-poll receives this long before sleeping (net::TcpOptions)
  uint64_t offer_bytes = 0;          // memory offered to the swarm's planner (INFO_REPLY); 0: not said
  // Computes as a machine this fast relative to this one (`--emulate-speed`, (0, 1]; 1: off): after
  // each compute pass (a DISPATCH batch, a span step) it waits (1/F - 1) x that pass's time before
  // answering and reports the whole as its compute time. For benchmarks and tests of a mixed swarm
  // (a phone beside a desktop) on one host; the bits are unchanged.
  double emulate_speed = 1.0;
  uint32_t max_frame_bytes = wire::kDefaultMaxFrameBytes;
  // Every backbone must prove it holds this key before anything is served (net/auth.h); null:
  // open to any backbone of the same model.
  std::shared_ptr<const net::SwarmKey> swarm_key;
  // Dial-out (`--join HOST:PORT`, repeatable): the worker connects to each backbone (or relay)
  // itself and serves it over that connection, so it needs no inbound port. A lost connection
  // is re-dialled after join_backoff (doubling up to join_backoff_max, reset by a handshake that
  // succeeds); a joined connection on which nothing arrives for join_idle_timeout (the backbone
  // pings every few seconds) is taken for dead and re-dialled.
  std::vector<std::pair<std::string, uint16_t>> join;
  bool listen = true;  // false: serve only the joined backbones (no listening socket)
  std::chrono::milliseconds join_backoff{1000};
  std::chrono::milliseconds join_backoff_max{30000};
  std::chrono::milliseconds join_idle_timeout{20000};
  // TLS (net/tls.h): with a certificate every connection must start with a TLS handshake, this
  // worker being the server; backbones pin the certificate's fingerprint. Null: plain TCP.
  std::shared_ptr<const net::TlsIdentity> tls;
  // Federation: DISPATCHes of several backbones for the same layer that are waiting while another
  // computes are computed together in one pass (each gets its own bits). batch_window > 0 also
  // holds a compute back that long for more of them to arrive (`--batch-window-us`): a trade of
  // latency for fewer passes over the weights when many backbones share this worker.
  std::chrono::microseconds batch_window{0};
  uint32_t max_batch_tokens = 4096;  // token rows in one pass, at most
  // Replicas (`--replica-dir DIR --replica-mb N`): a backbone may send this worker copies of hot
  // experts (STORE). Each is checked against the model's own slab hashes, written to DIR as a
  // one-expert slice, mapped from there and served from then on — and again after a restart (the
  // worker maps every replica in DIR at start). At most replica_budget_bytes of slabs; empty dir
  // or budget 0: STORE is not offered.
  std::string replica_dir;
  uint64_t replica_budget_bytes = 0;
  // Like `join`, over WebSocket (`--join ws://HOST:PORT`, net/websocket.h): for networks that only
  // let HTTP out. The relay or registry tells it from TCP by its first bytes.
  std::vector<std::pair<std::string, uint16_t>> join_ws;
  // Span peer (`moesh span`, span_host.h): also runs whole blocks for backbones (SPAN_STEP,
  // feature bit kFeatureSpan), and loads others when a backbone asks if it can (SPAN_HOLD,
  // kFeatureSpanLoad). Null: an expert worker only.
  std::shared_ptr<SpanHosts> span;
  // Chained spans (span_chain.h): passes the rows of a chained step on to the next span's peer
  // and answers SPAN_AWAIT (feature bit kFeatureSpanChain). Null: steps are answered star-style
  // only. Needs `span`.
  std::shared_ptr<SpanForwarder> span_forwarder;
};

struct WorkerStats {
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> dispatches{0};
  std::atomic<uint64_t> fetches{0};  // FETCH requests, answered or not
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> refused{0};         // connections refused in the handshake (wrong model, no or wrong swarm key)
  std::atomic<uint64_t> joins{0};           // dial-out connections that completed the handshake (--join)
  std::atomic<uint64_t> join_failures{0};   // dial-outs that failed (connect or handshake)
  std::atomic<uint64_t> computes{0};        // compute passes (one per DISPATCH, or one per batch of them)
  std::atomic<uint64_t> batched{0};         // DISPATCHes computed in a pass together with others
  std::atomic<uint64_t> stores{0};          // replicas received (STORE answered with STORED)
  std::atomic<uint64_t> store_refusals{0};  // STOREs refused (budget, hashes, shape, disk)
  std::atomic<uint64_t> replica_bytes{0};   // slab bytes of the replicas held now
  std::atomic<uint64_t> unstores{0};        // replicas let go of (UNSTORE answered with UNSTORED)
  std::atomic<uint64_t> span_steps{0};      // SPAN_STEPs received (span peers)
  std::atomic<uint64_t> span_forwarded{0};  // chained steps received from another span peer
  std::atomic<uint64_t> span_forwards{0};   // chained steps passed on to the next span's peer
  std::atomic<uint64_t> span_forward_errors{0};  // of which could not be sent
  std::atomic<uint64_t> span_awaits{0};          // SPAN_AWAITs received
  std::atomic<uint64_t> span_holds{0};           // SPAN_HOLDs answered or refused (loads, drops, lists)
};

// One side's account of the work done between a backbone and a worker (the work ledger): the
// backbone keeps one per worker, the worker one per backbone (keyed by the peer's HELLO name, kept
// across reconnections). Both count the same frames, so in a run without failures the two sides'
// requests, dispatches, pairs, tokens and bytes are equal (docs/operations.md: what may differ
// after a failure, e.g. a reply the backbone gave up on).
struct LedgerEntry {
  std::string peer;              // the other side's HELLO name
  std::string address;           // where it was last seen ("host:port")
  uint64_t requests = 0;         // DISPATCH frames (sent by the backbone / received by the worker)
  uint64_t dispatches = 0;       // of which answered with a valid COMBINE (accepted / sent)
  uint64_t pairs = 0;            // (token, expert) pairs computed in those
  uint64_t tokens = 0;           // token rows in those
  uint64_t dispatch_bytes = 0;   // DISPATCH frames, headers included (all requests)
  uint64_t combine_bytes = 0;    // COMBINE frames, headers included
  uint64_t errors = 0;           // requests that failed (ERROR replies, timeouts, bad COMBINEs)
  uint64_t fetches = 0;          // expert copies served (FETCH answered with a SLAB)
  uint64_t fetch_bytes = 0;      // SLAB frames
  uint64_t verified = 0;         // backbone only: results recomputed and compared (--verify-rate)
  uint64_t mismatches = 0;       // backbone only: of which differed
  double compute_seconds = 0;    // compute time of the dispatches (as the worker measured it)
  double connected_seconds = 0;  // time connected (backbone: time the worker was up)
  bool connected = false;        // connected now (backbone: planned with, not down)
};

// Serves backbones until stop() (or a signal handler calling it). Connections are served
// concurrently (a reader thread each); DISPATCH compute goes through one shared thread pool, one
// pass at a time; requests for the same layer that queue meanwhile share the next pass. FETCH is
// answered with a SLAB of the held expert's mapped bytes (or ERROR NOT_HELD) on the connection's
// thread. The store must outlive the worker; replicas it receives (STORE) are absorbed into it.
class Worker {
 public:
  static Result<std::unique_ptr<Worker>> start(ExpertStore* store, const WorkerOptions& opts);
  ~Worker();
  uint16_t port() const;  // 0 when not listening
  // Blocks until stop() is called; then sends GOODBYE to every peer and joins all threads.
  void run();
  // Async-signal-safe: only sets a flag the accept loop polls.
  void stop();
  // Serves one already-connected peer (handshake first) on its own thread, like an accepted TCP
  // connection: how in-process tests drive a worker over loopback or fault-injecting transports.
  void serve_connection(std::unique_ptr<net::Connection> conn);
  const WorkerStats& stats() const;
  // The work ledger: one entry per backbone name that connected, in order of first connection.
  std::vector<LedgerEntry> ledger() const;
  const std::string& name() const;  // as announced in HELLO

 private:
  struct Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesh::swarm
