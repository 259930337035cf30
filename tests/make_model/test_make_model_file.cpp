// make_model end to end: generate each arch x type into a temp dir, read it back with
// gguf::File and check it against the reference files, the planned init and the generator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "make_model/make_model_test_util.h"
#include "moesh/gguf/gguf.h"
#include "moesh/make_model/make_model.h"
#include "moesh/model/model.h"
#include "moesh/tensor/fp16.h"
#include "moesh/tensor/quant.h"

namespace moesh {
namespace {

namespace fs = std::filesystem;
using test::kArchCases;
using test::kFileTypes;

class MakeModelFile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("moesh_make_model_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static fs::path dir_;
};
fs::path MakeModelFile::dir_;

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool dequantize(GgmlType t, const uint8_t* src, float* dst, int64_t n) {
  if (t == GgmlType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return true;
  }
  if (t == GgmlType::F16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = fp16_to_fp32(h);
    }
    return true;
  }
  return quant::dequantize_row_ref(t, src, dst, n);
}

// RMS of (dequantized - generated) relative to the init std, by storage type.
double max_rel_rms_error(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 0.0;
    case GgmlType::F16:
      return 1e-3;
    case GgmlType::Q8_0:
      return 0.02;
    case GgmlType::Q6_K:
      return 0.05;
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q5_K:
      return 0.08;
    default:
      return 0.15;  // Q4_K
  }
}

// Reads every tensor back, dequantizes it and checks (1) mean and std against the planned init,
// (2) closeness to the generator's f32 values (so the file holds the seeded weights, quantized).
void check_tensor_data(const gguf::File& f, const ModelPlan& plan, uint64_t seed) {
  for (const auto& t : plan.tensors) {
    SCOPED_TRACE(t.name);
    const gguf::TensorInfo* info = f.find_tensor(t.name);
    ASSERT_NE(info, nullptr);
    const TensorView v = f.view(*info);
    ASSERT_TRUE(v.valid());
    const int64_t n0 = t.ne[0], rows = t.n_rows();
    std::vector<float> deq(static_cast<size_t>(n0)), gen(static_cast<size_t>(n0));
    double sum = 0, sum2 = 0, err2 = 0;
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(dequantize(t.type, v.data + r * v.row_bytes(), deq.data(), n0));
      make_model_fill_rows(seed, t, r, 1, gen.data());
      for (int64_t i = 0; i < n0; ++i) {
        sum += deq[i];
        sum2 += double(deq[i]) * deq[i];
        err2 += (double(deq[i]) - gen[i]) * (double(deq[i]) - gen[i]);
      }
    }
    const double n = double(n0) * double(rows);
    const double mean = sum / n;
    const double sd = std::sqrt(std::max(0.0, sum2 / n - mean * mean));
    // Small tensors (q/k norms of 64, exp_probs_b of 16) have noisier sample stds.
    const double tol = std::max(0.10, 3.0 / std::sqrt(2.0 * n));
    EXPECT_NEAR(sd, t.init.std, tol * t.init.std) << "n=" << n;
    EXPECT_NEAR(mean, t.init.mean, 4.0 * t.init.std / std::sqrt(n) + 0.02 * t.init.std);
    const double rel_rms = std::sqrt(err2 / n) / t.init.std;
    if (t.type == GgmlType::F32) {
      EXPECT_EQ(rel_rms, 0.0);
    } else {
      EXPECT_LE(rel_rms, max_rel_rms_error(t.type)) << type_name(t.type);
      EXPECT_GT(rel_rms, 0.0) << type_name(t.type) << " stored the f32 values unchanged?";
    }
  }
}

// Compares a generated file's metadata with the reference: same keys in the same order, same
// value types, same values except the free-text general.name/description (and file_type,
// which is ours to set).
void check_metadata(const gguf::File& f, const MakeModelSpec& spec, const std::string& ref_model) {
  const auto& manifest = test::reference_manifest();
  const auto& ref_meta = (*manifest)["models"][ref_model]["files"][test::manifest_file_key(spec.type)]["metadata"];
  // Value types come from the reference Q8_0 GGUF (F32 files are not shipped).
  auto ref_q8 = gguf::File::open(test::reference_dir() + "/" + ref_model + ".Q8_0.gguf");
  ASSERT_TRUE(ref_q8.is_ok()) << ref_q8.status().to_string();

  ASSERT_EQ(f.kvs().size(), ref_meta.size());
  size_t i = 0;
  for (const auto& [key, ref_value] : ref_meta.items()) {
    const auto& [our_key, our_value] = f.kvs()[i++];
    ASSERT_EQ(our_key, key);
    const gguf::Value* ref_typed = (*ref_q8)->find(key);
    ASSERT_NE(ref_typed, nullptr) << key;
    EXPECT_EQ(our_value.type, ref_typed->type)
        << key << ": " << gguf::value_type_name(our_value.type) << " vs " << gguf::value_type_name(ref_typed->type);
    if (key == "general.name" || key == "general.description") continue;
    if (key == "general.file_type") {
      EXPECT_EQ(std::get<uint64_t>(our_value.v), make_file_type_ftype(spec.type));
      continue;
    }
    switch (our_value.type) {
      case gguf::ValueType::UINT32:
        EXPECT_EQ(std::get<uint64_t>(our_value.v), ref_value.get<uint64_t>()) << key;
        break;
      case gguf::ValueType::FLOAT32:
        EXPECT_EQ(static_cast<float>(std::get<double>(our_value.v)), ref_value.get<float>()) << key;
        break;
      case gguf::ValueType::BOOL:
        EXPECT_EQ(std::get<bool>(our_value.v), ref_value.get<bool>()) << key;
        break;
      case gguf::ValueType::STRING:
        EXPECT_EQ(std::get<std::string>(our_value.v), ref_value.get<std::string>()) << key;
        break;
      default:
        ADD_FAILURE() << key << ": unexpected type " << gguf::value_type_name(our_value.type);
    }
  }
}

