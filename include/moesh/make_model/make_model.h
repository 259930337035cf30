// make_model: writes random-weight MoE models as GGUF files that llama.cpp also loads.
//
// What it is for: test and benchmark models of a chosen shape (the tiny reference models in
// ../shared/reference, or the Qwen3-30B-A3B-shaped perf model in ../shared/perf) without
// downloading anything. The files follow what llama.cpp's own tools write:
//
//  * metadata keys, value types and key order as the reference files (manifest.json);
//  * a tokenizer: by default (MakeVocab::kBpe) a real byte-level BPE vocabulary of exactly
//    n_vocab tokens (256 byte tokens, merges learned from a small built-in English text,
//    <|reserved_N|> padding, then <|endoftext|> <|im_start|> <|im_end|> as the last ids) with
//    the Qwen2 pre-tokenizer and a ChatML chat template, so tiny random models can be driven by
//    text; MakeVocab::kNone writes tokenizer.ggml.model = "no_vocab" (ids only, exactly the
//    reference files' metadata), and <arch>.vocab_size gives the vocabulary;
//  * tensor names, ne order and tensor order as the reference files: generator order for
//    f32/f16 (what a converter writes), llama-quantize's order (global tensors first, then by
//    block index, names sorted inside a block) for q8_0/q4_k_m;
//  * tensor types: f32 everything; f16 matrices F16, 1-D tensors and routers F32; q8_0 matrices
//    Q8_0; q4_k_m = llama-quantize's Q4_K_M recipe (docs/background/quant-formats.md §8), norms, routers and
//    exp_probs_b never quantized.
//
// Weights: every tensor row is drawn from its own std::mt19937_64 stream, seeded from
// (spec.seed, tensor name, row index), turned into normals by a hand-written Box-Muller. So the
// bytes are the same on every platform and thread count, and files of different types made with
// the same seed hold the same underlying weights (an f32 and a q8_0 file differ only by the
// quantization). Stds follow the reference README: 0.5 token_embd, 0.04 attention and dense
// FFN, 0.05 routed/shared experts, 0.15 routers, 0.08 output, 0.05 exp_probs_b, norms 1+0.1·N.
//
// Memory: the file is written tensor by tensor, a bounded chunk of rows at a time (metadata and
// tensor infos first, all sizes being known up front), so a 1.5 GB model needs a few MB of RAM.
// The output goes to `<out>.partial` and is renamed when complete.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moesh/gguf/gguf.h"
#include "moesh/tensor/types.h"
#include "moesh/util/status.h"

namespace moesh {

// kRegistry: any architecture whose file in the model registry can describe itself
// (include/moesh/model/make_arch.h: gpt-oss, glm4moe, llama4, minimax-m2); its name is
// MakeModelSpec::registry_arch, its keys and tensor table come from that file.
enum class MakeArch : uint8_t { kQwen3Moe, kLlama, kDeepseek2, kRegistry, kCOUNT };
// The file types llama.cpp calls ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_K_M.
enum class MakeFileType : uint8_t { kF32, kF16, kQ8_0, kQ4_K_M, kCOUNT };
// The tokenizer written into the file: a learned byte-level BPE vocabulary, or none (ids only).
enum class MakeVocab : uint8_t { kBpe, kNone, kCOUNT };

const char* make_arch_name(MakeArch a);                       // "qwen3moe" | "llama" | "deepseek2" | "registry"
bool make_arch_from_name(std::string_view s, MakeArch* out);  // accepts "mixtral" for llama
// Every --arch make-model accepts: the three built-in writers, then the registry's.
std::vector<std::string> make_arch_names();
const char* make_file_type_name(MakeFileType t);                       // "f32" | "f16" | "q8_0" | "q4_k_m"
bool make_file_type_from_name(std::string_view s, MakeFileType* out);  // case-insensitive
uint32_t make_file_type_ftype(MakeFileType t);                         // general.file_type: 0, 1, 7, 15
const char* make_vocab_name(MakeVocab v);                              // "bpe" | "none"
bool make_vocab_from_name(std::string_view s, MakeVocab* out);         // case-insensitive

// The shape of the model to write. Start from defaults_for(arch) (the reference "-s" model of
// that arch) or perf_30b_a3b(), change fields, then validate(). Fields an arch does not use are
// ignored (listed per field).
struct MakeModelSpec {
  MakeArch arch = MakeArch::kQwen3Moe;
  MakeFileType type = MakeFileType::kF32;
  uint64_t seed = 1001;
  std::string name;  // general.name; empty -> "moesh-random-<arch>"
  // kBpe needs n_vocab >= 259 (256 bytes + 3 specials). The weights do not depend on it.
  MakeVocab vocab = MakeVocab::kBpe;
  // No output.weight: the logits use token_embd as the output matrix (tied embeddings).
  bool tied_embeddings = false;
  // kBpe: the tokenizer.chat_template written (Jinja source); empty: the built-in ChatML one
  // (or the imported tokenizer's own).
  std::string chat_template;
  // kBpe: a real tokenizer's GGUF keys (import_hf_vocab in moesh/text/hf_vocab.h, `--vocab-from`),
  // written instead of the built-in vocabulary; n_vocab must equal its token count.
  std::vector<std::pair<std::string, gguf::Value>> imported_vocab;

