// The moesh wire protocol: frames, messages and row codecs for remote expert dispatch.
//
// The backbone sends each worker, per MoE layer, the hidden rows of the tokens routed to that
// worker's experts (DISPATCH) and gets back expert outputs (COMBINE); it may also fetch a copy of
// one expert's weights (FETCH -> SLAB) to compute a hot expert itself. docs/PROTOCOL.md is the
// normative byte-level spec; this header is its C++ face. Everything here is pure (no I/O):
// transports (moesh/transport.h) move whole frames, this module builds and checks them.
//
// Frame = 32-byte little-endian header + payload. The header carries magic, version, message
// type, a request id (many requests in flight on one connection) and an XXH3-64 checksum over
// header and payload. Every length and count read from the network is checked against the
// payload size and against `DecodeLimits` before anything is allocated; a hostile frame yields a
// non-ok Status (kCorrupt / kUnsupported / kOutOfRange), never a crash or an unbounded allocation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moesh/tensor/types.h"
#include "moesh/util/status.h"

namespace moesh::wire {

// ---- constants -------------------------------------------------------------------------------

constexpr uint32_t kMagic = 0x48534F4Du;               // bytes "MOSH" on the wire (little-endian u32)
constexpr uint16_t kVersion = 4;                       // the only protocol version this build speaks
                                                       // (v2 = v1 + Q8K + the HELLO activation table;
                                                       // v3 = v2 + HELLO features + FETCH/SLAB;
                                                       // v4 = v3 + the expert FFN definition in HELLO)
constexpr size_t kHeaderBytes = 32;                    // frozen across all versions
constexpr uint32_t kDefaultMaxFrameBytes = 64u << 20;  // payload limit unless configured
constexpr uint32_t kQ8BlockSize = 32;                  // elements per Q8 block
constexpr size_t kQ8BlockBytes = 34;                   // f16 scale + 32 int8 (== ggml block_q8_0)
constexpr uint32_t kQ8KBlockSize = 256;                // elements per Q8K block
constexpr size_t kQ8KBlockBytes = 260;                 // f32 scale + 256 int8 (ggml block_q8_K minus bsums)
constexpr uint32_t kMaxTextBytes = 1024;               // ERROR / GOODBYE text, worker name (<= 255)
constexpr uint32_t kMaxNameBytes = 255;
constexpr uint32_t kMaxPairsPerToken = 255;      // per-token pair count is a u8
constexpr uint32_t kMaxExpertRanges = 4096;      // HELLO expert-range list
constexpr uint32_t kMaxPingPadBytes = 1u << 20;  // warm-up padding per PING / PONG
constexpr uint64_t kMaxSlabDim = UINT32_MAX;     // SLAB ne0/ne1 bound (keeps size arithmetic exact)

// HELLO feature bits (Hello::features, since v3). A feature is used on a connection only when
// both HELLOs set its bit (Session::features).
constexpr uint32_t kFeatureFetch = 1u << 0;  // worker: answers FETCH with SLAB; backbone: may send FETCH
// This side holds a swarm key and requires the peer to prove it holds the same one (AUTH frames
// right after the HELLOs, net/auth.h). A side with a key refuses a peer without this bit.
constexpr uint32_t kFeatureAuth = 1u << 1;
// Worker: keeps replicas of experts a backbone sends it (STORE, answered with STORED); backbone:
// may send STORE.
constexpr uint32_t kFeatureStore = 1u << 2;
// Worker: answers INFO with its capacity (INFO_REPLY); backbone: asks after the warm-up.
constexpr uint32_t kFeatureInfo = 1u << 3;
// Span peer (`moesh span`): runs whole blocks for the backbone (SPAN_STEP, answered with SPAN_RESULT).
constexpr uint32_t kFeatureSpan = 1u << 4;
// Span peer that passes a chained step on to the next span's peer itself (SPAN_STEP's chain
// fields) and answers SPAN_AWAIT with the result of a step forwarded to it (docs/span.md).
constexpr uint32_t kFeatureSpanChain = 1u << 5;
// Worker: measures its round trip to other peers' addresses when asked (PROBE, answered with
// PROBE_REPLY); backbone: may send PROBE.
constexpr uint32_t kFeatureProbe = 1u << 6;
// Span peer that answers SPAN_HOLD with SPAN_HELD: lists the blocks it runs and loads others when a
// backbone asks, from its full model file or a slice fetched from its gateway, or says why it
// cannot (docs/span.md#loading-blocks).
constexpr uint32_t kFeatureSpanLoad = 1u << 7;
// Worker: lets go of a replica it was sent (UNSTORE, answered with UNSTORED): it stops serving the
// expert, unmaps it and deletes its file, so its replica budget is free for others; backbone: may
// send UNSTORE. Only replicas (STOREd experts) can be let go of, never the worker's own file's.
constexpr uint32_t kFeatureUnstore = 1u << 8;
constexpr uint32_t kAllFeatures = kFeatureFetch | kFeatureAuth | kFeatureStore | kFeatureInfo | kFeatureSpan |
                                  kFeatureSpanChain | kFeatureProbe | kFeatureSpanLoad | kFeatureUnstore;

// Message types, listed once with explicit numbers (never renumber; only append).
enum class MsgType : uint16_t {
  kHello = 1,        // first frame in each direction: version range, model identity, experts held
  kDispatch = 2,     // backbone -> worker: hidden rows + (expert, weight, rank) pairs of one layer
  kCombine = 3,      // worker -> backbone: expert outputs for one DISPATCH (same request id)
  kPing = 4,         // liveness / warm-up, carries a timestamp and optional padding
  kPong = 5,         // answer to PING (same request id), echoes its timestamp
  kGoodbye = 6,      // orderly close: no more requests will be sent
  kError = 7,        // failure of one request (request id != 0) or of the connection (id 0)
  kFetch = 8,        // backbone -> worker: send me the weights of (layer, expert)   [v3, kFeatureFetch]
  kSlab = 9,         // worker -> backbone: one expert's gate/up/down slabs (same request id as the FETCH)
  kAuth = 10,        // swarm-key challenge / proof, right after the HELLOs           [kFeatureAuth]
  kRoute = 11,       // before HELLO on dial-out and relayed connections: join, relay connect, splice
  kStore = 12,       // backbone -> worker: keep a replica of this expert (a SLAB's payload) [kFeatureStore]
  kStored = 13,      // worker -> backbone: the STORE's expert is held and served now (same request id)
  kInfo = 14,        // backbone -> worker: what capacity do you have? (empty payload)   [kFeatureInfo]
  kInfoReply = 15,   // worker -> backbone: its capacity (same request id)
  kSpanStep = 16,    // backbone -> span peer: rows entering blocks first..last of one step [kFeatureSpan]
  kSpanResult = 17,  // span peer -> backbone: the rows leaving them, or which inputs it lacks
  kSpanAwait = 18,   // backbone -> span peer: answer with the result of the chained step forwarded to you
  kProbe = 19,       // backbone -> worker: measure your round trip to these addresses    [kFeatureProbe]
  kProbeReply = 20,  // worker -> backbone: one round trip per address (same request id)
  kSpanHold = 21,    // backbone -> span peer: load (or let go of) blocks first..last   [kFeatureSpanLoad]
  kSpanHeld = 22,    // span peer -> backbone: the blocks it runs and loads (same request id)
  kUnstore = 23,     // backbone -> worker: let go of your replica of (layer, expert)   [kFeatureUnstore]
  kUnstored = 24,    // worker -> backbone: it is no longer served; the replica bytes left (same request id)
  kCOUNT
};
const char* msg_type_name(MsgType t);
bool msg_type_is_known(uint16_t raw);

// Encodings of float rows on the wire (docs/PROTOCOL.md "Row encodings").
enum class WireDType : uint8_t {
  kF32 = 0,   // IEEE binary32, little-endian; bit-exact
  kF16 = 1,   // IEEE binary16, round-to-nearest-even from f32 (fp16.h)
  kBF16 = 2,  // bfloat16, round-to-nearest-even from f32 (fp16.h)
  kQ8 = 3,    // blocks of 32: f16 scale d + 32 int8 q; x = d*q. Identical to ggml Q8_0 and to
              // moesh's canonical Q8_0 activation quantizer, so a worker can feed the blocks
              // straight into Q8_0 dot products and match the backbone's local result bit for bit.
  kQ8K = 4,   // blocks of 256: f32 scale d + 256 int8 q; x = d*q. moesh's canonical Q8_K activation
              // quantizer without the bsums (the receiver recomputes them: sums of q), so a worker
              // whose weights are k-quants feeds the blocks straight into its Q8_K dot products.
  kCOUNT
};
const char* wire_dtype_name(WireDType t);

// How a worker returns results (docs/PROTOCOL.md "Combine modes").
enum class CombineMode : uint8_t {
  kExact = 0,    // one row per (token, expert) pair, the expert's raw output y_i, unweighted, in
                 // the order of the request's pairs; the backbone forms sum_i w_i*y_i in rank
                 // order. Bit-exact with local execution when the return dtype is F32.
  kPartial = 1,  // one row per token: sum over this worker's pairs of w_i*y_i, accumulated in
                 // ascending rank order in f32, then encoded in the return dtype. Lossy.
  kCOUNT
};
const char* combine_mode_name(CombineMode m);

// Error codes carried by ERROR frames. Stable numbers; a receiver must accept unknown codes.
enum class WireError : uint16_t {
  kMalformed = 1,         // a frame failed validation
  kVersionMismatch = 2,   // no common protocol version
  kModelMismatch = 3,     // model identity hashes differ
  kUnsupported = 4,       // valid request using a dtype/mode/feature the peer lacks
  kNotHeld = 5,           // layer/expert not held by this worker
  kDeadlineExceeded = 6,  // the request's deadline passed before it was computed
  kOverloaded = 7,        // try another replica
  kShuttingDown = 8,      // worker is draining
  kNonFinite = 9,         // the computation produced inf/NaN
  kInternal = 10,         // a bug on the sending side
  kProtocol = 11,         // a valid frame at the wrong time (e.g. DISPATCH before HELLO)
  kUnauthenticated = 12,  // no swarm key, or a proof that does not match ours
  kCOUNT
};
const char* wire_error_name(uint16_t code);
// The local StatusCode a received ERROR maps to (unknown codes -> kUnavailable).
StatusCode wire_error_to_status_code(uint16_t code);
// The ERROR code to send back for a local failure status.
WireError status_code_to_wire_error(StatusCode code);

// ---- frames ----------------------------------------------------------------------------------

// Decoded header. Layout (all little-endian):
//   0 u32 magic | 4 u16 version | 6 u16 type | 8 u64 request_id | 16 u32 payload_bytes |
//   20 u32 flags (must be 0 in v1) | 24 u64 checksum = XXH3_64bits(header[0..24) ++ payload)
struct FrameHeader {
  uint16_t version = kVersion;
  MsgType type = MsgType::kPing;
  uint64_t request_id = 0;
  uint32_t payload_bytes = 0;
  uint32_t flags = 0;
  uint64_t checksum = 0;
};

// A received frame whose header was validated and whose checksum matched.
struct Frame {
  FrameHeader header;
  std::vector<uint8_t> payload;
  MsgType type() const { return header.type; }
  uint64_t request_id() const { return header.request_id; }
};

// Parses and validates the 32 header bytes: magic, version >= 1 (a version other than kVersion
// is only allowed on HELLO), known type, flags == 0, payload_bytes <= max_payload_bytes.
// kCorrupt for damage, kUnsupported for a version we do not speak, kOutOfRange for length.
Result<FrameHeader> parse_header(std::span<const uint8_t> bytes, uint32_t max_payload_bytes);
// Checks the checksum of a parsed header against its payload (kCorrupt on mismatch).
Status verify_checksum(std::span<const uint8_t> header_bytes, std::span<const uint8_t> payload, uint64_t expected);
// Builds a complete frame (header + payload) with the checksum filled in.
std::vector<uint8_t> build_frame(MsgType type, uint64_t request_id, std::span<const uint8_t> payload,
                                 uint16_t version = kVersion);
// Parses a complete frame held in memory (header, exact length, checksum). Used by tests and by
// transports that receive whole messages.
Result<Frame> parse_frame(std::span<const uint8_t> bytes, uint32_t max_payload_bytes);

// ---- rows ------------------------------------------------------------------------------------

// n_rows rows of n_cols floats in one wire dtype, rows back to back.
struct WireRows {
  WireDType dtype = WireDType::kF32;
  uint32_t n_rows = 0;
  uint32_t n_cols = 0;
  std::vector<uint8_t> bytes;  // n_rows * wire_row_bytes(dtype, n_cols)
};

// Bytes of one row: F32 4n, F16/BF16 2n, Q8 34*ceil(n/32), Q8K 260*ceil(n/256) (a short last
// block is zero-padded).
size_t wire_row_bytes(WireDType t, uint32_t n_cols);

// Encodes rows. Fails with kInvalidArgument for a non-finite value in Q8/Q8K (not representable)
// and kOutOfRange when a finite value overflows F16 (it would arrive as inf); F32/BF16 carry
// inf/NaN as is (the decoder's policy decides).
Result<WireRows> encode_rows(WireDType t, const float* src, uint32_t n_rows, uint32_t n_cols);
// Decodes all rows into dst[n_rows*n_cols]; decode_row decodes one.
void decode_rows(const WireRows& rows, float* dst);
void decode_row(const WireRows& rows, uint32_t row, float* dst);
// kCorrupt naming the first non-finite value (row, column) if any, for every dtype.
Status check_rows_finite(const WireRows& rows);

// The Q8 codec for one row (also used by tests): canonical Q8_0 rule, see PROTOCOL.md.
void q8_encode_row(const float* src, uint32_t n, uint8_t* dst);
void q8_decode_row(const uint8_t* src, uint32_t n, float* dst);
// The Q8K codec for one row: the canonical Q8_K quantizer (quant.h) applied to the row padded with
// zeros to a multiple of 256, each block stored as f32 d + 256 int8 q (no bsums).
void q8k_encode_row(const float* src, uint32_t n, uint8_t* dst);
void q8k_decode_row(const uint8_t* src, uint32_t n, float* dst);
// The ggml block_q8_K blocks (quant::BlockQ8_K, 292 bytes each) of one Q8K wire row, bsums
// recomputed exactly as the quantizer computes them: what quantize_rows(Q8_K) gives for the
// row the sender encoded. dst holds ceil(n/256) blocks.
void q8k_row_to_blocks(const uint8_t* src, uint32_t n, void* dst);

// ---- messages --------------------------------------------------------------------------------

// Limits a receiver applies while decoding. Everything from the network is checked against
// these before use.
struct DecodeLimits {
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;  // payload limit
  uint32_t max_n_embd = 1u << 16;
  uint32_t n_expert = 0;          // expert ids must be < n_expert (0: only the u16 range)
  uint32_t n_layer = 0;           // layers must be < n_layer (0: unchecked)
  bool allow_non_finite = false;  // reject inf/NaN in rows and weights (see PROTOCOL.md)
};

enum class PeerRole : uint8_t { kBackbone = 1, kWorker = 2, kCOUNT };

// Hello::layer_act entry of a layer whose gate activations are not an INT8 block format the
// wire carries (or that the worker does not hold).
constexpr uint8_t kNoActDType = 0xFF;

// Experts [first, first + count) of one layer.
struct ExpertRange {
  uint32_t layer = 0;
  uint32_t first = 0;
  uint32_t count = 0;
  bool operator==(const ExpertRange&) const = default;
};

// First frame each side sends. The first 8 payload bytes (version range, role) are frozen
// forever; later versions only append fields.
struct Hello {
  uint16_t min_version = kVersion;
  uint16_t max_version = kVersion;
  PeerRole role = PeerRole::kBackbone;
  uint8_t model_id_bytes = 32;         // 16 or 32
  std::array<uint8_t, 32> model_id{};  // hash of GGUF metadata + tensor table
  uint32_t n_layer = 0;                // model shape, so ids can be range-checked
  uint32_t n_expert = 0;
  uint32_t n_embd = 0;
  uint32_t dtypes = 0;                               // bit (1 << WireDType) per dtype accepted/sent
  uint32_t modes = 0;                                // bit (1 << CombineMode) per mode supported
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;  // what this side accepts
  std::vector<ExpertRange> experts;                  // held (workers); empty for a backbone
  std::string name;                                  // human-readable, <= 255 bytes
  // Since v2. Per model layer (empty, or n_layer entries): the wire dtype whose blocks are exactly
  // what this worker's gate dot products of that layer consume — kQ8 (Q8_0 activations), kQ8K
  // (Q8_K activations) — or kNoActDType. Lets a backbone without expert weights pick the
  // hidden dtype that avoids re-quantization. Empty for a backbone.
  std::vector<uint8_t> layer_act;
  // Since v3. kFeature* bits: what this side offers (worker) or is willing to use (backbone).
  uint32_t features = 0;
  // Since v4. The routed expert FFN the sender's model defines (the model registry's ExpertFfn):
  // activation (kExpertAct*) and kExpertFlag* bits. Both ends must agree or the session is refused,
  // so a worker never computes another function than the backbone's model.
  uint8_t expert_act = 0;
  uint8_t expert_flags = 0;
};

constexpr uint8_t kExpertActSilu = 0;       // silu(g) * u
constexpr uint8_t kExpertActSwigluOai = 1;  // gpt-oss's clamped swiglu
// kimi-k3's situ; its two constants are the model file's (covered by the model identity).
constexpr uint8_t kExpertActSitu = 2;
constexpr uint8_t kExpertFlagBiases = 1u << 0;       // per-expert gate/up/down biases
constexpr uint8_t kExpertFlagInputScaled = 1u << 1;  // mixing weight on the input (llama4)
// Per-layer SwiGLU limits (step35: min(silu(g), L) * clamp(u, ±L) where the model file's
// swiglu_clamp_exp[layer] = L > 0); the values are the file's, covered by the model identity.
constexpr uint8_t kExpertFlagSwigluLimit = 1u << 2;
// "silu", "swiglu-oai+bias", "silu, weight on input", "silu, clamped per layer" (as ExpertFfn::describe()).
std::string expert_ffn_name(uint8_t act, uint8_t flags);

// Pure outcome of two HELLOs: the version both speak and the intersected capabilities.
struct Session {
  uint16_t version = kVersion;
  uint32_t dtypes = 0;
  uint32_t modes = 0;
  uint32_t max_send_bytes = 0;  // the peer's max_frame_bytes: never send a larger payload
  uint32_t features = 0;        // kFeature* bits both HELLOs set
  Hello peer;
};
// kUnsupported: no common version / no common dtype or mode; kInvalidArgument: model identity
// or shape differs. The message says which.
Result<Session> negotiate(const Hello& local, const Hello& peer);

struct ExpertPair {
  uint16_t expert = 0;  // expert id within the layer
  uint8_t rank = 0;     // position in the token's router top-k (0 = highest weight)
  float weight = 0.f;   // router weight w_i
  bool operator==(const ExpertPair&) const = default;
};

// DISPATCH: the tokens of one layer routed to this worker. Token t's pairs are
// pairs[begin_t .. begin_t + pair_counts[t]), with strictly increasing rank within a token.
struct DispatchMsg {
  uint64_t request_id = 0;  // != 0
  uint32_t layer = 0;
  uint32_t deadline_ms = 0;  // compute budget from receipt; 0 = none
  CombineMode mode = CombineMode::kExact;
  WireDType return_dtype = WireDType::kF32;
  std::vector<uint8_t> pair_counts;  // n_tokens entries, each 1..255
  std::vector<ExpertPair> pairs;
  WireRows hidden;  // n_tokens x n_embd

