// The backbone side of remote expert dispatch: worker addresses, connections to workers,
// placement of (layer, expert) pairs on owners, and RemoteExecutor — the ExpertExecutor that
// sends routed-expert work to `moesh worker` processes (docs/PROTOCOL.md, design.md).
//
// Start-up (RemoteExecutor::connect): dial every worker (TCP policy from netstack.md: NODELAY,
// congestion control set before connect, large buffers), HELLO handshake (protocol version and
// model identity must match ours; a mismatch names the worker), one padded PING to open the
// congestion window, then build the placement map from the expert ranges each worker announced:
// each (layer, expert) goes to the first worker that holds it, else to the backbone if it has
// the weights; an expert held by nobody fails start-up with a message listing them.
//
// Per MoE layer: submit() splits the routing plan by owner and sends one DISPATCH to every
// involved worker at once (star fan-out: one round trip per layer whatever the number of
// workers) and returns; wait() computes the backbone's own share, gathers every COMBINE with a
// per-request deadline and combines:
//   EXACT   — each expert's raw output y comes back; out = w0*y0; out = out + w_r*y_r in router
//             rank order, the same float operations as LocalExecutor, so with the F32 wire the
//             result is bit-identical to local execution for any placement;
//   PARTIAL — each worker returns one Σ w·y per token; the backbone adds the partials in a fixed
//             order (its own first, then workers in connection order). Lossy; `moesh gate`.
// A worker error, timeout or disconnect fails the layer with a Status naming the worker, the
// layer and the request id; nothing waits past its deadline.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moesh/executor.h"
#include "moesh/model.h"
#include "moesh/status.h"
#include "moesh/transport.h"
#include "moesh/wire.h"

namespace moesh {

// ---- worker addresses ------------------------------------------------------------------------

struct WorkerAddress {
  std::string host;  // numeric IPv4/IPv6 or a name (IPv6 written "[::1]:port")
  uint16_t port = 0;
  std::string to_string() const;
};

// "host:port" or "[v6addr]:port"; port 1..65535.
Result<WorkerAddress> parse_worker_address(std::string_view s);
// One HOST:PORT per line; blank lines and '#' comments (whole-line or trailing) are ignored.
// Errors name the file and line.
Result<std::vector<WorkerAddress>> read_workers_file(const std::string& path);

// ---- placement -------------------------------------------------------------------------------

// Who computes each (layer, expert): a worker index, the backbone itself, or nobody (dense layer).
class Placement {
 public:
  static constexpr int kLocal = -1;
  static constexpr int kNone = -2;  // dense layer (no routed experts)

  Placement() = default;
  Placement(int n_layer, int n_expert) : n_layer_(n_layer), n_expert_(n_expert),
      owner_(static_cast<size_t>(n_layer) * static_cast<size_t>(n_expert), kNone),
      holders_(owner_.size(), 0) {}

  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  int owner(int layer, int expert) const {
    return owner_[static_cast<size_t>(layer) * n_expert_ + expert];
  }
  void set_owner(int layer, int expert, int owner) {
    owner_[static_cast<size_t>(layer) * n_expert_ + expert] = static_cast<int16_t>(owner);
  }
  // Bit w set: worker w (w < 64) holds the expert. When several workers hold it (replicas), the
  // executor spreads each token's pairs over them; owner() is the first of them.
  uint64_t holders(int layer, int expert) const {
    return holders_[static_cast<size_t>(layer) * n_expert_ + expert];
  }
  void add_holder(int layer, int expert, int worker) {
    if (worker >= 0 && worker < 64) holders_[static_cast<size_t>(layer) * n_expert_ + expert] |= uint64_t{1} << worker;
  }
  // (layer, expert) pairs owned by `owner` (a worker index or kLocal).
  int64_t count(int owner) const;
  // (layer, expert) pairs worker w holds as a replica of another worker's (it is not owner()).
  int64_t count_replicas(int worker) const;
  // "layer 0: experts 0-7, 9; layer 3: experts 0-63" — the pairs owned by `owner`.
  std::string describe(int owner) const;