  int64_t n_vocab = 512;
  int64_t n_ctx = 256;  // <arch>.context_length
  int64_t n_embd = 256;
  int64_t n_layer = 2;
  int64_t n_head = 8;
  int64_t n_head_kv = 2;  // qwen3moe, llama (deepseek2 writes 1: MLA)
  int64_t head_dim = 64;  // qwen3moe, llama (deepseek2: qk_nope/qk_rope/v_head)
  int64_t n_expert = 8;
  int64_t n_expert_used = 2;
  int64_t n_ff_exp = 256;  // routed (and per shared) expert width; llama: = feed_forward_length
  int64_t n_ff = 256;      // dense FFN width (deepseek2 leading dense layers); llama: = n_ff_exp
  float rope_base = 1e6f;
  float rms_eps = 1e-6f;

  // deepseek2 (MLA + DeepSeek-V3 routing) only.
  int64_t q_lora_rank = 256;
  int64_t kv_lora_rank = 256;
  int64_t qk_nope = 64;
  int64_t qk_rope = 32;
  int64_t v_head = 64;
  int64_t n_expert_shared = 1;
  int64_t n_group = 4;  // expert_group_count (1 = no group-limited routing)
  int64_t n_group_used = 2;
  int64_t n_leading_dense = 1;  // leading_dense_block_count
  uint32_t gating_func = 2;     // 1 softmax, 2 sigmoid (adds exp_probs_b), 3 softmax_weight
  bool expert_weights_norm = true;
  float expert_weights_scale = 2.5f;
  float yarn_factor = 4.0f;  // rope.scaling.factor; <= 1 writes no rope.scaling.* keys
  int64_t yarn_orig_ctx = 64;
  float yarn_log_mul = 0.1f;  // rope.scaling.yarn_log_multiplier (0.1 * mscale_all_dim)

  // The reference models of ../shared/reference §3: qwen3moe-s (seed 1001), mixtral-s (llama,
  // seed 1002), deepseek2-s (seed 1003).
  static MakeModelSpec defaults_for(MakeArch arch);
  // Any name of make_arch_names(): the built-in reference model, or a registry arch's own
  // reference-sized defaults (the archs/ reference set: gptoss-a, glm4moe-a, llama4-a,
  // minimaxm2-a, with their seeds). False for an unknown name.
  static bool defaults_for_name(std::string_view arch, MakeModelSpec* out);
  std::string registry_arch;      // the architecture when arch == kRegistry
  std::string arch_name() const;  // general.architecture of the written file
  // The Qwen3-30B-A3B-shaped 4-layer perf model (../shared/perf/README.md §1), Q4_K_M.
  static MakeModelSpec perf_30b_a3b();

