// `moesh inspect FILE.gguf [--all-kv] [--json]`: header, metadata, tensor table and the
// expert-slab budget of a GGUF file (docs/inspect.md).
//
// The expert section answers the question a swarm operator asks first: how many bytes does one
// expert of one layer cost (the unit a worker holds), and how much of the file is backbone that
// every head node must keep.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "command.h"
#include "moesh/gguf/gguf.h"
#include "moesh/model/model.h"

namespace moesh::cli {
namespace {

using gguf::File;
using gguf::TensorInfo;
using gguf::Value;
using gguf::ValueType;

constexpr size_t k_default_items = 8;    // array items shown without --all-kv
constexpr size_t k_default_chars = 160;  // rendered value length shown without --all-kv

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = static_cast<double>(n);
  int u = 0;
  while (x >= 1024.0 && u < 4) {
    x /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", x, units[u]);
}

std::string shape_string(const TensorInfo& t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) s += fmt::format("{}{}", d ? ", " : "", t.ne[d]);
  return s + "]";
}

// A tensor holding one slab per routed expert: `blk.N.<anything>_exps.<weight|bias>`.
// Returns the layer, or -1 for any other tensor.
int expert_layer(const std::string& name, std::string* short_name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return -1;
  int layer = -1;
  const auto [p, ec] = std::from_chars(name.data() + 4, name.data() + dot, layer);
  if (ec != std::errc() || p != name.data() + dot) return -1;
  const std::string rest = name.substr(dot + 1);
  if (rest.find("_exps.") == std::string::npos) return -1;
  *short_name = rest;
  return layer;
}

struct ExpertRow {
  std::string tensor;  // e.g. "ffn_gate_exps.weight"
  std::string type;
  int64_t n_expert = 0;
  uint64_t slab_bytes = 0;
  uint64_t total_bytes = 0;
};

struct ExpertSummary {
  std::map<int, std::vector<ExpertRow>> layers;
  uint64_t expert_bytes = 0;
  uint64_t backbone_bytes = 0;
};

ExpertSummary summarize_experts(const File& f) {
  ExpertSummary s;
  for (const TensorInfo& t : f.tensors()) {
    std::string short_name;
    const int layer = expert_layer(t.name, &short_name);
    if (layer < 0 || t.n_dims < 2) {
      s.backbone_bytes += t.n_bytes;
      continue;
    }
    // Experts are the outermost dim: ne[2] for stacked matrices, ne[1] for per-expert biases.
    ExpertRow r;
    r.tensor = short_name;
    r.type = type_name(t.type);
    r.n_expert = t.ne[t.n_dims - 1];
    r.slab_bytes = r.n_expert > 0 ? t.n_bytes / static_cast<uint64_t>(r.n_expert) : 0;
    r.total_bytes = t.n_bytes;
    s.expert_bytes += t.n_bytes;
    s.layers[layer].push_back(std::move(r));
  }
  return s;
}

std::string render_value(const Value& v, bool all_kv) {
  std::string s = v.to_string(all_kv ? std::numeric_limits<size_t>::max() : k_default_items);
  if (!all_kv && s.size() > k_default_chars) s = s.substr(0, k_default_chars - 4) + " ...";
  return s;
}

nlohmann::ordered_json value_json(const Value& v, bool all_kv) {
  switch (v.type) {
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      return std::get<uint64_t>(v.v);
    case ValueType::INT8:
    case ValueType::INT16:
    case ValueType::INT32:
    case ValueType::INT64:
      return std::get<int64_t>(v.v);
    case ValueType::FLOAT32:
      return static_cast<float>(std::get<double>(v.v));
    case ValueType::FLOAT64:
      return std::get<double>(v.v);
    case ValueType::BOOL:
      return std::get<bool>(v.v);
    case ValueType::STRING:
      return std::get<std::string>(v.v);
    case ValueType::ARRAY: {
      const auto& a = std::get<gguf::Array>(v.v);
      const size_t n = all_kv ? a.items.size() : std::min(a.items.size(), k_default_items);
      nlohmann::ordered_json items = nlohmann::ordered_json::array();
      for (size_t i = 0; i < n; ++i) items.push_back(value_json(a.items[i], all_kv));
      return {{"elem_type", gguf::value_type_name(a.elem_type)},
              {"count", a.items.size()},
              {"truncated", n < a.items.size()},
              {"items", std::move(items)}};
    }
    case ValueType::kCOUNT:
      break;
  }
  return nullptr;
}

// What the model registry makes of the file: the architecture and the settings its file in
// src/model/ derives (or why it cannot run it).
struct ModelDesc {
  bool ok = false;
  std::string error;
  std::vector<std::pair<std::string, std::string>> rows;
};

ModelDesc describe_model(const File& f) {
  ModelDesc d;
  auto hp = load_hparams(f);
  if (!hp) {
    d.error = hp.status().message();
    return d;
  }
  d.ok = true;
  const HParams& h = *hp;
  auto add = [&](std::string k, std::string v) { d.rows.emplace_back(std::move(k), std::move(v)); };
  auto nextn_draft_head = [](const std::string& arch) -> std::string {
    for (const std::string& a : nextn_architectures()) {
      if (a == arch) return "not in the forward pass; a draft head: --draft nextn";
    }
    return "loaded, not run";
  };
  add("architecture", h.arch_name + " (supported)");
  add("blocks",
      fmt::format("{} decoder{}{}", h.n_layer,
                  h.n_rec_layer > 0 ? fmt::format(" ({} {}, {} attention)", h.n_rec_layer,
                                                  h.dnet.kda ? "KDA" : "gated DeltaNet", h.n_kv_layer)
                                    : "",
                  h.n_nextn > 0 ? fmt::format(" + {} NextN/MTP ({})", h.n_nextn, nextn_draft_head(h.arch_name)) : ""));
  if (h.n_rec_layer > 0) {
    const HParams::DeltaNet& dn = h.dnet;
    // What a sequence costs beyond its KV cells: one state per recurrent block, and as much
    // again per checkpoint kept (rollback, prefix reuse).
    const double kib = static_cast<double>(h.rec_width * h.n_rec_layer) * sizeof(float) / 1024.0;
    if (dn.kda) {  // kimi-k3
      add("kda", fmt::format("{} heads of {}, conv {} on q/k/v, per-channel decay (lower bound {}); "
                             "state {:.1f} KiB per sequence (and per checkpoint)",
                             dn.n_v_head, dn.d_state, dn.d_conv, dn.gate_lower_bound, kib));
    } else {
      add("deltanet", fmt::format("{} key / {} value heads of {}, conv {}, {} head order, {} beta/alpha; "
                                  "state {:.1f} KiB per sequence (and per checkpoint)",
                                  dn.n_k_head, dn.n_v_head, dn.d_state, dn.d_conv, dn.tiled ? "tiled" : "grouped",
                                  dn.split_ba ? "separate" : "grouped", kib));
    }
  }
  if (h.attn_res_block > 0) {  // kimi-k3
    add("residual", fmt::format("cross-layer residual attention, a checkpoint every {} blocks", h.attn_res_block));
  }
  const char* qk = h.qk_norm == QkNorm::kPerHead      ? ", per-head Q/K norm"
                   : h.qk_norm == QkNorm::kFull       ? ", Q/K norm over the whole projection"
                   : h.qk_norm == QkNorm::kUnweighted ? ", unweighted Q/K norm after RoPE"
                                                      : "";
  // kimi-k3's MLA blocks rotate nothing: the n_rot "rope" dims of each head take part unrotated.
  const std::string rope = h.arch_name == "kimi-k3" ? fmt::format("no rope ({} unrotated dims)", h.n_rot)
                                                    : fmt::format("rope {} dims {}", h.n_rot,
                                                                  h.rope.mode == RopeMode::kNeox ? "neox" : "normal");
  add("attention",
      fmt::format("{} heads / {} KV, head {}/{}, {}{}{}{}", h.n_head, h.n_head_kv, h.head_dim_k, h.head_dim_v, rope,
                  h.rope_scaling.yarn ? fmt::format(" yarn x{}", h.rope_scaling.factor) : "", qk,
                  h.n_swa > 0 ? fmt::format(", {} {}", h.swa_chunked ? "chunks of" : "window", h.n_swa) : "") +
          (h.q_gated ? ", sigmoid-gated output" : ""));
  if (!h.n_head_layer.empty() || !h.swa_layer.empty()) {  // step35: the blocks differ
    std::string per;
    for (int64_t il = 0; il < h.n_layer; ++il) {
      const bool swa = static_cast<size_t>(il) < h.swa_layer.size() && h.swa_layer[static_cast<size_t>(il)] != 0;
      per += fmt::format("{}{}{}", il > 0 ? " " : "", h.n_head_of(il), swa ? "w" : "");
    }
    add("per block",
        fmt::format(
            "query heads {} (w: window {}{})", per, h.n_swa,
            h.rope_swa_own ? fmt::format(", rope {} dims base {}", h.rope_swa.n_rot, h.rope_swa.freq_base) : ""));
  }
  if (h.msa.n_head > 0) {  // minimax-m3: MiniMax sparse attention in the blocks after the dense ones
    add("sparse attention",
        fmt::format("MSA in blocks {}-{}: {} indexer heads (one per KV group) of {}, blocks of {} positions, "
                    "top-{} blocks per group ({} most recent always)",
                    h.n_leading_dense, h.n_layer - 1, h.msa.n_head, h.msa.head_dim, h.msa.block, h.msa.top_k,
                    h.msa.local));
  }
  if (h.n_indexer_head > 0) {  // glm-dsa: DeepSeek sparse attention over MLA
    std::string own, reused;
    for (int64_t il = 0; il < h.n_layer; ++il) {
      const int32_t src = h.indexer_source_of(il);
      if (src == il) own += fmt::format("{}{}", own.empty() ? "" : " ", il);
      if (src >= 0 && src < il) reused += fmt::format("{}{} (of {})", reused.empty() ? "" : ", ", il, src);
    }
    add("sparse attention",
        fmt::format("DSA lightning indexer: {} heads of {}, top-{} cells per token; own selection in blocks {}{}",
                    h.n_indexer_head, h.indexer_head_dim, h.indexer_top_k, own,
                    reused.empty() ? "" : "; reused in " + reused));
  }
  if (h.n_expert > 0) {
    add("experts",
        fmt::format("{} routed, top-{}, {} gating{}{}{}, width {}", h.n_expert, h.n_expert_used,
                    gating_func_name(h.gating), h.select_on_logits ? " (selected on raw logits)" : "",
                    h.norm_w ? ", renormalised" : "",
                    h.w_scale != 0.0f && h.w_scale != 1.0f ? fmt::format(", x{}", h.w_scale) : "", h.n_ff_exp));
    add("expert ffn", h.expert_ffn.describe());
    if (h.n_expert_latent > 0) {  // kimi-k3: what goes on the wire
      add("latent moe", fmt::format("experts run on {}-wide rows (ffn_routed_down / _norm / _up on the backbone)",
                                    h.n_expert_latent));
    }
    if (h.n_expert_shared > 0) {
      add("shared expert",
          fmt::format("{} x width {}{}", h.n_expert_shared, h.n_ff_shexp > 0 ? h.n_ff_shexp : h.n_ff_exp,
                      h.shexp_gated ? ", sigmoid-gated" : ""));
    }
  }
  return d;
}

void print_json(const File& f, bool all_kv) {
  nlohmann::ordered_json j;
  j["file"] = f.path();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["data_offset"] = f.data_offset();
  j["file_size"] = f.size();
  j["tensor_count"] = f.tensors().size();
  j["kv_count"] = f.kvs().size();
  nlohmann::ordered_json kvs = nlohmann::ordered_json::array();
  for (const auto& [key, v] : f.kvs()) {
    kvs.push_back({{"key", key}, {"type", gguf::value_type_name(v.type)}, {"value", value_json(v, all_kv)}});
  }
  j["metadata"] = std::move(kvs);
  nlohmann::ordered_json ts = nlohmann::ordered_json::array();
  for (const TensorInfo& t : f.tensors()) {
    ts.push_back({{"name", t.name},
                  {"type", type_name(t.type)},
                  {"ne", std::vector<int64_t>(t.ne, t.ne + t.n_dims)},
                  {"n_bytes", t.n_bytes},
                  {"offset", t.offset}});
  }
  j["tensors"] = std::move(ts);
  const ExpertSummary s = summarize_experts(f);
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& [layer, rows] : s.layers) {
    nlohmann::ordered_json lj = {{"layer", layer}, {"tensors", nlohmann::ordered_json::array()}};
    uint64_t total = 0;
    for (const auto& r : rows) {
      lj["tensors"].push_back({{"tensor", r.tensor},
                               {"type", r.type},
                               {"n_expert", r.n_expert},
                               {"slab_bytes", r.slab_bytes},
                               {"total_bytes", r.total_bytes}});
      total += r.total_bytes;
    }
    lj["total_bytes"] = total;
    layers.push_back(std::move(lj));
  }
  j["experts"] = {
      {"layers", std::move(layers)}, {"expert_bytes", s.expert_bytes}, {"backbone_bytes", s.backbone_bytes}};
  {
    const ModelDesc d = describe_model(f);
    nlohmann::ordered_json mj = {{"supported", d.ok}};
    if (!d.ok) mj["error"] = d.error;
    for (const auto& [k, v] : d.rows) mj[k] = v;
    j["model"] = std::move(mj);
  }
  // Token strings need not be valid UTF-8; replace bad bytes rather than throw.
  std::fputs(j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str(), stdout);
  std::fputc('\n', stdout);
}