 private:
  int n_layer_ = 0, n_expert_ = 0;
  std::vector<int16_t> owner_;
  std::vector<uint64_t> holders_;
};

// What the placement is built from.
struct PlacementInput {
  int n_layer = 0;
  int n_expert = 0;
  std::vector<bool> moe_layer;    // [n_layer]: layer has routed experts
  std::vector<bool> local_layer;  // [n_layer]: the backbone holds this layer's expert weights
  std::vector<std::vector<wire::ExpertRange>> worker_experts;  // per worker, from its HELLO
  std::vector<std::string> worker_names;                       // for messages
};

// First worker holding an expert owns it (other holders are replicas, see Placement::holders);
// otherwise the backbone if it has the layer's weights.
// kNotFound listing the uncovered experts (layer by layer) if any MoE expert has no owner;
// kInvalidArgument if a worker announces a range outside the model.
Result<Placement> build_placement(const PlacementInput& in);

// "a-b,c" for a sorted list of ids (used in messages).
std::string format_id_ranges(const std::vector<int>& ids);

// ---- connections to workers --------------------------------------------------------------------

struct RemoteOptions {
  // Dtype of the hidden rows sent (DISPATCH). kQ8 means "the INT8 block format the worker's
  // gate dot products consume": per (worker, layer), Q8K where the worker's HELLO says that
  // layer takes Q8_K activations (k-quant weights) and it speaks Q8K, Q8 otherwise — exact for
  // Q8_0- and Q8_K-activation weights. kQ8K sends Q8K everywhere.
  wire::WireDType hidden_wire = wire::WireDType::kF32;
  // Dtype of the expert results returned (COMBINE). kQ8 stays 32-value blocks (smaller error).
  wire::WireDType return_wire = wire::WireDType::kF32;
  wire::CombineMode combine = wire::CombineMode::kExact;
  std::chrono::milliseconds timeout{10000};          // per request (dispatch -> combine)
  std::chrono::milliseconds connect_timeout{5000};   // connect + handshake + warm-up, per worker
  net::TcpOptions tcp;                               // congestion control, buffers, NODELAY
  uint32_t warmup_pad_bytes = 100 * 1024;            // warm-up PING padding each way
  std::string name = "backbone";                     // announced in HELLO
};

// One connected, handshaken worker.
struct WorkerLink {
  WorkerAddress address;
  std::string label;                      // "host:port (name)", used in every message
  std::unique_ptr<net::Connection> conn;
  std::unique_ptr<net::RequestMux> mux;
  wire::Session session;                  // negotiated; session.peer is the worker's HELLO
  wire::DecodeLimits limits;              // for decoding its COMBINEs
  std::chrono::nanoseconds warmup_rtt{0};
  ~WorkerLink();                          // sends GOODBYE (best effort) and closes
};

// Connects to one worker and runs handshake + warm-up. Errors name the address.
Result<std::unique_ptr<WorkerLink>> connect_worker(const WorkerAddress& addr, const wire::Hello& local,
                                                   const RemoteOptions& opts);

// The HELLO a backbone sends for `model` (identity hash, shape, the dtypes and modes it speaks).
Result<wire::Hello> backbone_hello(const Model& model, const RemoteOptions& opts);

// ---- the executor --------------------------------------------------------------------------------

// Wire traffic as counted from the frames actually sent and received (header included).
struct RemoteTraffic {
  uint64_t dispatch_frames = 0, dispatch_bytes = 0;
  uint64_t combine_frames = 0, combine_bytes = 0;
  uint64_t layer_calls = 0;        // submit() calls that involved at least one worker
  uint64_t token_layers = 0;       // Σ over those calls of n_tokens
  uint64_t remote_pairs = 0;       // (token, expert) pairs sent to workers
  uint64_t local_pairs = 0;        // pairs computed by the backbone
};

// Per-worker counters for monitoring (`moesh serve` /metrics). Unlike RemoteTraffic they may be
// read from any thread while the executor runs.
struct WorkerTraffic {
  // Upper bounds (seconds) of the DISPATCH -> COMBINE latency histogram buckets.
  static constexpr std::array<double, 12> kLatencyBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                            0.05,   0.1,   0.25,   0.5,   1.0,  5.0};
  std::string label;               // "host:port (name)"
  uint64_t requests = 0;           // DISPATCH frames sent
  uint64_t errors = 0;             // requests that failed (send error, timeout, bad COMBINE)
  uint64_t bytes_sent = 0, bytes_received = 0;
  // latency_counts[i]: requests with latency <= kLatencyBounds[i] and above the previous bound;
  // the last entry counts those above every bound (not cumulative).
  std::array<uint64_t, kLatencyBounds.size() + 1> latency_counts{};
  double latency_sum_seconds = 0;
  // Σ of the compute time each worker reports in its COMBINEs: latency - compute is what the
  // network, framing and wake-ups cost.
  double compute_sum_seconds = 0;
};

class RemoteExecutor final : public ExpertExecutor {
 public:
  // Connects to every worker (in order; worker i is index i in the placement) and builds the
  // placement over `model`'s layers. `model` must outlive the executor. The backbone's own
  // expert weights (model.expert_weights()) serve experts no worker holds.
  static Result<std::unique_ptr<RemoteExecutor>> connect(const Model& model,
                                                         const std::vector<WorkerAddress>& workers,
                                                         const RemoteOptions& opts);
  ~RemoteExecutor() override;

  // The pool for the backbone's share of expert work (normally the Context's). Null: serial.
  void set_pool(ThreadPool* pool) override;

  Ticket submit(int layer, const float* x, int64_t n_tokens, const RoutingPlan& plan) override;
  Result<std::span<const float>> wait(Ticket t) override;

  const Placement& placement() const;
  size_t n_workers() const;
  const WorkerLink& worker(size_t i) const;
  const RemoteOptions& options() const;
  // The hidden dtype a DISPATCH of `layer` to worker `w` uses (RemoteOptions::hidden_wire).
  wire::WireDType hidden_dtype(size_t w, int layer) const;
  // True when the hidden rows every worker gets are exactly what its dot products would compute
  // from the f32 rows locally: F32, or an INT8 dtype equal to each worker-owned MoE layer's
  // activation format. With an F32 return and EXACT combine the logits are then bit-identical.
  bool hidden_is_exact() const;
  // Multi-line summary: each worker's label, warm-up RTT and experts; the local share.
  std::string describe() const;

  RemoteTraffic traffic() const;
  void reset_traffic();
  // One entry per worker, in connection order; thread-safe.
  std::vector<WorkerTraffic> worker_traffic() const;

  struct Impl;

 private:
  explicit RemoteExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesh
