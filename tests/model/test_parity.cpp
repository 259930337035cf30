// Parity with llama.cpp on the reference models (../shared/reference, README §5-7):
//  * argmax equal at every position; cosine per position >= 0.9999 (Q8_0) / 0.999 (Q4_K_M);
//  * hidden state after every layer (seq16) bit-identical for files made on the AVX-512 host, else
//    within 1e-5 of the reference (tolerance_for: the AVX2-made archs2/ files);
//  * expert selection per MoE layer equal to routing.selected (as sets; in order where the
//    reference weights of adjacent ranks are clearly apart, for softmax gating), and their
//    mixing weights bit-identical / within 5e-6 (tolerance_for);
//  * one token at a time through the KV cache == batch decode, bit for bit;
//  * dequant-f32 engine mode vs *.dequant-f32.logits.json: max abs diff <= 3e-5;
//  * logits bit-identical with 1 and 2 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "reference.h"

namespace moesh {
namespace {

using testing::RecordingObserver;
using testing::RefSequence;

struct RefFile {
  std::string gguf;
  std::vector<RefSequence> seqs;
  std::vector<RefSequence> dequant_seqs;
};

// Parsing is the slow part; each file is parsed once per test binary.
const RefFile& ref_file(const std::string& gguf) {
  static std::map<std::string, RefFile> cache;
  auto it = cache.find(gguf);
  if (it != cache.end()) return it->second;
  RefFile r;
  r.gguf = gguf;
  const std::string base = testing::reference_dir() + "/" + gguf.substr(0, gguf.size() - 5);
  r.seqs = testing::parse_sequences(testing::load_json(base + ".logits.json"));
  r.dequant_seqs = testing::parse_sequences(testing::load_json(base + ".dequant-f32.logits.json"));
  return cache.emplace(gguf, std::move(r)).first->second;
}

// minimax-m3: llama.cpp made its references with flash attention on (archs2 README §1), which in
// the dense blocks casts K/V to F16 and picks its kernel by batch size: batches under 64 tokens
// (seq16) accumulate V in F16, batches of 64 (seq64) run in F32. moesh follows the F32 kernel and
// is batch-invariant; the references are compared in LoadOptions::llama_fa_batches mode, which
// also picks by batch size, and batch == incremental is checked without it. Observed without the
// mode: seq64 identical (Q8_0 max abs diff 5e-9), seq16 within 0.11 with the argmax differing at
// two Q4_K_M positions whose reference top-2 gaps are 0.013 and 0.003.
bool llama_fa_batches(const std::string& gguf) {
  return gguf.find("minimaxm3") != std::string::npos;
}

std::unique_ptr<Model> load_model(const std::string& gguf, bool dequant, bool llama_fa = false) {
  LoadOptions o;
  o.dequant_f32 = dequant;
  o.llama_fa_batches = llama_fa;
  auto m = Model::load(testing::reference_dir() + "/" + gguf, o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m ? std::move(*m) : nullptr;
}

std::vector<float> decode_batch(const Model& m, const std::vector<int32_t>& toks, int n_threads,
                                ForwardObserver* obs = nullptr) {
  ContextParams cp;
  cp.n_threads = n_threads;
  Context ctx(m, cp);
  ctx.set_observer(obs);
  std::vector<float> logits(toks.size() * m.hparams().n_vocab);
  Status st = ctx.decode(0, toks.data(), static_cast<int64_t>(toks.size()), logits.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return logits;
}

// Mixing weights are compared exactly on Q8_0 / MXFP4 files: the router's F32 products follow
// llama.cpp's batch order (tinyBLAS, src/model/layers.cpp router_logits) and RoPE its compiled
// fused multiply-adds (src/tensor/ops.cpp rope), so the weights and, through them, the whole
// residual stream are bit-identical. Q4_K_M files: weights within 5e-6.
struct Tolerance {
  double weight = 5e-6;  // mixing weights
  double hidden = 1e-5;  // residual stream after each layer (seq16)
  // > 0: at a position whose reference top-2 gap is below this, the argmax may be another token
  // whose reference logit is within this of the top (a near-tie); 0: argmax equal everywhere.
  double argmax_gap = 0.0;
};
Tolerance tolerance_for(const std::string& file) {
  Tolerance t;
  if (file.find("Q8_0") != std::string::npos || file.find("MXFP4") != std::string::npos) t.weight = 0.0;
  // These files are bit-identical (hidden states after every layer, mixing weights) since Q6_K
  // and MXFP4 follow ggml's x86 orders (docs/architectures.md, "Q6_K's -32 offset") and
  // ggml_vec_dot_f32's leftovers its compiled order (tensor/quant_impl.h dot_f32_ggml_tail: what
  // deepseek2-s.Q4_K_M's seq64 and qwen3next-a.Q4_K_M's 32-wide delta-rule dots drifted by
  // until 2026-12-06); any change to a quantized or F32 dot's order shows here first.
  for (const char* exact :
       {"qwen3moe-s.Q4_K_M.gguf", "mixtral-s.Q4_K_M.gguf", "deepseek2-s.Q4_K_M.gguf", "archs/glm4moe-a.Q4_K_M.gguf",
        "archs/llama4-a.Q4_K_M.gguf", "archs/minimaxm2-a.Q4_K_M.gguf", "archs/qwen35moe-a.Q4_K_M.gguf",
        "archs/qwen3next-a.Q4_K_M.gguf", "archs/gptoss-a.MXFP4_MOE.gguf"}) {
    if (file == exact) t.weight = 0.0, t.hidden = 0.0;
  }
  // So is every Q8_0 file made on the AVX-512 host (all but archs2/).
  if (file.find("Q8_0") != std::string::npos && !file.starts_with("archs2/")) t.hidden = 0.0;
  // archs2/ was made on an AVX2 host (its README §1): llama.cpp's F32 orders there (router,
  // KQ, softmax, SiLU's vector exp) differ from the AVX-512 ones moesh follows in the last bits,
  // so weights are within ulps, and a Q8_K rounding step can flip at one position of a Q4_K_M
  // file (step35-a.Q4_K_M seq16 position 5: weights 2.5e-5, logits 0.027; the rest ~1e-6).
  // Observed: step35-a.Q8_0 4.8e-7 (logits identical to 4 digits), step35-a.Q4_K_M 2.5e-5.
  if (file.starts_with("archs2/")) t.weight = file.find("Q4_K_M") != std::string::npos ? 2.5e-4 : 5e-6;
  // kimi-k3's KDA follows ggml's AVX2 build (layers_deltanet.cpp), its MLA attention the AVX-512
  // one (KQ over 160, softmax) like deepseek2's, and kimi-k3 grows those ulps (reference README
  // §6: native vs dequant-f32 0.24-0.42). Observed: seq16 of both files bit-identical (hidden
  // states after every layer, logits); seq64 Q4_K_M logits 0.012 (min cosine 0.999996), weights
  // 2.4e-7; seq64 Q8_0 logits 0.064 (min cosine 0.99994), weights 8.5e-6; argmax equal everywhere.
  if (file == "archs2/kimik3-a.Q8_0.gguf") t.weight = 2.5e-5;
  // minimaxm3-a.Q4_K_M seq64 drifts from position 4 on (weights 5.6e-3, logits 0.066, min cosine
  // 0.99990, argmax equal): an activation-quantization rounding step flips upstream; its seq16
  // and the Q8_0 file agree to 2.4e-7.
  if (file == "archs2/minimaxm3-a.Q4_K_M.gguf") t.weight = 7.5e-3;
  return t;
}

class Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam().empty()) {
      GTEST_SKIP() << "\n\n*** reference folder " << testing::reference_dir()
                   << " not found: llama.cpp parity NOT checked ***\n";
    }
  }
  bool is_q8() const { return GetParam().find("Q8_0") != std::string::npos; }
};

TEST_P(Parity, LogitsRoutingAndIncremental) {
  const RefFile& ref = ref_file(GetParam());
  ASSERT_EQ(ref.seqs.size(), 2u) << "could not parse the reference JSON of " << GetParam();
  auto model = load_model(GetParam(), false);
  ASSERT_NE(model, nullptr);
  std::unique_ptr<Model> ref_mode;  // llama.cpp's batch-dependent attention (llama_fa_batches)
  if (llama_fa_batches(GetParam())) {
    ref_mode = load_model(GetParam(), false, true);
    ASSERT_NE(ref_mode, nullptr);
  }
  const HParams& hp = model->hparams();
  const int64_t V = hp.n_vocab;
  const Tolerance tol = tolerance_for(GetParam());
  const bool q8_like = is_q8() || GetParam().find("MXFP4") != std::string::npos;
  const double min_cos = q8_like ? 0.9999 : 0.999;

  for (const RefSequence& seq : ref.seqs) {
    SCOPED_TRACE(GetParam() + " " + seq.name);
    const int64_t T = static_cast<int64_t>(seq.tokens.size());
    RecordingObserver obs;
    std::vector<float> logits = decode_batch(ref_mode ? *ref_mode : *model, seq.tokens, 2, &obs);
    ASSERT_EQ(static_cast<int64_t>(seq.logits.size()), T);

    // Non-degenerate data: the reference rows vary.
    std::set<int32_t> distinct(seq.argmax.begin(), seq.argmax.end());
    ASSERT_GT(distinct.size(), static_cast<size_t>(T / 2));

    // Hidden states after every layer (seq16 carries them): bounded, and the drifting positions
    // printed (archs2/ files only since the AVX-512-made ones are bit-identical).
    const double kMaxHiddenDiff = tol.hidden;
    if (!seq.hidden.empty()) {
      ASSERT_EQ(obs.layer_out.size(), seq.hidden.size());
    }
    for (size_t l = 0; l < seq.hidden.size() && l < obs.layer_out.size(); ++l) {
      double mx = 0;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < hp.n_embd; ++d) {
          mx = std::max(mx, static_cast<double>(std::fabs(obs.layer_out[l][t * hp.n_embd + d] - seq.hidden[l][t][d])));
        }
      }
      EXPECT_LE(mx, kMaxHiddenDiff) << "layer " << l << " hidden state";
      std::printf("  %s %s layer %zu hidden max abs diff %.3g", GetParam().c_str(), seq.name.c_str(), l, mx);
      // Which positions drifted (the first one is where to look); MOESH_PARITY_VERBOSE lists
      // every position that is not bit-identical.
      const double thr = std::getenv("MOESH_PARITY_VERBOSE") != nullptr ? 0.0 : 1e-5;
      if (mx > thr) {
        std::printf(" at positions");
        for (int64_t t = 0; t < T; ++t) {
          double m = 0;
          for (int64_t d = 0; d < hp.n_embd; ++d) {
            m = std::max(m, static_cast<double>(std::fabs(obs.layer_out[l][t * hp.n_embd + d] - seq.hidden[l][t][d])));
          }
          if (m > thr) std::printf(" %lld(%.2g)", static_cast<long long>(t), m);
        }
      }
      std::printf("\n");
    }

