// The validation gate of a remote dispatch path (`moesh gate`, docs/gate.md), as a library so
// tests can run it in-process against real or fake workers.
//
// Two steps:
//  1. curate_sequences: seeded token sequences whose every position is WELL-CONDITIONED — no
//     expert choice and no top-1 token that a tiny perturbation could flip. Uniform random tokens
//     on small random-weight models hit near-ties (expert scores 0.001 apart, two logits 0.0002
//     apart) where even an f16 wire legitimately flips a decision; such a flip says nothing about
//     the path. The llama.cpp reference sequences were chosen the same way (reference README §4):
//     position by position, a drawn token that makes a near-tie is rejected and the next draw tried.
//  2. run_gate / compare_sequence: each sequence through the full model all-local and through the
//     remote executor; argmax agreement, cosine of the logits, expert-set agreement, bit identity.
//     The exact f32 path must be bit-identical; lossy paths must meet the thresholds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moesh/model/model.h"
#include "moesh/remote/remote.h"
#include "moesh/util/status.h"

namespace moesh::gate {

// ---- curation --------------------------------------------------------------------------------

// The reference README's near-tie thresholds in selection-score units (routing_margins in
// routing.h): 0.05 router-logit units for softmax gating (and llama4's top-k of raw logits),
// 0.0125 for sigmoid(+bias) scores.
double default_min_routing_margin(const HParams& hp);

struct CurationOptions {
  int n_sequences = 4;               // lengths 16, 32, 48, 64, repeating, clamped to the context
  uint64_t seed = 42;                // std::mt19937_64
  bool raw = false;                  // uniform draws, no rejection (the gate before curation)
  double min_routing_margin = -1.0;  // < 0: default_min_routing_margin(model)
  double min_top1_lead = 0.1;        // top-1 minus runner-up logit, in units of the row's RMS
  int max_tries = 200;               // draws per position before keeping the best-conditioned one
  int n_threads = 0;                 // of the curation context; <= 0: all cores
};

// How conditioned one position is: its minimum routing margin over the MoE layers (+inf for a
// model without MoE layers) and its top-1 lead over the runner-up divided by the logits' RMS.
struct Conditioning {
  double routing_margin = 0;
  double top1_lead_rel = 0;
};

struct CuratedSequences {
  std::vector<std::vector<int32_t>> tokens;
  double min_routing_margin = 0;  // the thresholds used
  double min_top1_lead = 0;
  int64_t positions = 0;
  int64_t draws_rejected = 0;   // draws that made an ill-conditioned position
  int64_t ill_conditioned = 0;  // positions where max_tries draws all failed (best one kept)
  std::vector<int64_t> rejected_per_sequence;
  // Over every kept position (curated or raw): the worst margin and lead seen.
  Conditioning worst{};
};

// The lengths of n sequences: 16, 32, 48, 64, 16, ... each clamped to [1, max(n_ctx, 2)].
std::vector<int64_t> sequence_lengths(int n, int64_t n_ctx);

// Draws the sequences (token by token through a local context; see the header comment).
// Deterministic for a given model, seed and options. Raw mode draws like the pre-curation gate:
// one generator over all sequences, uniform over [0, n_vocab).
Result<CuratedSequences> curate_sequences(const Model& model, const CurationOptions& opts);

// Conditioning of every position of `tokens` decoded from an empty cache by a local context
// (tests, and to report the conditioning of --sequences-from sequences).
Result<std::vector<Conditioning>> measure_conditioning(const Model& model, const std::vector<int32_t>& tokens,
                                                       int n_threads = 0);

// Sequences from a JSON file in the reference format {"sequences":[{"tokens":[...]}, ...]};
// every id must be in [0, n_vocab) and every sequence non-empty.
Result<std::vector<std::vector<int32_t>>> load_sequences_json(const std::string& path, int64_t n_vocab);

// ---- comparison ------------------------------------------------------------------------------

// True for a bit-exact path (the determinism contract): EXACT combine, f32 results returned, and
// hidden rows that are exactly what each worker's dot products would compute from the f32 rows
// (f32, or the INT8 activation format of its layers: RemoteExecutor::hidden_is_exact). The one
// place that decides whether the gate demands bit identity.
bool is_bit_exact_path(const RemoteExecutor& remote);

struct CompareOptions {
  double min_argmax = 0.99;   // lossy paths: argmax agreement per sequence (fraction)
  double min_cosine = 0.998;  // lossy paths: minimum cosine of any logits row
  bool bitwise = false;       // judge by bit identity instead (exact f32 path)
  // Per sequence (by seq_index), the model's own noise floor: the cosines of its positions
  // (noise_floor() below). Where given, a lossy path's cosines, sorted, must each be at least
  // min(min_cosine, the floor's cosine of the same rank): its distribution of cosines is nowhere
  // worse than the one the model's own engines make. Ranks, not positions: a chaotic model
  // amplifies different perturbations at different positions.
  std::vector<std::vector<double>> cosine_floor;
};

struct Flip {
  size_t seq = 0;
  int64_t pos = 0;
  int32_t local_id = 0, remote_id = 0;
  float lead = 0;  // local logit of local_id minus local logit of remote_id
};

struct SequenceResult {
  int64_t n_tokens = 0;
  // Positions below min_cosine, admitted by the model's noise floor where the sequence passed
  // (CompareOptions::cosine_floor).
  int64_t below_min_cosine = 0;
  int64_t argmax_same = 0;
  double cos_min = 1.0, cos_mean = 0.0;
  int64_t routing_same = 0, routing_total = 0;  // (MoE layer, token) decisions with equal sets
  bool bitwise = false;
  bool pass = false;
  std::vector<Flip> flips;
  double local_seconds = 0, remote_seconds = 0;

