// make_model: spec defaults and validation, the seeded weight generator, and the streaming
// GGUF writer (header and tensor infos first, then each tensor's data a chunk of rows at a time).
#include "moesh/make_model/make_model.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "make_model/make_model_internal.h"
#include "moesh/tensor/fp16.h"
#include "moesh/tensor/quant.h"
#include "moesh/tensor/threadpool.h"

namespace moesh {

// ---------------------------------------------------------------- names

const char* make_arch_name(MakeArch a) {
  switch (a) {
    case MakeArch::kQwen3Moe:
      return "qwen3moe";
    case MakeArch::kLlama:
      return "llama";
    case MakeArch::kDeepseek2:
      return "deepseek2";
    case MakeArch::kRegistry:
      return "registry";
    case MakeArch::kCOUNT:
      break;
  }
  return "?";
}

namespace {
std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}
}  // namespace

bool make_arch_from_name(std::string_view s, MakeArch* out) {
  const std::string l = lower(s);
  if (l == "qwen3moe")
    *out = MakeArch::kQwen3Moe;
  else if (l == "llama" || l == "mixtral")
    *out = MakeArch::kLlama;
  else if (l == "deepseek2")
    *out = MakeArch::kDeepseek2;
  else
    return false;
  return true;
}

const char* make_file_type_name(MakeFileType t) {
  switch (t) {
    case MakeFileType::kF32:
      return "f32";
    case MakeFileType::kF16:
      return "f16";
    case MakeFileType::kQ8_0:
      return "q8_0";
    case MakeFileType::kQ4_K_M:
      return "q4_k_m";
    case MakeFileType::kCOUNT:
      break;
  }
  return "?";
}

bool make_file_type_from_name(std::string_view s, MakeFileType* out) {
  const std::string l = lower(s);
  for (int i = 0; i < static_cast<int>(MakeFileType::kCOUNT); ++i) {
    if (l == make_file_type_name(static_cast<MakeFileType>(i))) {
      *out = static_cast<MakeFileType>(i);
      return true;
    }
  }
  return false;
}

uint32_t make_file_type_ftype(MakeFileType t) {
  switch (t) {
    case MakeFileType::kF32:
      return 0;
    case MakeFileType::kF16:
      return 1;
    case MakeFileType::kQ8_0:
      return 7;
    case MakeFileType::kQ4_K_M:
      return 15;
    case MakeFileType::kCOUNT:
      break;
  }
  return 0;
}

const char* make_vocab_name(MakeVocab v) {
  switch (v) {
    case MakeVocab::kBpe:
      return "bpe";
    case MakeVocab::kNone:
      return "none";
    case MakeVocab::kCOUNT:
      break;
  }
  return "?";
}

bool make_vocab_from_name(std::string_view s, MakeVocab* out) {
  const std::string l = lower(s);
  if (l == "bpe")
    *out = MakeVocab::kBpe;
  else if (l == "none")
    *out = MakeVocab::kNone;
  else
    return false;
  return true;
}

// ---------------------------------------------------------------- spec

MakeModelSpec MakeModelSpec::defaults_for(MakeArch arch) {
  MakeModelSpec s;  // the member defaults are qwen3moe-s
  s.arch = arch;
  switch (arch) {
    case MakeArch::kQwen3Moe:
      s.seed = 1001;
      break;
    case MakeArch::kLlama:  // mixtral-s
      s.seed = 1002;
      s.n_vocab = 1024;
      s.n_head = 4;
      s.n_head_kv = 2;
      s.head_dim = 64;
      s.n_ff_exp = 256;
      s.n_ff = 256;
      s.rms_eps = 1e-5f;
      break;
    case MakeArch::kRegistry:  // use defaults_for_name
      break;
    case MakeArch::kDeepseek2:  // deepseek2-s
      s.seed = 1003;
      s.n_layer = 3;
      s.n_head = 4;
      s.n_head_kv = 1;  // not used: MLA writes 1
      s.head_dim = 96;  // not used: qk_nope + qk_rope
      s.n_expert = 16;
      s.n_expert_used = 4;
      s.n_ff = 512;
      s.rope_base = 1e4f;
      break;
    case MakeArch::kCOUNT:
      break;
  }
  return s;
}

MakeModelSpec MakeModelSpec::perf_30b_a3b() {
  MakeModelSpec s = defaults_for(MakeArch::kQwen3Moe);
  s.type = MakeFileType::kQ4_K_M;
  s.seed = 30003;
  s.name = "perf-qwen3moe-30b-a3b-4L";
  s.n_vocab = 16384;
  s.n_ctx = 4096;
  s.n_embd = 2048;
  s.n_layer = 4;
  s.n_head = 32;
  s.n_head_kv = 4;
  s.head_dim = 128;
  s.n_expert = 128;
  s.n_expert_used = 8;
  s.n_ff_exp = 768;
  s.n_ff = 768;
  s.rope_base = 1e6f;
  s.rms_eps = 1e-6f;
  return s;
}