  uint32_t n_tokens() const { return hidden.n_rows; }
  uint32_t n_embd() const { return hidden.n_cols; }
  // Rows the COMBINE must carry: n_pairs (exact) or n_tokens (partial).
  uint32_t n_result_rows() const;
};

// COMBINE: results for the DISPATCH with the same request id.
struct CombineMsg {
  uint64_t request_id = 0;
  uint32_t layer = 0;
  uint32_t n_tokens = 0;
  CombineMode mode = CombineMode::kExact;
  uint32_t compute_us = 0;  // worker's compute time (scheduling statistics only)
  WireRows rows;            // exact: one row per pair; partial: one row per token
};

// FETCH: asks a worker for a copy of one expert's weights (e.g. a hot expert the backbone will
// compute itself). Answered with SLAB, or ERROR with the same request id.
struct FetchMsg {
  uint64_t request_id = 0;  // != 0
  uint32_t layer = 0;
  uint32_t expert = 0;
};

// One expert's slab of one stacked tensor: the 2-D [ne0, ne1] block of `type`, bytes exactly as
// in the model file.
struct SlabTensor {
  GgmlType type = GgmlType::F32;
  uint64_t ne0 = 0;            // row length (elements), a multiple of the type's block size
  uint64_t ne1 = 0;            // rows
  uint64_t hash = 0;           // XXH3-64 (seed 0) of bytes: swarm::slab_hash, what slice files store
  std::vector<uint8_t> bytes;  // type_row_bytes(type, ne0) * ne1
};

// SLAB: the answer to a FETCH. Decoding checks every tensor's bytes against its own hash; the
// receiver compares those hashes with ones it trusts (a backbone slice's) before using them.
struct SlabMsg {
  uint64_t request_id = 0;  // the FETCH's
  uint32_t layer = 0;
  uint32_t expert = 0;
  std::array<SlabTensor, 3> tensors;  // gate, up, down
};

// STORED: the answer to a STORE (whose payload is a SlabMsg's): the worker verified the slabs
// against the model's own hashes, wrote them to disk, mapped them and serves the expert from now
// on; it says how much of its replica budget is used.
struct StoredMsg {
  uint64_t request_id = 0;  // the STORE's
  uint32_t layer = 0;
  uint32_t expert = 0;
  uint64_t replica_bytes = 0;  // slab bytes of all replicas held now
  uint64_t budget_bytes = 0;   // the worker's replica budget (replica_bytes <= budget_bytes)
};

// UNSTORE: asks a worker to let go of its replica of one expert (a FETCH's payload: layer, expert).
// Answered with UNSTORED (a STORED's payload: the replica bytes held after), or ERROR: NOT_HELD when
// it does not hold the expert, UNSUPPORTED when the expert is its own file's, not a replica.
using UnstoreMsg = FetchMsg;

// INFO_REPLY: a worker's capacity, for the backbone's registry (`moesh swarm status`).
struct InfoMsg {
  uint64_t request_id = 0;            // the INFO's
  uint32_t threads = 0;               // compute threads of its pool (>= 1)
  uint32_t cores = 0;                 // hardware threads of its machine
  uint64_t slab_bytes = 0;            // expert slabs it holds (replicas included)
  uint64_t replica_bytes = 0;         // of which replicas
  uint64_t replica_budget_bytes = 0;  // replica_bytes <= this (0: keeps none)
  uint64_t rss_bytes = 0;             // its resident memory
  uint64_t uptime_ms = 0;
  // Its machine (or container) memory, and what it offers the swarm for model weights and state
  // (`moesh worker --offer-mb`; 0: not said). All 0 from a worker that predates them (a 48-byte
  // INFO_REPLY).
  uint64_t mem_total_bytes = 0;
  uint64_t mem_available_bytes = 0;
  uint64_t offer_bytes = 0;
};

// SPAN_STEP: one step of blocks [first, last] for the tokens of several sequences (model/span.h).
// Rows are grouped by sequence, in `seqs` order: a sequence's n_replay rows (inputs of earlier
// cells the peer lacks, from the backbone's log) then its n_new rows (the step's own tokens).
// The peer must hold `start` cells of the sequence whose inputs hash to `chain`; it answers with
// the rows leaving block `last` for the new rows only, or (changing nothing) with the cells it
// holds that match, per sequence, so the backbone resends with those replayed.
constexpr uint32_t kMaxSpanSeqs = 4096;
struct SpanSeq {
  int32_t seq = 0;                  // the backbone's sequence id
  uint32_t n_replay = 0;            // leading rows the peer lacks (no result rows for them)
  uint32_t n_new = 0;               // >= 1: the step's own tokens
  uint64_t start = 0;               // cells held before the rows
  std::array<uint8_t, 16> chain{};  // hash chain of the inputs of cells [0, start) (all zero: start 0)
  bool operator==(const SpanSeq&) const = default;
};
// Chained spans [kFeatureSpanChain]: a step may name the spans after it (`next`, adjacent, in
// order). The peer that computes it passes the rows leaving its last block on to the first hop's
// peer itself (as a SPAN_STEP with `origin` set and the rest of `next`), instead of the backbone
// sending them there, and still returns them to whoever sent the step (the backbone logs every
// span's inputs: replay and failover stay as they are). A forwarded step never replays, and its
// result goes to the backbone that asked for it with SPAN_AWAIT, not back to the forwarder.
constexpr uint32_t kMaxSpanHops = 64;
struct SpanHop {
  std::string address;  // HOST:PORT of the span peer that runs it (1..255 bytes)
  uint32_t first = 0, last = 0;
  // Per sequence of the step, in its order: the cells that peer holds and their hash chain.
  std::vector<uint64_t> start;
  std::vector<std::array<uint8_t, 16>> chain;
  bool operator==(const SpanHop&) const = default;
};
struct SpanStepMsg {
  uint64_t request_id = 0;  // != 0
  uint32_t first = 0, last = 0;
  WireDType return_dtype = WireDType::kF32;
  std::vector<SpanSeq> seqs;
  std::vector<int64_t> pos;  // per row: its position (increasing within a sequence)
  std::vector<uint8_t> cut;  // per row, 0/1: a cut after it is likely (recurrent checkpoints)
  WireRows hidden;           // rows x n_embd, grouped as above
  // Chained (chain_id != 0): the hops after this span. The backbone sends the head step with an
  // empty origin; a forwarded step names the backbone whose sequences these are.
  uint64_t chain_id = 0;
  std::string origin;                     // <= kMaxNameBytes
  WireDType hop_dtype = WireDType::kF32;  // rows between hops: f32, f16 or bf16
  std::vector<SpanHop> next;              // <= kMaxSpanHops
  uint32_t n_rows() const { return hidden.n_rows; }
};
// SPAN_AWAIT: the backbone asks a span peer for the result of the chained step `chain_id` of blocks
// first..last that another peer forwards to it; answered (same request id) with that SPAN_RESULT,
// or ERROR kTimeout after timeout_ms. It never blocks the peer's other work.
constexpr uint32_t kMaxSpanAwaitMs = 600000;
struct SpanAwaitMsg {
  uint64_t request_id = 0;  // != 0
  uint64_t chain_id = 0;    // != 0
  uint32_t first = 0, last = 0;
  uint32_t timeout_ms = 0;  // 1..kMaxSpanAwaitMs
  bool operator==(const SpanAwaitMsg&) const = default;
};
// PROBE: the backbone asks a worker for its round trip to other peers ("HOST:PORT", IPv6 as
// "[ADDR]:PORT"), so the planner knows peer-to-peer RTTs (chained spans); the worker answers
// PROBE_REPLY with one figure per address, in order, within timeout_ms.
constexpr uint32_t kMaxProbeTargets = 256;
constexpr uint32_t kMaxProbeAddressBytes = 255;
constexpr uint32_t kMaxProbeMs = 60000;
constexpr uint32_t kProbeFailed = UINT32_MAX;  // PROBE_REPLY: no answer from that address in time
struct ProbeMsg {
  uint64_t request_id = 0;  // != 0
  uint32_t timeout_ms = 0;  // 1..kMaxProbeMs
  std::vector<std::string> targets;
  bool operator==(const ProbeMsg&) const = default;
};
struct ProbeReplyMsg {
  uint64_t request_id = 0;
  std::vector<uint32_t> rtt_us;  // per target: the smallest TCP connect time seen, or kProbeFailed
  bool operator==(const ProbeReplyMsg&) const = default;
};

// SPAN_HOLD: a backbone asks a span peer which blocks it runs (kList), to load blocks first..last
// (kLoad: in the background; the answer says "loading" until they are ready, and the backbone asks
// again), or to let go of them (kDrop: refused with ERROR while another backbone's sequences are
// held there). Answered with SPAN_HELD, or ERROR (a peer that cannot load those blocks, say why).
enum class SpanHoldOp : uint8_t { kList = 0, kLoad = 1, kDrop = 2 };
struct SpanHoldMsg {
  uint64_t request_id = 0;  // != 0
  SpanHoldOp op = SpanHoldOp::kList;
  uint32_t first = 0, last = 0;  // kList: both 0; otherwise first <= last
  bool operator==(const SpanHoldMsg&) const = default;
};
enum class SpanHeldState : uint8_t { kReady = 0, kLoading = 1, kFailed = 2 };
constexpr uint32_t kMaxSpanHolds = 1024;
struct SpanHolding {
  uint32_t first = 0, last = 0;  // first <= last
  SpanHeldState state = SpanHeldState::kReady;
  std::string error;  // kFailed: why (<= kMaxTextBytes); otherwise empty
  bool operator==(const SpanHolding&) const = default;
};
// SPAN_HELD: every span the peer runs, loads or failed to load (its last try), in block order
// (by first block, then last; spans may overlap: 0-2 held while 0-5 loads).
struct SpanHeldMsg {
  uint64_t request_id = 0;         // the SPAN_HOLD's
  std::vector<SpanHolding> spans;  // <= kMaxSpanHolds
  bool operator==(const SpanHeldMsg&) const = default;
};

struct SpanHave {
  int32_t seq = 0;
  uint64_t have = 0;  // cells of the sequence the peer holds that match the backbone's (< start)
  bool operator==(const SpanHave&) const = default;
};
struct SpanResultMsg {
  uint64_t request_id = 0;  // the SPAN_STEP's
  uint32_t compute_us = 0;
  std::vector<SpanHave> need;  // non-empty: nothing was computed or changed; rows is empty
  WireRows rows;               // otherwise: one row per new row of the step, in its order
  // Chained steps: why this peer could not pass its rows on to the next hop (empty: it did, or
  // the step had none). <= kMaxTextBytes.
  std::string forward_error;
};

// Swarm-key authentication (net/auth.h): a fresh random challenge and/or an HMAC-SHA256 proof.
struct AuthMsg {
  static constexpr uint8_t kHasChallenge = 1u << 0, kHasProof = 1u << 1;
  uint8_t flags = 0;
  std::array<uint8_t, 32> challenge{};
  std::array<uint8_t, 32> proof{};
};

// Connection routing, before the HELLOs (docs/PROTOCOL.md §3a). A worker that dials out sends
// JOIN with its name first; a backbone's registry answers JOINED_BACKBONE (its HELLO follows), a
// relay JOINED_RELAY (the worker then waits, PINGing, for SPLICED: a backbone's HELLO follows). A
// backbone reaching a worker through a relay sends CONNECT with the worker's name; the relay
// then splices the two streams (an unknown name gets ERROR NOT_FOUND-like kNotHeld and a close).
struct RouteMsg {
  enum Op : uint8_t { kJoin = 1, kJoinedBackbone = 2, kJoinedRelay = 3, kConnect = 4, kSpliced = 5, kOpCount };
  uint8_t op = kJoin;
  std::string name;  // kJoin, kConnect: the worker's name (1..64 bytes)
};
const char* route_op_name(uint8_t op);

struct PingMsg {
  uint64_t request_id = 0;
  uint64_t send_time_ns = 0;     // sender's steady clock
  uint32_t pad_bytes = 0;        // zero bytes appended (warm-up: opens the congestion window)
  uint32_t reply_pad_bytes = 0;  // padding the PONG must carry back
};

struct PongMsg {
  uint64_t request_id = 0;     // the PING's
  uint64_t ping_time_ns = 0;   // echoed PING send_time_ns
  uint64_t reply_time_ns = 0;  // responder's clock
  uint32_t pad_bytes = 0;
};

struct GoodbyeMsg {
  uint16_t reason = 0;  // a WireError code, or 0 for a normal close
  std::string text;
};

struct ErrorMsg {
  uint64_t request_id = 0;  // 0: the connection as a whole
  uint16_t code = static_cast<uint16_t>(WireError::kInternal);
  std::string text;
  Status to_status() const;  // maps the code, keeps the text
};

// Encoders validate the message (kInvalidArgument naming the field) and return the full frame.
Result<std::vector<uint8_t>> encode_hello(const Hello& m);
Result<std::vector<uint8_t>> encode_dispatch(const DispatchMsg& m);
Result<std::vector<uint8_t>> encode_combine(const CombineMsg& m);
Result<std::vector<uint8_t>> encode_fetch(const FetchMsg& m);
// encode_slab checks types, shapes and byte counts but trusts the hashes (a sender may cache them);
// decode_slab recomputes each one and rejects a mismatch.
Result<std::vector<uint8_t>> encode_slab(const SlabMsg& m);
Result<std::vector<uint8_t>> encode_ping(const PingMsg& m);
Result<std::vector<uint8_t>> encode_pong(const PongMsg& m);
Result<std::vector<uint8_t>> encode_goodbye(const GoodbyeMsg& m);
Result<std::vector<uint8_t>> encode_error(const ErrorMsg& m);
Result<std::vector<uint8_t>> encode_auth(const AuthMsg& m);
Result<std::vector<uint8_t>> encode_route(const RouteMsg& m);
// STORE: a SLAB's payload under another type (the hashes are checked by decode_store as by
// decode_slab).
Result<std::vector<uint8_t>> encode_store(const SlabMsg& m);
Result<std::vector<uint8_t>> encode_stored(const StoredMsg& m);
Result<std::vector<uint8_t>> encode_unstore(const UnstoreMsg& m);
Result<std::vector<uint8_t>> encode_unstored(const StoredMsg& m);
Result<std::vector<uint8_t>> encode_info_request(uint64_t request_id);
Result<std::vector<uint8_t>> encode_info(const InfoMsg& m);
Result<std::vector<uint8_t>> encode_span_step(const SpanStepMsg& m);
Result<std::vector<uint8_t>> encode_span_result(const SpanResultMsg& m);
Result<std::vector<uint8_t>> encode_span_await(const SpanAwaitMsg& m);
Result<std::vector<uint8_t>> encode_probe(const ProbeMsg& m);
Result<std::vector<uint8_t>> encode_probe_reply(const ProbeReplyMsg& m);
Result<std::vector<uint8_t>> encode_span_hold(const SpanHoldMsg& m);
Result<std::vector<uint8_t>> encode_span_held(const SpanHeldMsg& m);

// Decoders check the frame type, every count against the payload size and the limits, and
// every enum; they never allocate more than the payload size implies.
Result<Hello> decode_hello(const Frame& f);
Result<DispatchMsg> decode_dispatch(const Frame& f, const DecodeLimits& lim);
Result<CombineMsg> decode_combine(const Frame& f, const DecodeLimits& lim);
Result<FetchMsg> decode_fetch(const Frame& f, const DecodeLimits& lim);
Result<SlabMsg> decode_slab(const Frame& f, const DecodeLimits& lim);
Result<PingMsg> decode_ping(const Frame& f);
Result<PongMsg> decode_pong(const Frame& f);
Result<GoodbyeMsg> decode_goodbye(const Frame& f);
Result<ErrorMsg> decode_error(const Frame& f);
Result<AuthMsg> decode_auth(const Frame& f);
Result<RouteMsg> decode_route(const Frame& f);
Result<SlabMsg> decode_store(const Frame& f, const DecodeLimits& lim);
Result<StoredMsg> decode_stored(const Frame& f, const DecodeLimits& lim);
Result<UnstoreMsg> decode_unstore(const Frame& f, const DecodeLimits& lim);
Result<StoredMsg> decode_unstored(const Frame& f, const DecodeLimits& lim);
Result<SpanStepMsg> decode_span_step(const Frame& f, const DecodeLimits& lim);
Result<SpanResultMsg> decode_span_result(const Frame& f, const DecodeLimits& lim);
Result<SpanAwaitMsg> decode_span_await(const Frame& f, const DecodeLimits& lim);
Result<ProbeMsg> decode_probe(const Frame& f);
Result<ProbeReplyMsg> decode_probe_reply(const Frame& f);
Result<SpanHoldMsg> decode_span_hold(const Frame& f);
Result<SpanHeldMsg> decode_span_held(const Frame& f);
// INFO: the request id (!= 0); the payload must be empty.
Result<uint64_t> decode_info_request(const Frame& f);
Result<InfoMsg> decode_info(const Frame& f);

// The backbone's check that a COMBINE answers its DISPATCH (id, layer, mode, dtype, shape).
Status check_combine_matches(const DispatchMsg& req, const CombineMsg& reply);
// The backbone's check that a SLAB answers its FETCH (id, layer, expert).
Status check_slab_matches(const FetchMsg& req, const SlabMsg& reply);
// The backbone's check that a STORED answers its STORE (id, layer, expert).
Status check_stored_matches(const SlabMsg& req, const StoredMsg& reply);
// The backbone's check that an UNSTORED answers its UNSTORE (id, layer, expert).
Status check_unstored_matches(const UnstoreMsg& req, const StoredMsg& reply);

// Payload sizes (bytes after the 32-byte header) — the formulas PROTOCOL.md tabulates.
size_t dispatch_payload_bytes(uint32_t n_tokens, uint32_t n_pairs, uint32_t n_embd, WireDType t);
size_t combine_payload_bytes(uint32_t n_rows, uint32_t n_embd, WireDType t);
// SLAB: 8 + 3 * 36 + the three tensors' byte counts (gate, up, down).
size_t slab_payload_bytes(uint64_t gate_bytes, uint64_t up_bytes, uint64_t down_bytes);

}  // namespace moesh::wire