// make-model --arch for the registry's architectures: every type writes a file that loads and
// decodes, with finite logits, and one token at a time gives the batch's bits.
TEST_F(MakeModelFile, RegistryArchsLoadAndDecode) {
  const std::vector<std::string> names = make_arch_names();
  ASSERT_GT(names.size(), 3u);
  for (size_t i = 3; i < names.size(); ++i) {
    for (MakeFileType type : {MakeFileType::kF32, MakeFileType::kQ8_0, MakeFileType::kQ4_K_M}) {
      SCOPED_TRACE(names[i] + " " + make_file_type_name(type));
      MakeModelSpec spec;
      ASSERT_TRUE(MakeModelSpec::defaults_for_name(names[i], &spec));
      spec.type = type;
      const std::string out = path(names[i] + "." + make_file_type_name(type) + ".gguf");
      ASSERT_TRUE(make_model(spec, out).is_ok());
      auto m = Model::load(out);
      ASSERT_TRUE(m.is_ok()) << m.status().to_string();
      EXPECT_EQ((*m)->hparams().arch_name, names[i]);
      const int64_t V = (*m)->hparams().n_vocab;
      std::vector<int32_t> toks;
      for (int t = 0; t < 12; ++t) toks.push_back((t * 37 + 5) % static_cast<int32_t>(V));
      std::vector<float> batch(toks.size() * V), inc(toks.size() * V);
      {
        ContextParams cp;
        cp.n_threads = 2;
        Context ctx(**m, cp);
        ASSERT_TRUE(ctx.decode(0, toks.data(), static_cast<int64_t>(toks.size()), batch.data()).is_ok());
      }
      {
        ContextParams cp;
        cp.n_threads = 1;
        Context ctx(**m, cp);
        for (size_t t = 0; t < toks.size(); ++t) ASSERT_TRUE(ctx.decode(0, &toks[t], 1, inc.data() + t * V).is_ok());
      }
      for (float x : batch) ASSERT_TRUE(std::isfinite(x));
      EXPECT_EQ(std::memcmp(batch.data(), inc.data(), batch.size() * sizeof(float)), 0) << "incremental != batch";
    }
  }
}

TEST_F(MakeModelFile, EveryArchAndTypeReadsBackAndMatchesReference) {
  const bool have_ref = test::reference_manifest().has_value();
  if (!have_ref) {
    std::fprintf(stderr, "SKIPPED LOUDLY: no reference at %s; only self-consistency is checked\n",
                 test::reference_dir().c_str());
  }
  for (const auto& c : kArchCases) {
    for (MakeFileType type : kFileTypes) {
      SCOPED_TRACE(std::string(c.ref_model) + " " + make_file_type_name(type));
      MakeModelSpec spec = MakeModelSpec::defaults_for(c.arch);
      spec.type = type;
      spec.vocab = MakeVocab::kNone;  // the reference files have no vocabulary
      const std::string out = path(std::string(c.ref_model) + "." + make_file_type_name(type) + ".gguf");
      const Status st = make_model(spec, out);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_FALSE(fs::exists(out + ".partial"));

      auto plan = plan_model(spec);
      ASSERT_TRUE(plan.is_ok());
      auto f = gguf::File::open(out);
      ASSERT_TRUE(f.is_ok()) << f.status().to_string();
      const gguf::File& file = **f;
      EXPECT_EQ(file.version(), 3u);
      EXPECT_EQ(file.alignment(), kMakeModelAlignment);
      EXPECT_EQ(file.data_offset() % kMakeModelAlignment, 0u);
      EXPECT_EQ(file.size(), file.data_offset() + plan->data_bytes);

      ASSERT_EQ(file.tensors().size(), plan->tensors.size());
      for (size_t i = 0; i < plan->tensors.size(); ++i) {
        const auto& got = file.tensors()[i];
        const auto& want = plan->tensors[i];
        EXPECT_EQ(got.name, want.name);
        EXPECT_EQ(got.type, want.type) << got.name;
        EXPECT_EQ(got.n_dims, want.n_dims) << got.name;
        for (int d = 0; d < 4; ++d) EXPECT_EQ(got.ne[d], want.ne[d]) << got.name;
        EXPECT_EQ(got.offset, want.offset) << got.name;
      }
      EXPECT_EQ(file.get<std::string>("tokenizer.ggml.model").value(), "no_vocab");
      EXPECT_EQ(file.get<std::string>("general.architecture").value(), make_arch_name(c.arch));
      EXPECT_EQ(file.get<uint32_t>("general.file_type").value(), make_file_type_ftype(type));
      const bool quantized = type == MakeFileType::kQ8_0 || type == MakeFileType::kQ4_K_M;
      EXPECT_EQ(file.has("general.quantization_version"), quantized);

      if (have_ref) check_metadata(file, spec, c.ref_model);
      check_tensor_data(file, *plan, spec.seed);
    }
  }
  // Self-consistency passed; the comparison with llama.cpp's keys did not run: say so to ctest.
  if (!have_ref) GTEST_SKIP() << "reference metadata comparison not run (no " << test::reference_dir() << ")";
}