namespace detail {

Status validate_spec_fields(const MakeModelSpec& s) {
  if (s.arch >= MakeArch::kCOUNT) return make_error(StatusCode::kInvalidArgument, "unknown arch");
  if (s.type >= MakeFileType::kCOUNT) {
    return make_error(StatusCode::kInvalidArgument, "unknown file type");
  }
  constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
  struct Field {
    const char* name;
    int64_t v;
  };
  const Field positive[] = {{"n_vocab", s.n_vocab},
                            {"n_ctx", s.n_ctx},
                            {"n_embd", s.n_embd},
                            {"n_layer", s.n_layer},
                            {"n_head", s.n_head},
                            {"n_expert", s.n_expert},
                            {"n_expert_used", s.n_expert_used},
                            {"n_ff_exp", s.n_ff_exp}};
  for (const auto& f : positive) {
    if (f.v <= 0 || f.v > kMaxU32) {
      return make_error(StatusCode::kInvalidArgument, "{} must be in [1, {}], got {}", f.name, kMaxU32, f.v);
    }
  }
  if (s.n_expert_used > s.n_expert) {
    return make_error(StatusCode::kInvalidArgument, "n_expert_used {} is larger than n_expert {}", s.n_expert_used,
                      s.n_expert);
  }
  if (!(s.rms_eps > 0.0f) || !std::isfinite(s.rms_eps)) {
    return make_error(StatusCode::kInvalidArgument, "rms_eps must be > 0, got {}", s.rms_eps);
  }
  if (!(s.rope_base > 0.0f) || !std::isfinite(s.rope_base)) {
    return make_error(StatusCode::kInvalidArgument, "rope_base must be > 0, got {}", s.rope_base);
  }

  if (s.arch == MakeArch::kRegistry) {
    if (s.registry_arch.empty()) return make_error(StatusCode::kInvalidArgument, "registry arch without a name");
    if (s.head_dim <= 0 || s.head_dim % 2 != 0) {
      return make_error(StatusCode::kInvalidArgument, "head_dim {} must be positive and even (RoPE rotates pairs)",
                        s.head_dim);
    }
    // The arch file checks the rest exactly as a loader would (its read_hparams).
    MOESH_RETURN_IF_ERROR(registry_make_plan(s).status());
  }
  if (s.arch == MakeArch::kQwen3Moe || s.arch == MakeArch::kLlama) {
    if (s.n_head_kv <= 0 || s.n_head_kv > s.n_head || s.n_head % s.n_head_kv != 0) {
      return make_error(StatusCode::kInvalidArgument, "n_head_kv {} must divide n_head {} (GQA groups are whole)",
                        s.n_head_kv, s.n_head);
    }
    if (s.head_dim <= 0 || s.head_dim % 2 != 0) {
      return make_error(StatusCode::kInvalidArgument, "head_dim {} must be positive and even (RoPE rotates pairs)",
                        s.head_dim);
    }
  }
  if (s.arch == MakeArch::kLlama && s.n_ff != s.n_ff_exp) {
    return make_error(StatusCode::kInvalidArgument,
                      "llama (Mixtral) stores the expert width in feed_forward_length: n_ff {} "
                      "and n_ff_exp {} must be equal",
                      s.n_ff, s.n_ff_exp);
  }
  if (s.arch == MakeArch::kDeepseek2) {
    const Field mla[] = {{"q_lora_rank", s.q_lora_rank},
                         {"kv_lora_rank", s.kv_lora_rank},
                         {"qk_nope", s.qk_nope},
                         {"qk_rope", s.qk_rope},
                         {"v_head", s.v_head},
                         {"n_group", s.n_group},
                         {"n_group_used", s.n_group_used}};
    for (const auto& f : mla) {
      if (f.v <= 0 || f.v > kMaxU32) {
        return make_error(StatusCode::kInvalidArgument, "deepseek2: {} must be >= 1, got {}", f.name, f.v);
      }
    }
    if (s.qk_rope % 2 != 0) {
      return make_error(StatusCode::kInvalidArgument, "deepseek2: qk_rope {} must be even (RoPE rotates pairs)",
                        s.qk_rope);
    }
    if (s.n_expert_shared < 0) {
      return make_error(StatusCode::kInvalidArgument, "deepseek2: n_expert_shared must be >= 0");
    }
    if (s.n_leading_dense < 0 || s.n_leading_dense > s.n_layer) {
      return make_error(StatusCode::kInvalidArgument, "deepseek2: n_leading_dense {} must be in [0, n_layer {}]",
                        s.n_leading_dense, s.n_layer);
    }
    if (s.n_ff <= 0 || s.n_ff > kMaxU32) {
      return make_error(StatusCode::kInvalidArgument, "deepseek2: n_ff (dense FFN width) must be >= 1, got {}", s.n_ff);
    }
    if (s.n_expert % s.n_group != 0) {
      return make_error(StatusCode::kInvalidArgument, "deepseek2: n_group {} must divide n_expert {}", s.n_group,
                        s.n_expert);
    }
    if (s.n_group_used > s.n_group) {
      return make_error(StatusCode::kInvalidArgument, "deepseek2: n_group_used {} is larger than n_group {}",
                        s.n_group_used, s.n_group);
    }
    const int64_t reachable = s.n_expert / s.n_group * s.n_group_used;
    if (s.n_expert_used > reachable) {
      return make_error(StatusCode::kInvalidArgument,
                        "deepseek2: n_expert_used {} exceeds the {} experts in the {} kept groups", s.n_expert_used,
                        reachable, s.n_group_used);
    }
    if (s.gating_func < 1 || s.gating_func > 3) {
      return make_error(StatusCode::kInvalidArgument,
                        "deepseek2: gating_func must be 1 (softmax), 2 (sigmoid) or 3, got {}", s.gating_func);
    }
    if (s.yarn_factor > 1.0f && (s.yarn_orig_ctx <= 0 || s.yarn_orig_ctx > kMaxU32)) {
      return make_error(StatusCode::kInvalidArgument, "deepseek2: yarn_orig_ctx must be >= 1 when yarn_factor > 1");
    }
  }
  return validate_make_vocab(s);
}

}  // namespace detail