  // kInvalidArgument naming the offending field(s) and the rule, e.g. "n_embd 200 is not a
  // multiple of 32, the Q8_0 block size (token_embd.weight ne[0])".
  Status validate() const;
};

// How a tensor's values are drawn: mean + std * N(0,1).
struct WeightInit {
  float mean = 0.0f;
  float std = 0.0f;
  // Not normal: uniform in [lo, hi), or softplus⁻¹ of that (a DeltaNet dt bias: reference README §3).
  enum class Dist : uint8_t { kNormal = 0, kUniform, kSoftplusInverse } dist = Dist::kNormal;
  float lo = 0.0f, hi = 0.0f;
};

struct PlannedTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  WeightInit init;
  int layer = -1;          // block index, -1 for global tensors
  bool is_expert = false;  // a stacked *_exps tensor (ne[2] = n_expert)
  uint64_t n_bytes = 0;    // unpadded
  uint64_t offset = 0;     // within the data section (aligned to kMakeModelAlignment)

  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
};

constexpr uint64_t kMakeModelAlignment = 32;  // GGUF default; no general.alignment key written

// Everything make_model writes, computed without generating any weight.
struct ModelPlan {
  std::vector<std::pair<std::string, gguf::Value>> kvs;  // in file order
  std::vector<PlannedTensor> tensors;                    // in file order
  uint64_t data_bytes = 0;                               // data section size (tensors padded to the alignment)

  // Sum of the *_exps tensor bytes of block `layer`.
  uint64_t expert_bytes(int layer) const;
};

// Validates the spec and lays out metadata and tensors.
Result<ModelPlan> plan_model(const MakeModelSpec& spec);

// The type llama-quantize gives a tensor for the file type (docs/background/quant-formats.md §8), including the
// n_expert == 8 bumps, the more-bits layer rule and the fallbacks when ne[0] % 256 != 0.
// `i_attn_v`/`n_attn_v`: index of this tensor among the attn_v tensors and their count.
// Returns F32 for tensors that stay unquantized (1-D, *_norm, ffn_gate_inp, non-.weight).
GgmlType make_model_tensor_type(MakeFileType ftype, const std::string& name, int n_dims, const int64_t ne[4],
                                int64_t n_layer, int64_t n_expert, int i_attn_v, int n_attn_v);

// Writes `rows` consecutive rows (each ne[0] values) of a tensor's f32 weights starting at row
// `row0`, exactly the values make_model quantizes. Deterministic in (seed, name, row).
void make_model_fill_rows(uint64_t seed, const PlannedTensor& t, int64_t row0, int64_t rows, float* out);

struct MakeModelProgress {
  size_t tensor_index = 0;  // the tensor just finished
  size_t n_tensors = 0;
  const PlannedTensor* tensor = nullptr;
  uint64_t bytes_done = 0;  // data bytes written so far
  uint64_t bytes_total = 0;
  double seconds = 0;  // since the start
};

struct MakeModelOptions {
  int n_threads = 0;                                          // <= 0: all cores
  std::function<void(const MakeModelProgress&)> on_progress;  // after each tensor
};

// Validates `spec`, then streams the model to `out_path` (via `<out_path>.partial`).
// Errors: kInvalidArgument (spec), kIoError (file system), kInternal (a quantizer refused a type).
Status make_model(const MakeModelSpec& spec, const std::string& out_path);
Status make_model(const MakeModelSpec& spec, const std::string& out_path, const MakeModelOptions& options);

// `make-model --nextn-oracle` (src/make_model/make_model_oracle.cpp): `spec`'s model in F32 with a
// bigram decoder (attention outputs and FFN down projections zero) and a NextN/MTP head set up to
// compute that map one token ahead, so the head drafts exactly what the model generates — for
// measuring what drafting saves, not a language model. kInvalidArgument when the architecture
// has no NextN block (glm4moe has one).
Status make_nextn_oracle(const MakeModelSpec& spec, const std::string& out_path);

}  // namespace moesh