TEST_F(MakeModelFile, SameSeedSameBytesAcrossThreadCounts) {
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kDeepseek2);
  spec.type = MakeFileType::kQ4_K_M;
  MakeModelOptions one, two;
  one.n_threads = 1;
  two.n_threads = 2;
  ASSERT_TRUE(make_model(spec, path("a.gguf"), one).is_ok());
  ASSERT_TRUE(make_model(spec, path("b.gguf"), two).is_ok());
  spec.seed += 1;
  ASSERT_TRUE(make_model(spec, path("c.gguf"), two).is_ok());
  const auto a = read_all(path("a.gguf")), b = read_all(path("b.gguf")), c = read_all(path("c.gguf"));
  ASSERT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == b) << "same seed gave different bytes";
  ASSERT_EQ(a.size(), c.size());  // only the weights (and the seed in the description) change
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != c[i];
  EXPECT_GT(differing, a.size() / 2) << "a different seed changed only " << differing << " bytes";
}

TEST_F(MakeModelFile, ProgressIsReportedPerTensorAndBadSpecWritesNothing) {
  MakeModelSpec spec = MakeModelSpec::defaults_for(MakeArch::kLlama);
  spec.type = MakeFileType::kQ8_0;
  std::vector<size_t> seen;
  uint64_t last_done = 0, total = 0;
  MakeModelOptions opts;
  opts.on_progress = [&](const MakeModelProgress& p) {
    seen.push_back(p.tensor_index);
    EXPECT_GT(p.bytes_done, last_done);
    last_done = p.bytes_done;
    total = p.bytes_total;
  };
  ASSERT_TRUE(make_model(spec, path("p.gguf"), opts).is_ok());
  ASSERT_EQ(seen.size(), 23u);  // mixtral-s has 23 tensors
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(last_done, total);

  spec.n_expert_used = 99;
  const Status st = make_model(spec, path("bad.gguf"));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(path("bad.gguf")));
  EXPECT_FALSE(fs::exists(path("bad.gguf.partial")));

  const Status io = make_model(MakeModelSpec::defaults_for(MakeArch::kQwen3Moe), path("no/such/dir/x.gguf"));
  EXPECT_EQ(io.code(), StatusCode::kIoError);
}

// The generator itself: deterministic, row-independent, and standard-normal-shaped.
TEST(MakeModelWeights, GeneratorIsSeededPerRowAndNormal) {
  PlannedTensor t;
  t.name = "blk.0.ffn_up_exps.weight";
  t.n_dims = 2;
  t.ne[0] = 1000;
  t.ne[1] = 200;
  t.init = {0.0f, 1.0f};
  std::vector<float> all(200 * 1000), row(1000);
  make_model_fill_rows(7, t, 0, 200, all.data());
  make_model_fill_rows(7, t, 137, 1, row.data());
  EXPECT_TRUE(std::equal(row.begin(), row.end(), all.begin() + 137 * 1000));
  make_model_fill_rows(8, t, 137, 1, row.data());
  EXPECT_FALSE(std::equal(row.begin(), row.end(), all.begin() + 137 * 1000));
  PlannedTensor other = t;
  other.name = "blk.0.ffn_gate_exps.weight";
  make_model_fill_rows(7, other, 137, 1, row.data());
  EXPECT_FALSE(std::equal(row.begin(), row.end(), all.begin() + 137 * 1000));

  double s1 = 0, s2 = 0, s4 = 0;
  int64_t beyond3 = 0;
  for (float x : all) {
    s1 += x;
    s2 += double(x) * x;
    s4 += double(x) * x * x * x;
    beyond3 += std::fabs(x) > 3.0f;
  }
  const double n = double(all.size());
  EXPECT_NEAR(s1 / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  EXPECT_NEAR(s4 / n, 3.0, 0.06);                    // kurtosis of a normal
  EXPECT_NEAR(double(beyond3) / n, 0.0027, 0.0006);  // two-sided 3-sigma tail
}

}  // namespace
}  // namespace moesh