Status MakeModelSpec::validate() const {
  MOESH_RETURN_IF_ERROR(detail::validate_spec_fields(*this));
  if (type == MakeFileType::kQ8_0 || type == MakeFileType::kQ4_K_M) {
    // The most common mistake gets a message in terms of the spec.
    if (n_embd % quant::kQK != 0) {
      return make_error(StatusCode::kInvalidArgument,
                        "n_embd {} is not a multiple of {}, the smallest block size of {}", n_embd, quant::kQK,
                        make_file_type_name(type));
    }
  }
  for (const auto& t : detail::make_model_layout(*this)) {
    const bool wants_quant =
        make_model_tensor_type(MakeFileType::kQ8_0, t.name, t.n_dims, t.ne, n_layer, n_expert, 0, 1) != GgmlType::F32;
    const bool fell_to_f16 = wants_quant && t.type == GgmlType::F16 && type != MakeFileType::kF16;
    if (t.n_bytes == 0 || fell_to_f16) {
      return make_error(StatusCode::kInvalidArgument,
                        "tensor '{}' has rows of {} values (ne[0]); {} needs a multiple of {} "
                        "(the quant block size)",
                        t.name, t.ne[0], make_file_type_name(type), quant::kQK);
    }
  }
  return Status::ok();
}

Result<ModelPlan> plan_model(const MakeModelSpec& spec) {
  MOESH_RETURN_IF_ERROR(spec.validate());
  ModelPlan plan;
  plan.kvs = detail::make_model_kvs(spec);
  plan.tensors = detail::make_model_layout(spec);
  for (const auto& t : plan.tensors) {
    plan.data_bytes = t.offset + (t.n_bytes + kMakeModelAlignment - 1) / kMakeModelAlignment * kMakeModelAlignment;
  }
  return plan;
}

// ---------------------------------------------------------------- weights

namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace

void make_model_fill_rows(uint64_t seed, const PlannedTensor& t, int64_t row0, int64_t rows, float* out) {
  // One independent stream per (seed, tensor name, row): rows can be generated by any thread in
  // any order, and the same tensor gets the same values whatever the file type or tensor order.
  const uint64_t tensor_seed = splitmix64(seed ^ splitmix64(fnv1a64(t.name)));
  const int64_t n = t.ne[0];
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t r = 0; r < rows; ++r) {
    std::mt19937_64 rng(splitmix64(tensor_seed + static_cast<uint64_t>(row0 + r + 1) * 0xD1B54A32D192ED03ull));
    float* dst = out + r * n;
    // Box-Muller written out (std::normal_distribution's algorithm is implementation-defined).
    // u1 is in (0, 1] so the log is finite; u2 in [0, 1). 53-bit uniforms from the top bits.
    for (int64_t i = 0; i < n; i += 2) {
      const double u1 = static_cast<double>((rng() >> 11) + 1) * 0x1.0p-53;
      const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      const double rad = std::sqrt(-2.0 * std::log(u1));
      const double th = kTwoPi * u2;
      dst[i] = static_cast<float>(t.init.mean + t.init.std * (rad * std::cos(th)));
      if (i + 1 < n) dst[i + 1] = static_cast<float>(t.init.mean + t.init.std * (rad * std::sin(th)));
      if (t.init.dist != WeightInit::Dist::kNormal) {
        const double lo = t.init.lo, hi = t.init.hi;
        auto pick = [&](double u) {
          const double x = lo + (hi - lo) * u;
          return static_cast<float>(t.init.dist == WeightInit::Dist::kUniform ? x : std::log(std::expm1(x)));
        };
        dst[i] = pick(u2);
        if (i + 1 < n) dst[i + 1] = pick(u1 - 0x1.0p-53);  // [0, 1)
      }
    }
  }
}

// ---------------------------------------------------------------- GGUF header

namespace {

class ByteSink {
 public:
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  template <typename T>
  void pod(T v) {
    raw(&v, sizeof v);
  }  // the host is little-endian (x86-64 / arm64)
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    raw(s.data(), s.size());
  }
  std::vector<uint8_t> bytes;
};

Status put_value_payload(ByteSink& out, const gguf::Value& v) {
  using VT = gguf::ValueType;
  switch (v.type) {
    case VT::UINT8:
      out.pod<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.v)));
      break;
    case VT::INT8:
      out.pod<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.v)));
      break;
    case VT::UINT16:
      out.pod<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.v)));
      break;
    case VT::INT16:
      out.pod<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.v)));
      break;
    case VT::UINT32:
      out.pod<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.v)));
      break;
    case VT::INT32:
      out.pod<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.v)));
      break;
    case VT::FLOAT32:
      out.pod<float>(static_cast<float>(std::get<double>(v.v)));
      break;
    case VT::BOOL:
      out.pod<uint8_t>(std::get<bool>(v.v) ? 1 : 0);
      break;
    case VT::STRING:
      out.str(std::get<std::string>(v.v));
      break;
    case VT::UINT64:
      out.pod<uint64_t>(std::get<uint64_t>(v.v));
      break;
    case VT::INT64:
      out.pod<int64_t>(std::get<int64_t>(v.v));
      break;
    case VT::FLOAT64:
      out.pod<double>(std::get<double>(v.v));
      break;
    case VT::ARRAY: {
      const auto& a = std::get<gguf::Array>(v.v);
      out.pod<uint32_t>(static_cast<uint32_t>(a.elem_type));
      out.pod<uint64_t>(a.items.size());
      for (const auto& item : a.items) MOESH_RETURN_IF_ERROR(put_value_payload(out, item));
      break;
    }
    default:
      return make_error(StatusCode::kInternal, "make_model: cannot serialize value type {}",
                        static_cast<uint32_t>(v.type));
  }
  return Status::ok();
}

Result<std::vector<uint8_t>> serialize_header(const ModelPlan& plan) {
  ByteSink out;
  out.raw("GGUF", 4);
  out.pod<uint32_t>(3);
  out.pod<uint64_t>(plan.tensors.size());
  out.pod<uint64_t>(plan.kvs.size());
  for (const auto& [key, value] : plan.kvs) {
    out.str(key);
    out.pod<uint32_t>(static_cast<uint32_t>(value.type));
    MOESH_RETURN_IF_ERROR(put_value_payload(out, value));
  }
  for (const auto& t : plan.tensors) {
    out.str(t.name);
    out.pod<uint32_t>(static_cast<uint32_t>(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) out.pod<uint64_t>(static_cast<uint64_t>(t.ne[d]));
    out.pod<uint32_t>(static_cast<uint32_t>(t.type));
    out.pod<uint64_t>(t.offset);
  }
  while (out.bytes.size() % kMakeModelAlignment != 0) out.bytes.push_back(0);
  return std::move(out.bytes);
}

// Converts one generated f32 row into the tensor's storage type.
bool encode_row(GgmlType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return true;
    case GgmlType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return true;
    }
    default:
      return quant::quantize_row_ref(type, src, dst, n);
  }
}