  double argmax_frac() const { return n_tokens > 0 ? double(argmax_same) / double(n_tokens) : 1.0; }
  double routing_frac() const { return routing_total > 0 ? double(routing_same) / double(routing_total) : 1.0; }
};

// Runs `tokens` through both contexts from an empty cache — the first half as one batch, the
// rest one token at a time, so both DISPATCH shapes are covered — and compares every position.
// `seq_index` labels the flips. With `remote_exec`, its traffic of the batch and of the one-token
// steps is added to traffic[0] and traffic[1].
Result<SequenceResult> compare_sequence(Context& local, Context& remote, const std::vector<int32_t>& tokens,
                                        const CompareOptions& opts, size_t seq_index = 0,
                                        RemoteExecutor* remote_exec = nullptr, RemoteTraffic* traffic = nullptr);

// ---- the model's own noise floor ------------------------------------------------------------

// How far the model's answers move between its two legitimate engines, per sequence: the quantized
// path (`native`: every quantized matmul rounds its input activations to INT8 blocks, as
// llama.cpp does) and the same file with every weight dequantized to f32 (`f32_reference`, loaded
// with LoadOptions::dequant_f32: f32 activations, llama.cpp's dequant-f32 mode). Both run the
// gate's schedule from an empty cache. A lossy wire whose logits stay within this floor loses no
// more than the model's own activation rounding does (docs/gate.md, "The model's noise floor").
struct NoiseFloor {
  std::vector<std::vector<double>> cos;       // per sequence and position: cosine native vs f32
  std::vector<int64_t> argmax_same;           // per sequence: positions whose top-1 token is the same
  double min(size_t seq) const;               // over one sequence's positions
  int64_t below(size_t seq, double c) const;  // positions of one sequence under c
};
Result<NoiseFloor> noise_floor(const Model& native, const Model& f32_reference,
                               const std::vector<std::vector<int32_t>>& sequences, int n_threads = 0);

struct GateReport {
  std::vector<SequenceResult> sequences;
  RemoteTraffic traffic[2];  // batches, one-token steps
  bool pass = false;         // every sequence passed
  double min_cosine() const;
  int64_t argmax_same() const;
  int64_t n_tokens() const;
};

// Both contexts over `model` (the remote one with `remote` as its executor and `spans` as its
// span runner; either may be null, not both) and compare_sequence on every sequence. `model`
// must hold every routed expert (the local reference run).
Result<GateReport> run_gate(const Model& model, const std::shared_ptr<RemoteExecutor>& remote,
                            const std::vector<std::vector<int32_t>>& sequences, const CompareOptions& opts,
                            int n_threads = 0, std::shared_ptr<SpanRunner> spans = nullptr);

}  // namespace moesh::gate