void print_model(const File& f) {
  const ModelDesc d = describe_model(f);
  fmt::print("\nmodel\n");
  if (!d.ok) {
    fmt::print("  cannot run: {}\n", d.error);
    return;
  }
  for (const auto& [k, v] : d.rows) fmt::print("  {:<14} {}\n", k, v);
}

void print_text(const File& f, bool all_kv) {
  fmt::print("GGUF {}\n", f.path());
  fmt::print("  version      {}\n", f.version());
  fmt::print("  alignment    {}\n", f.alignment());
  fmt::print("  data offset  {}\n", f.data_offset());
  fmt::print("  file size    {} ({})\n", f.size(), human_bytes(f.size()));
  fmt::print("  tensors      {}\n", f.tensors().size());
  fmt::print("  kv pairs     {}\n", f.kvs().size());

  size_t key_w = 3;
  for (const auto& kv : f.kvs()) key_w = std::max(key_w, kv.first.size());
  fmt::print("\nmetadata ({} keys)\n", f.kvs().size());
  for (const auto& [key, v] : f.kvs()) {
    fmt::print("  {:<{}}  {:<7}  {}\n", key, key_w, gguf::value_type_name(v.type), render_value(v, all_kv));
  }

  print_model(f);

  if (f.tensors().empty()) {
    fmt::print("\ntensors: none\n");
    return;
  }
  size_t name_w = 4;
  for (const auto& t : f.tensors()) name_w = std::max(name_w, t.name.size());
  fmt::print("\ntensors ({})\n", f.tensors().size());
  fmt::print("  {:>4}  {:<{}}  {:<6}  {:<18}  {:>12}  {:>12}\n", "#", "name", name_w, "type", "shape (ne)", "bytes",
             "offset");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    fmt::print("  {:>4}  {:<{}}  {:<6}  {:<18}  {:>12}  {:>12}\n", i, t.name, name_w, type_name(t.type),
               shape_string(t), t.n_bytes, t.offset);
  }

  const ExpertSummary s = summarize_experts(f);
  const uint64_t total = s.expert_bytes + s.backbone_bytes;
  if (!s.layers.empty()) {
    size_t tw = 6;
    for (const auto& [layer, rows] : s.layers) {
      for (const auto& r : rows) tw = std::max(tw, r.tensor.size());
    }
    fmt::print("\nexperts ({} MoE layers)\n", s.layers.size());
    fmt::print("  {:>5}  {:<{}}  {:<6}  {:>8}  {:>12}  {:>12}\n", "layer", "tensor", tw, "type", "n_expert",
               "bytes/expert", "total");
    // Consecutive layers whose expert tensors agree in every column share one block ("0-47"),
    // so a 48-layer model prints a few lines, not 192.
    auto same = [](const std::vector<ExpertRow>& a, const std::vector<ExpertRow>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].tensor != b[i].tensor || a[i].type != b[i].type || a[i].n_expert != b[i].n_expert ||
            a[i].slab_bytes != b[i].slab_bytes || a[i].total_bytes != b[i].total_bytes)
          return false;
      }
      return true;
    };
    for (auto it = s.layers.begin(); it != s.layers.end();) {
      auto last = it;
      for (auto next = std::next(it);
           next != s.layers.end() && next->first == last->first + 1 && same(next->second, it->second); ++next)
        last = next;
      const std::string label = last == it ? std::to_string(it->first) : fmt::format("{}-{}", it->first, last->first);
      uint64_t layer_total = 0, layer_slab = 0;
      for (const auto& r : it->second) {
        fmt::print("  {:>5}  {:<{}}  {:<6}  {:>8}  {:>12}  {:>12}\n", label, r.tensor, tw, r.type, r.n_expert,
                   r.slab_bytes, r.total_bytes);
        layer_total += r.total_bytes;
        layer_slab += r.slab_bytes;
      }
      fmt::print("  {:>5}  {:<{}}  {:<6}  {:>8}  {:>12}  {:>12}\n", label, "(layer total)", tw, "", "", layer_slab,
                 layer_total);
      it = std::next(last);
    }
  }
  const double pct = total ? 100.0 * static_cast<double>(s.expert_bytes) / static_cast<double>(total) : 0.0;
  fmt::print("\nexpert bytes    {:>12}  ({}, {:.1f}% of tensor data)\n", s.expert_bytes, human_bytes(s.expert_bytes),
             pct);
  fmt::print("backbone bytes  {:>12}  ({}, {:.1f}%)\n", s.backbone_bytes, human_bytes(s.backbone_bytes),
             total ? 100.0 - pct : 0.0);
}

struct InspectOptions {
  std::string path;
  bool all_kv = false;
  bool json = false;
};

int run_inspect(const InspectOptions& o) {
  auto f = File::open(o.path);
  if (!f.is_ok()) {
    std::fflush(stdout);
    fmt::print(stderr, "moesh inspect: {}\n", f.status().to_string());
    return 1;
  }
  if (o.json) {
    print_json(**f, o.all_kv);
  } else {
    print_text(**f, o.all_kv);
  }
  return 0;
}

const CommandRegistrar kRegisterInspect{
    Command{"inspect", "Print a GGUF file's header, metadata, tensors and expert slab sizes",
            [](CLI::App* sub) -> std::function<int()> {
              auto opts = std::make_shared<InspectOptions>();
              sub->add_option("file", opts->path, "GGUF file")->required();
              sub->add_flag("--all-kv", opts->all_kv, "Print arrays and long strings in full");
              sub->add_flag("--json", opts->json, "Machine-readable output");
              return [opts]() { return run_inspect(*opts); };
            }}};

}  // namespace
}  // namespace moesh::cli