class OutFile {
 public:
  ~OutFile() { close(); }
  bool open(const std::string& path) {
    f_ = std::fopen(path.c_str(), "wb");
    return f_ != nullptr;
  }
  bool write(const void* p, size_t n) { return n == 0 || std::fwrite(p, 1, n, f_) == n; }
  bool pad_to(uint64_t pos, uint64_t align) {
    static const uint8_t zeros[64] = {};
    const uint64_t pad = (align - pos % align) % align;
    return write(zeros, pad);
  }
  bool close() {
    if (!f_) return true;
    const bool ok = std::fflush(f_) == 0 && std::fclose(f_) == 0;
    f_ = nullptr;
    return ok;
  }

 private:
  std::FILE* f_ = nullptr;
};

constexpr size_t kChunkBytes = 16u << 20;  // encoded bytes buffered per write

}  // namespace

Status make_model(const MakeModelSpec& spec, const std::string& out_path) {
  return make_model(spec, out_path, MakeModelOptions{});
}

Status make_model(const MakeModelSpec& spec, const std::string& out_path, const MakeModelOptions& options) {
  MOESH_ASSIGN_OR_RETURN(ModelPlan plan, plan_model(spec));
  MOESH_ASSIGN_OR_RETURN(std::vector<uint8_t> header, serialize_header(plan));

  const std::string partial = out_path + ".partial";
  OutFile f;
  if (!f.open(partial)) {
    return make_error(StatusCode::kIoError, "cannot create '{}': {}", partial, std::strerror(errno));
  }
  auto io_error = [&](const char* what) {
    const Status st = make_error(StatusCode::kIoError, "writing '{}' ({}): {}", partial, what, std::strerror(errno));
    f.close();
    std::remove(partial.c_str());
    return st;
  };
  if (!f.write(header.data(), header.size())) return io_error("header");

  ThreadPool pool(options.n_threads);
  const auto t_start = std::chrono::steady_clock::now();
  std::vector<uint8_t> chunk;
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.n_threads()));
  uint64_t pos = 0;  // within the data section
  for (size_t ti = 0; ti < plan.tensors.size(); ++ti) {
    const PlannedTensor& t = plan.tensors[ti];
    if (pos != t.offset) {
      f.close();
      std::remove(partial.c_str());
      return make_error(StatusCode::kInternal, "tensor '{}' planned at {} but writer is at {}", t.name, t.offset, pos);
    }
    const int64_t ne0 = t.ne[0];
    const size_t row_bytes = type_row_bytes(t.type, ne0);
    const int64_t n_rows = t.n_rows();
    const int64_t rows_per_chunk =
        std::max<int64_t>(1, std::min<int64_t>(n_rows, static_cast<int64_t>(kChunkBytes / row_bytes)));
    chunk.resize(static_cast<size_t>(rows_per_chunk) * row_bytes);
    const int64_t grain = std::max<int64_t>(1, 16384 / ne0);
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
      const int64_t nr = std::min(rows_per_chunk, n_rows - r0);
      std::atomic<bool> encode_failed{false};
      pool.parallel_for(
          nr,
          [&](int64_t b, int64_t e, int thread) {
            auto& buf = scratch[static_cast<size_t>(thread)];
            buf.resize(static_cast<size_t>(ne0));
            for (int64_t r = b; r < e; ++r) {
              make_model_fill_rows(spec.seed, t, r0 + r, 1, buf.data());
              if (!encode_row(t.type, buf.data(), chunk.data() + static_cast<size_t>(r) * row_bytes, ne0)) {
                encode_failed = true;
              }
            }
          },
          grain);
      if (encode_failed) {
        f.close();
        std::remove(partial.c_str());
        return make_error(StatusCode::kInternal, "no quantizer for {} (tensor '{}')", type_name(t.type), t.name);
      }
      if (!f.write(chunk.data(), static_cast<size_t>(nr) * row_bytes)) return io_error(t.name.c_str());
    }
    pos += t.n_bytes;
    if (!f.pad_to(pos, kMakeModelAlignment)) return io_error("padding");
    pos = (pos + kMakeModelAlignment - 1) / kMakeModelAlignment * kMakeModelAlignment;
    if (options.on_progress) {
      MakeModelProgress p;
      p.tensor_index = ti;
      p.n_tensors = plan.tensors.size();
      p.tensor = &t;
      p.bytes_done = pos;
      p.bytes_total = plan.data_bytes;
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      options.on_progress(p);
    }
  }
  if (!f.close()) return io_error("close");
  if (std::rename(partial.c_str(), out_path.c_str()) != 0) {
    const Status st =
        make_error(StatusCode::kIoError, "renaming '{}' to '{}': {}", partial, out_path, std::strerror(errno));
    std::remove(partial.c_str());
    return st;
  }
  return Status::ok();
}

}  // namespace moesh