    double worst_cos = 1.0, max_abs = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = logits.data() + t * V;
      const int32_t am = testing::argmax_of(row, V);
      if (tol.argmax_gap > 0.0 && am != seq.argmax[t]) {
        const std::vector<float>& r = seq.logits[t];
        EXPECT_LE(r[seq.argmax[t]] - r[am], tol.argmax_gap) << "position " << t << ": not a near-tie";
      } else {
        EXPECT_EQ(am, seq.argmax[t]) << "position " << t;
      }
      const double c = testing::cosine(row, seq.logits[t].data(), V);
      worst_cos = std::min(worst_cos, c);
      EXPECT_GE(c, min_cos) << "position " << t;
      for (int64_t i = 0; i < V; ++i) {
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(row[i] - seq.logits[t][i])));
      }
    }
    std::printf("  %s %s: min cosine %.7f, max abs diff %.4f\n", GetParam().c_str(), seq.name.c_str(), worst_cos,
                max_abs);

    // Expert selection per MoE layer.
    ASSERT_EQ(obs.routing.size(), seq.routing.size());
    // Mixing weights of the selected experts (bounds: tolerance_for).
    const double kMaxWeightDiff = tol.weight;
    double max_w_diff = 0.0;
    for (size_t r = 0; r < seq.routing.size(); ++r) {
      const auto& want = seq.routing[r];
      const auto& got = obs.routing[r];
      ASSERT_EQ(got.layer, want.layer);
      const int k = got.k;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> g(got.ids.begin() + t * k, got.ids.begin() + (t + 1) * k);
        const std::vector<int32_t>& w = want.selected[t];
        std::set<int32_t> gs(g.begin(), g.end()), ws(w.begin(), w.end());
        EXPECT_EQ(gs, ws) << "layer " << want.layer << " token " << t;
        if (gs != ws) continue;
        for (int j = 0; j < k; ++j) {
          // Mixing weight of each selected expert.
          const int pos = static_cast<int>(std::find(g.begin(), g.end(), w[j]) - g.begin());
          max_w_diff =
              std::max(max_w_diff, static_cast<double>(std::fabs(got.weights[t * k + pos] - want.weights[t][j])));
          EXPECT_NEAR(got.weights[t * k + pos], want.weights[t][j], kMaxWeightDiff)
              << "layer " << want.layer << " token " << t << " expert " << w[j];
          // Order: where the reference weights are clearly apart (softmax: weight order =
          // selection order).
          if (hp.gating == GatingFunc::kSoftmax && j + 1 < k && want.weights[t][j] - want.weights[t][j + 1] > 1e-3) {
            EXPECT_EQ(g[j], w[j]) << "rank " << j << " layer " << want.layer << " token " << t;
          }
        }
      }
    }

    std::printf("  %s %s: routing weights max abs diff %.3g\n", GetParam().c_str(), seq.name.c_str(), max_w_diff);

    // One token at a time through the KV cache: bit-identical to the batch.
    if (ref_mode) logits = decode_batch(*model, seq.tokens, 2);
    {
      ContextParams cp;
      cp.n_threads = 2;
      Context ctx(*model, cp);
      std::vector<float> inc(T * V);
      for (int64_t t = 0; t < T; ++t) {
        Status st = ctx.decode(0, &seq.tokens[t], 1, inc.data() + t * V);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
      }
      EXPECT_EQ(std::memcmp(inc.data(), logits.data(), inc.size() * sizeof(float)), 0)
          << "incremental decode differs from batch decode";
    }
    // Rollback: decode a prefix, then junk tokens, drop them, continue: same bits as the batch.
    if (T >= 8) {
      ContextParams cp;
      cp.n_threads = 2;
      Context ctx(*model, cp);
      const int64_t n0 = T / 2;
      std::vector<float> tail((T - n0) * V);
      ASSERT_TRUE(ctx.decode(0, seq.tokens.data(), n0, nullptr).is_ok());
      const std::vector<int32_t> junk = {1, 2, 3};
      ASSERT_TRUE(ctx.decode(0, junk.data(), 3, nullptr).is_ok());
      ASSERT_TRUE(ctx.state().truncate(0, n0).is_ok());
      ASSERT_TRUE(ctx.decode(0, seq.tokens.data() + n0, T - n0, tail.data()).is_ok());
      EXPECT_EQ(std::memcmp(tail.data(), logits.data() + n0 * V, tail.size() * sizeof(float)), 0)
          << "decode after rollback differs";
    }
  }
}

