// The architecture registry: one ArchDef per GGUF `general.architecture` string.
//
// An architecture is ONE file (src/model/arch_<name>.cpp) that defines an ArchDef:
//   * read_hparams — its metadata keys, on top of the keys every architecture shares (read in
//     hparams.cpp), with llama.cpp's defaults, and the expert FFN definition;
//   * bind_layer   — its tensor table: every GGUF tensor of a block by name and shape, bound into
//     the shared LayerWeights (what each piece of the layer library reads);
//   * mixer        — the block's token mixer (attention variant) from the shared layer library
//     (layers.h); the FFN half of a block (dense or MoE) is shared by every architecture;
//   * write_hparams / make_defaults — the inverse of read_hparams, so `moesh make-model --arch`
//     writes a random model of that architecture from the same tensor table.
// registry.cpp lists the ArchDefs; it is the only other line a new architecture adds.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/layers.h"

namespace moesh {

// Reads "<arch>.<key>" with a message that names the full key when it is missing.
class KeyReader {
 public:
  KeyReader(const gguf::File& f, std::string prefix) : f_(f), prefix_(std::move(prefix)) {}

  std::string full(const char* key) const { return prefix_ + "." + key; }
  bool has(const char* key) const { return f_.has(full(key)); }
  const gguf::File& file() const { return f_; }

  template <typename T>
  Status req(const char* key, T* out) const {
    const std::string k = full(key);
    if (!f_.has(k)) return make_error(StatusCode::kNotFound, "{} missing", k);
    auto r = f_.get<T>(k);
    if (!r) return r.status();
    *out = *r;
    return Status::ok();
  }
  template <typename T>
  Status opt(const char* key, T* out, T def) const {
    auto r = f_.get_or<T>(full(key), def);
    if (!r) return r.status();
    *out = *r;
    return Status::ok();
  }
  Status positive(const char* key, int64_t v) const {
    if (v <= 0) return make_error(StatusCode::kCorrupt, "{} = {} must be positive", full(key), v);
    return Status::ok();
  }

 private:
  const gguf::File& f_;
  std::string prefix_;
};

// Metadata a make-model writes: ordered (key, value) pairs.
using KvList = std::vector<std::pair<std::string, gguf::Value>>;

struct ArchDef {
  std::string_view name;  // general.architecture
  // The arch's own keys and derived settings. Called after the shared keys (vocab, context,
  // embedding, blocks, heads, key/value length, rms eps, feed_forward_length, rope base and
  // scaling) are in *hp. Sets at least n_rot, rope.mode, the MoE fields and the cache widths.
  Status (*read_hparams)(const KeyReader& kr, HParams* hp);
  // Global tensors beyond token_embd / output_norm / output (e.g. rope_freqs); may be null.
  Status (*bind_globals)(detail::TensorBinder& b, HParams* hp);
  // One block's tensor table.
  Status (*bind_layer)(detail::TensorBinder& b, const HParams& hp, int il, LayerWeights* lw);
  // The NextN/MTP block il (il >= n_layer) as a draft head (NextnDraft), or null: NextN blocks
  // of the file are then skipped (detail::bind_nextn_block for the DeepSeek-style blocks).
  Status (*bind_nextn)(detail::TensorBinder& b, const HParams& hp, int il, NextnWeights* nw);
  // The block's token mixer: out = mixer(xn), xn = attn_norm(h) (h += out follows).
  void (*mixer)(detail::Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);
  // make-model: the reference-sized defaults of this arch and the keys that describe hp (the
  // inverse of read_hparams, in the order llama.cpp's converter writes them). Null: make-model
  // does not write this architecture.
  HParams (*make_defaults)();
  void (*write_hparams)(const HParams& hp, KvList* kvs);
  // The chat template family of the architecture's models (a moesh chat format name), used by
  // `run --chat` and `serve` when a file carries no tokenizer.chat_template; empty: none.
  std::string_view chat_family;
};

// The ArchDef for a general.architecture string, or null.
const ArchDef* find_arch(std::string_view name);
// Every registered architecture, in registry order.
const std::vector<const ArchDef*>& all_archs();

// Shared by the arch files: the MoE keys (expert_count, expert_used_count), required or not.
Status read_moe_counts(const KeyReader& kr, HParams* hp, bool required);
// Shared by the arch files' write_hparams: the keys every architecture has, in converter order
// up to (and including) attention.head_count.
void write_common_head(const HParams& hp, KvList* kvs);
// The GQA family's keys after attention.head_count: head_count_kv, key/value length (when
// `lengths`), rope.dimension_count (when `rope_dims`), rope.freq_base, layer_norm_rms_epsilon.
void write_gqa_keys(const HParams& hp, KvList* kvs, bool lengths = true, bool rope_dims = true);
// The gated-DeltaNet hybrids (qwen3next, qwen35moe; layers_deltanet.cpp): the ssm.* keys and
// full_attention_interval (a block attends when (il + 1) % interval == 0, else it is recurrent),
// the recurrent-state width; and the inverse for make-model.
Status read_deltanet_keys(const KeyReader& kr, HParams* hp);
void write_deltanet_keys(const HParams& hp, KvList* kvs);
// KDA (kimi-k3; layers_deltanet.cpp): ssm.conv_kernel, kda.head_dim, kda.gate_lower_bound; one
// state per attention head (n_head); sets the recurrent-state width. And the inverse.
Status read_kda_keys(const KeyReader& kr, HParams* hp);
void write_kda_keys(const HParams& hp, KvList* kvs);
// The hybrids' block mixer: gated DeltaNet in recurrent blocks, the GQA family in the others.
void hybrid_mixer(detail::Fwd& f, int il, const LayerWeights& lw, const float* xn, float* out);

// MLA (deepseek2, glm-dsa; layers_mla.cpp): rope.dimension_count, the q/kv LoRA ranks and the
// MLA head sizes, the latent cache widths ([c | k_pe] as K, c as V), NORM RoPE and the score
// scale (YaRN's magnitude moved into it).
Status read_mla_keys(const KeyReader& kr, HParams* hp);

// "<arch>.<key>" helpers for write_hparams.
void put_u32(KvList* kvs, const HParams& hp, const char* key, int64_t v);
void put_f32(KvList* kvs, const HParams& hp, const char* key, float v);
void put_bool(KvList* kvs, const HParams& hp, const char* key, bool v);

}  // namespace moesh