TEST_P(Parity, DequantF32Mode) {
  const RefFile& ref = ref_file(GetParam());
  ASSERT_EQ(ref.dequant_seqs.size(), 2u) << "no dequant-f32 reference for " << GetParam();
  auto model = load_model(GetParam(), true, llama_fa_batches(GetParam()));
  ASSERT_NE(model, nullptr);
  const int64_t V = model->hparams().n_vocab;
  for (const RefSequence& seq : ref.dequant_seqs) {
    SCOPED_TRACE(GetParam() + " " + seq.name);
    std::vector<float> logits = decode_batch(*model, seq.tokens, 2);
    double max_abs = 0.0;
    for (size_t t = 0; t < seq.tokens.size(); ++t) {
      EXPECT_EQ(testing::argmax_of(logits.data() + t * V, V), seq.argmax[t]) << "position " << t;
      for (int64_t i = 0; i < V; ++i) {
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(logits[t * V + i] - seq.logits[t][i])));
      }
    }
    std::printf("  %s %s dequant-f32: max abs diff %.3g\n", GetParam().c_str(), seq.name.c_str(), max_abs);
    // Observed max abs diff over all files and sequences: 2.98e-06 (deepseek2-s.Q8_0 seq64);
    // the bound is 10x that (reference README §7 expects ~1e-4 from an F32 engine). minimax-m3:
    // seq64 4.8e-5, seq16 (llama_fa_batches' F16 kernel) 4.9e-4 while its native files agree to
    // 1.2e-6: the F16-accumulating kernel magnifies F32 order differences of the dequantized run.
    EXPECT_LE(max_abs, llama_fa_batches(GetParam()) ? 5e-4 : 3e-5);
  }
}

TEST_P(Parity, ThreadCountDoesNotChangeBits) {
  const RefFile& ref = ref_file(GetParam());
  ASSERT_FALSE(ref.seqs.empty());
  auto model = load_model(GetParam(), false);
  ASSERT_NE(model, nullptr);
  const auto& toks = ref.seqs.back().tokens;  // seq64
  std::vector<float> a = decode_batch(*model, toks, 1);
  std::vector<float> b = decode_batch(*model, toks, 2);
  std::vector<float> c = decode_batch(*model, toks, 3);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
}

// Reference files of architectures this build does not run yet are left to
// test_parity_pending.cpp, which reports them as Skipped.
std::vector<std::string> params() {
  std::vector<std::string> m;
  for (const std::string& f : testing::reference_models()) {
    if (testing::unsupported_reference_arch(f).empty()) m.push_back(f);
  }
  if (m.empty()) m.push_back("");  // one loud skip
  return m;
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  if (info.param.empty()) return "reference_missing";
  std::string s = info.param.substr(0, info.param.size() - 5);
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Reference, Parity, ::testing::ValuesIn(params()), param_name);

}  // namespace
}  // namespace moesh
