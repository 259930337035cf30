// Model identity and slice files: identity agreement between a model and its slices, slab
// round trips, and hash verification.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "moesh/model/model.h"
#include "moesh/swarm/swarm.h"
#include "swarm/swarm_test_util.h"

namespace moesh::swarm {
namespace {

using testing::small_model;
using testing::temp_dir;

std::unique_ptr<gguf::File> open_file(const std::string& path) {
  auto f = gguf::File::open(path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f.is_ok() ? std::move(*f) : nullptr;
}

ExpertSet spec_of(const gguf::File& f, const std::string& spec) {
  auto shape = model_shape(f);
  EXPECT_TRUE(shape.is_ok()) << shape.status().to_string();
  auto s = parse_expert_spec(spec, *shape);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return *s;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(ModelIdentity, SameForModelAndSlicesDifferentForOtherSeed) {
  const std::string a = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 11);
  const std::string b = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 12);
  auto fa = open_file(a), fb = open_file(b);
  const ModelIdentity ia = *model_identity(*fa), ib = *model_identity(*fb);
  EXPECT_NE(ia, ib) << "seed changes the metadata? identity " << ia.hex();
  // The identity must not be degenerate: 16 bytes, not all zero.
  EXPECT_NE(ia.hex(), std::string(32, '0'));

  const std::string es = temp_dir() + "/id-experts.gguf", bs = temp_dir() + "/id-backbone.gguf";
  ASSERT_TRUE(write_expert_slice(*fa, spec_of(*fa, "0:1-2,1:7"), es).is_ok());
  ASSERT_TRUE(write_backbone_slice(*fa, bs).is_ok());
  auto fe = open_file(es), fbk = open_file(bs);
  EXPECT_EQ(*model_identity(*fe), ia);
  EXPECT_EQ(*model_identity(*fbk), ia);
  // The slices' own tables differ, so the stored value (not a recomputed one) is what agrees.
  EXPECT_NE(compute_model_identity(*fe), ia);
  EXPECT_NE(compute_model_identity(*fbk), ia);
  EXPECT_EQ(slice_kind(*fe), kKindExperts);
  EXPECT_EQ(slice_kind(*fbk), kKindBackbone);
  EXPECT_EQ(slice_kind(*fa), "");

  // HELLO values agree between a worker on the slice and a backbone on the backbone slice.
  auto shape_e = model_shape(*fe), shape_b = model_shape(*fbk), shape_a = model_shape(*fa);
  ASSERT_TRUE(shape_e.is_ok() && shape_b.is_ok() && shape_a.is_ok());
  EXPECT_EQ(shape_e->moe_layers, shape_a->moe_layers);
  EXPECT_EQ(shape_b->moe_layers, shape_a->moe_layers);
  const wire::Hello hw = make_hello(wire::PeerRole::kWorker, ia, *shape_e, spec_of(*fa, "0:1-2,1:7"), "w");
  const wire::Hello hb = make_hello(wire::PeerRole::kBackbone, *model_identity(*fbk), *shape_b, {}, "b");
  auto sess = wire::negotiate(hb, hw);
  ASSERT_TRUE(sess.is_ok()) << sess.status().to_string();
  EXPECT_EQ(sess->dtypes, kAllDTypes);
  EXPECT_EQ(sess->modes, kAllModes);
  const wire::Hello other = make_hello(wire::PeerRole::kWorker, ib, *shape_a, {}, "x");
  EXPECT_FALSE(wire::negotiate(hb, other).is_ok());
}

TEST(ModelIdentity, DifferentArchitecturesAndTypesDiffer) {
  auto q8 = open_file(small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 11));
  auto f32 = open_file(small_model(MakeArch::kQwen3Moe, MakeFileType::kF32, 11));
  auto ds = open_file(small_model(MakeArch::kDeepseek2, MakeFileType::kQ8_0, 11));
  EXPECT_NE(*model_identity(*q8), *model_identity(*f32));
  EXPECT_NE(*model_identity(*q8), *model_identity(*ds));
}

// Every held slab of the slice is byte-equal to the full model's slab, for a spec with partial
// ranges, a single expert and a whole layer.
void check_round_trip(MakeArch arch, const std::string& spec_text) {
  const std::string path = small_model(arch, MakeFileType::kQ8_0, 21);
  auto full = open_file(path);
  const ExpertSet spec = spec_of(*full, spec_text);
  const std::string out = temp_dir() + "/rt-" + make_arch_name(arch) + ".gguf";
  Status st = write_expert_slice(*full, spec, out);
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  auto slice = ExpertStore::open(open_file(out), ExpertSet{});
  ASSERT_TRUE(slice.is_ok()) << slice.status().to_string();
  EXPECT_EQ((*slice)->held(), spec);
  auto ref = ExpertStore::open(open_file(path), spec);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  EXPECT_EQ((*slice)->slab_bytes(), (*ref)->slab_bytes());
  EXPECT_GT((*slice)->slab_bytes(), 0u);

  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const std::vector<ExpertWeights> layers = (*model)->expert_weights();
  uint64_t n_checked = 0;
  for (uint32_t l = 0; l < layers.size(); ++l) {
    for (uint32_t e = 0; e < 8; ++e) {
      const ExpertStore::Slot s = (*slice)->find(l, e);
      ASSERT_EQ(s.weights != nullptr, spec.holds(l, e)) << "layer " << l << " expert " << e;
      if (s.weights == nullptr) continue;
      const ExpertWeights& w = layers[l];
      ASSERT_TRUE(w.valid());
      const TensorView a[3] = {w.gate.expert(e), w.up.expert(e), w.down.expert(e)};
      const TensorView b[3] = {s.weights->gate.expert(s.index), s.weights->up.expert(s.index),
                               s.weights->down.expert(s.index)};
      for (int t = 0; t < 3; ++t) {
        ASSERT_EQ(a[t].type, b[t].type);
        ASSERT_EQ(expert_slab_bytes(w.gate), expert_slab_bytes(s.weights->gate));
        const size_t n = t == 0   ? expert_slab_bytes(w.gate)
                         : t == 1 ? expert_slab_bytes(w.up)
                                  : expert_slab_bytes(w.down);
        EXPECT_EQ(std::memcmp(a[t].data, b[t].data, n), 0) << "layer " << l << " expert " << e;
        ++n_checked;
      }
    }
  }
  EXPECT_EQ(n_checked, 3 * spec.n_pairs());
  // Slabs of different experts differ (the comparison above is not trivially true).
  const ExpertWeights& w0 = layers[spec.ranges[0].layer];
  EXPECT_NE(std::memcmp(w0.gate.expert(0).data, w0.gate.expert(1).data, expert_slab_bytes(w0.gate)), 0);
}

TEST(Slice, RoundTripQwen) {
  check_round_trip(MakeArch::kQwen3Moe, "0:1-3,0:6,1:*");
}
TEST(Slice, RoundTripDeepseekWithDenseLayer) {
  check_round_trip(MakeArch::kDeepseek2, "*:2-5,2:7");
}

TEST(Slice, SliceOfASliceAndUnheldRequests) {
  const std::string path = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 21);
  auto full = open_file(path);
  const std::string s1 = temp_dir() + "/s1.gguf", s2 = temp_dir() + "/s2.gguf";
  ASSERT_TRUE(write_expert_slice(*full, spec_of(*full, "0:0-3,0:5-6,1:2"), s1).is_ok());
  auto f1 = open_file(s1);
  // A range straddling the gap is rejected; a subset is written.
  EXPECT_FALSE(write_expert_slice(*f1, spec_of(*full, "0:3-5"), s2).is_ok());
  ASSERT_TRUE(write_expert_slice(*f1, spec_of(*full, "0:2-3,0:5"), s2).is_ok());
  auto st2 = ExpertStore::open(open_file(s2), ExpertSet{});
  ASSERT_TRUE(st2.is_ok()) << st2.status().to_string();
  EXPECT_EQ((*st2)->held().to_string(), "0:2-3,0:5");
  EXPECT_EQ(*model_identity((*st2)->file()), *model_identity(*full));
  auto ref = ExpertStore::open(open_file(path), ExpertSet{});
  ASSERT_TRUE(ref.is_ok());
  const ExpertStore::Slot a = (*st2)->find(0, 5), b = (*ref)->find(0, 5);
  ASSERT_NE(a.weights, nullptr);
  EXPECT_EQ(std::memcmp(a.weights->down.expert(a.index).data, b.weights->down.expert(b.index).data,
                        expert_slab_bytes(b.weights->down)),
            0);
  // Asking a slice for experts it lacks names the first missing one.
  auto miss = ExpertStore::open(open_file(s2), spec_of(*full, "0:2-4"));
  ASSERT_FALSE(miss.is_ok());
  EXPECT_EQ(miss.status().code(), StatusCode::kNotFound);
  EXPECT_NE(miss.status().message().find("layer 0 expert 4"), std::string::npos) << miss.status().message();
}

// Backbone and span slices carry a hash per non-expert tensor (attention, norms, router, shared
// experts): a flipped byte there is refused naming the tensor; a slice cut before the hashes
// existed says so (kNotFound: the CLI warns and runs unverified); full models and expert slices
// have nothing to check.
TEST(Slice, NonExpertTensorsOfBackboneAndSpanSlicesAreHashed) {
  const std::string path = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 23);
  auto full = open_file(path);
  int n = -1;
  EXPECT_TRUE(verify_slice_tensors(*full, &n).is_ok());
  EXPECT_EQ(n, 0);
  const std::string es = temp_dir() + "/th-experts.gguf", bs = temp_dir() + "/th-backbone.gguf",
                    ss = temp_dir() + "/th-span.gguf";
  ASSERT_TRUE(write_expert_slice(*full, spec_of(*full, "0:0-3"), es).is_ok());
  ASSERT_TRUE(write_backbone_slice(*full, bs).is_ok());
  ASSERT_TRUE(write_span_slice(*full, 1, 1, ss).is_ok());
  EXPECT_TRUE(verify_slice_tensors(*open_file(es), &n).is_ok());
  EXPECT_EQ(n, 0);
  for (const std::string& out : {bs, ss}) {
    auto clean = open_file(out);
    int n_plain = 0;
    for (const auto& t : clean->tensors()) n_plain += (t.name.find("_exps") == std::string::npos) ? 1 : 0;
    ASSERT_TRUE(verify_slice_tensors(*clean, &n).is_ok()) << out;
    EXPECT_EQ(n, n_plain) << out;
    EXPECT_GT(n, 3) << out;
    // One bit of an attention matrix.
    const std::string victim = out == bs ? "blk.0.attn_q.weight" : "blk.1.attn_q.weight";
    const gguf::TensorInfo* ti = clean->find_tensor(victim);
    ASSERT_NE(ti, nullptr) << victim;
    std::vector<uint8_t> bytes = read_all(out);
    bytes[clean->data_offset() + ti->offset + ti->n_bytes / 2] ^= 0x04;
    auto damaged = gguf::File::from_bytes(bytes);
    ASSERT_TRUE(damaged.is_ok());
    const Status st = verify_slice_tensors(**damaged, &n);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.to_string();
    EXPECT_NE(st.message().find(victim), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("fails its hash"), std::string::npos) << st.message();
  }
  // A slice from before the tensor hashes: the same file without them.
  {
    auto clean = open_file(ss);
    gguf::Writer w;
    for (const auto& [k, v] : clean->kvs()) {
      if (!k.starts_with(kKeyTensorHashPrefix)) w.set(k, v);
    }
    for (const auto& t : clean->tensors()) {
      const TensorView v = clean->view(t);
      ASSERT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(v.ne, v.ne + t.n_dims), v.data).is_ok());
    }
    const std::string old = temp_dir() + "/th-span-old.gguf";
    ASSERT_TRUE(w.write_file(old).is_ok());
    const Status st = verify_slice_tensors(*open_file(old), &n);
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
    EXPECT_NE(st.message().find("re-cut"), std::string::npos) << st.message();
  }
}

TEST(Slice, FlippedByteIsDetectedOnlyInHeldSlabs) {
  const std::string path = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 21);
  auto full = open_file(path);
  const std::string out = temp_dir() + "/flip.gguf";
  ASSERT_TRUE(write_expert_slice(*full, spec_of(*full, "1:0-7"), out).is_ok());
  auto clean = open_file(out);
  const gguf::TensorInfo* ti = clean->find_tensor("blk.1.ffn_up_exps.weight@0-7");
  ASSERT_NE(ti, nullptr);
  const size_t slab = ti->n_bytes / 8;
  // Flip one bit in the middle of expert 6's up slab.
  std::vector<uint8_t> bytes = read_all(out);
  const size_t at = clean->data_offset() + ti->offset + 6 * slab + slab / 2;
  ASSERT_LT(at, bytes.size());
  bytes[at] ^= 0x10;
  auto damaged = [&] {
    auto f = gguf::File::from_bytes(bytes);
    EXPECT_TRUE(f.is_ok());
    return std::move(*f);
  };
  auto all = ExpertStore::open(damaged(), ExpertSet{});
  ASSERT_FALSE(all.is_ok());
  EXPECT_EQ(all.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(all.status().message().find("layer 1 expert 6"), std::string::npos) << all.status().message();
  EXPECT_NE(all.status().message().find("hash"), std::string::npos);
  // A worker holding only other experts of the damaged slice is unaffected.
  auto part = ExpertStore::open(damaged(), spec_of(*full, "1:0-5,1:7"));
  EXPECT_TRUE(part.is_ok()) << part.status().to_string();
}

TEST(Slice, BackboneSliceHasEverythingButRoutedExperts) {
  const std::string path = small_model(MakeArch::kDeepseek2, MakeFileType::kQ8_0, 21);
  auto full = open_file(path);
  const std::string out = temp_dir() + "/backbone.gguf";
  ASSERT_TRUE(write_backbone_slice(*full, out).is_ok());
  auto bb = open_file(out);
  size_t n_exps = 0, n_kept = 0;
  for (const auto& t : full->tensors()) {
    const bool exps = t.name.find("_exps.") != std::string::npos;
    n_exps += exps;
    const gguf::TensorInfo* o = bb->find_tensor(t.name);
    if (exps) {
      EXPECT_EQ(o, nullptr) << t.name;
      continue;
    }
    ASSERT_NE(o, nullptr) << t.name;
    ++n_kept;
    ASSERT_EQ(o->n_bytes, t.n_bytes);
    EXPECT_EQ(std::memcmp(bb->base() + bb->data_offset() + o->offset, full->base() + full->data_offset() + t.offset,
                          t.n_bytes),
              0)
        << t.name;
  }
  EXPECT_EQ(n_exps, 6u);  // 2 MoE layers x gate/up/down
  EXPECT_EQ(bb->tensors().size(), n_kept);
  // Metadata survives, so hyper-parameters load from the slice alone.
  auto hp = load_hparams(*bb);
  ASSERT_TRUE(hp.is_ok()) << hp.status().to_string();
  EXPECT_EQ(hp->n_expert, 8);
  // A backbone slice cannot serve experts.
  auto st = ExpertStore::open(open_file(out), ExpertSet{});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.status().message().find("backbone"), std::string::npos);
}

// The backbone slice stores one hash per expert slab of every *_exps tensor, equal to what the
// full model's data hashes to; expert_slab_hashes reads them there and computes them on the model.
void check_backbone_hashes(MakeArch arch) {
  const std::string path = small_model(arch, MakeFileType::kQ8_0, 23);
  auto full = open_file(path);
  const std::string out = temp_dir() + "/bb-hash-" + make_arch_name(arch) + ".gguf";
  ASSERT_TRUE(write_backbone_slice(*full, out).is_ok());
  auto bb = open_file(out);
  const ModelShape shape = *model_shape(*full);
  size_t n_tensors = 0;
  for (const auto& t : full->tensors()) {
    if (t.name.find("_exps.") == std::string::npos) continue;
    ++n_tensors;
    ASSERT_EQ(bb->find_tensor(t.name), nullptr) << t.name;
    auto stored = bb->get<std::vector<uint64_t>>(kKeyHashPrefix + t.name);
    ASSERT_TRUE(stored.is_ok()) << stored.status().to_string();
    // Hashed independently here, slab by slab from the model's mapped data.
    const TensorView v = full->view(t);
    ASSERT_EQ(stored->size(), shape.n_expert) << t.name;
    for (uint32_t e = 0; e < shape.n_expert; ++e) {
      const TensorView x = v.expert(e);
      EXPECT_EQ((*stored)[e], slab_hash(x.data, expert_slab_bytes(v))) << t.name << " expert " << e;
    }
    EXPECT_NE((*stored)[0], (*stored)[1]) << t.name;  // distinct slabs, distinct hashes
    auto from_slice = expert_slab_hashes(*bb, t.name);
    auto from_model = expert_slab_hashes(*full, t.name);
    ASSERT_TRUE(from_slice.is_ok()) << from_slice.status().to_string();
    ASSERT_TRUE(from_model.is_ok()) << from_model.status().to_string();
    EXPECT_EQ(*from_slice, *stored);
    EXPECT_EQ(*from_model, *stored);
  }
  EXPECT_EQ(n_tensors, 3 * shape.moe_layers.size());
}

TEST(Slice, BackboneSliceCarriesSlabHashesQwen) {
  check_backbone_hashes(MakeArch::kQwen3Moe);
}
TEST(Slice, BackboneSliceCarriesSlabHashesDeepseekWithDenseLayer) {
  check_backbone_hashes(MakeArch::kDeepseek2);
}

TEST(Slice, ExpertSlabHashesOnEveryKindOfFile) {
  const std::string path = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 23);
  auto full = open_file(path);
  const std::string bs = temp_dir() + "/esh-backbone.gguf", bs2 = temp_dir() + "/esh-backbone2.gguf",
                    es = temp_dir() + "/esh-experts.gguf";
  ASSERT_TRUE(write_backbone_slice(*full, bs).is_ok());
  ASSERT_TRUE(write_expert_slice(*full, spec_of(*full, "1:2-5"), es).is_ok());
  auto bb = open_file(bs), ex = open_file(es);
  const std::string name = "blk.1.ffn_down_exps.weight";
  const std::vector<uint64_t> want = *expert_slab_hashes(*full, name);
  ASSERT_EQ(want.size(), 8u);
  // An expert slice's range tensor: its stored array, slab i = expert 2 + i.
  auto sliced = expert_slab_hashes(*ex, slice_tensor_name(name, 2, 5));
  ASSERT_TRUE(sliced.is_ok()) << sliced.status().to_string();
  EXPECT_EQ(*sliced, std::vector<uint64_t>(want.begin() + 2, want.begin() + 6));
  // A backbone slice cut from a backbone slice keeps the hashes (it has no slabs to hash).
  ASSERT_TRUE(write_backbone_slice(*bb, bs2).is_ok());
  auto bb2 = open_file(bs2);
  EXPECT_EQ(*expert_slab_hashes(*bb2, name), want);
  // Neither tensor nor hashes: kNotFound naming both.
  auto missing = expert_slab_hashes(*bb, "blk.7.ffn_down_exps.weight");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("neither tensor 'blk.7.ffn_down_exps.weight'"), std::string::npos)
      << missing.status().message();
  // An expert slice also carries the model's hashes of every stacked tensor (what a worker checks
  // a replica it is sent against), and the layout.
  EXPECT_EQ(*expert_slab_hashes(*ex, name), want);
  auto ex_layout = expert_tensor_layout(*ex, name);
  ASSERT_TRUE(ex_layout.is_ok()) << ex_layout.status().to_string();
  EXPECT_EQ(ex_layout->ne2, 8u);
  // Not a stacked tensor.
  EXPECT_EQ(expert_slab_hashes(*full, "token_embd.weight").status().code(), StatusCode::kInvalidArgument);
  // The layout of the left-out tensors travels with the hashes (a backbone prices a copy by it).
  for (const auto* f : {full.get(), bb.get(), bb2.get()}) {
    auto lay = expert_tensor_layout(*f, name);
    ASSERT_TRUE(lay.is_ok()) << lay.status().to_string();
    const gguf::TensorInfo* ti = full->find_tensor(name);
    EXPECT_EQ(lay->type, ti->type);
    EXPECT_EQ(lay->ne0, static_cast<uint64_t>(ti->ne[0]));
    EXPECT_EQ(lay->ne1, static_cast<uint64_t>(ti->ne[1]));
    EXPECT_EQ(lay->ne2, 8u);
  }
  EXPECT_EQ(expert_tensor_layout(*bb, "blk.7.ffn_down_exps.weight").status().code(), StatusCode::kNotFound);

  // A backbone slice from before the hashes (rebuilt here without them), and one whose array has
  // the wrong length.
  auto rewrite = [&](const std::string& dst, bool drop, bool truncate) {
    gguf::Writer w;
    for (const auto& [k, v] : bb->kvs()) {
      if (!k.starts_with(kKeyHashPrefix)) {
        w.set(k, v);
      } else if (!drop) {
        gguf::Value cut = v;
        if (truncate) std::get<gguf::Array>(cut.v).items.pop_back();
        w.set(k, cut);
      }
    }
    for (const auto& t : bb->tensors()) {
      const TensorView v = bb->view(t);
      ASSERT_TRUE(w.add_tensor(t.name, t.type, std::vector<int64_t>(v.ne, v.ne + t.n_dims), v.data).is_ok());
    }
    ASSERT_TRUE(w.write_file(dst).is_ok());
  };
  const std::string old = temp_dir() + "/esh-old.gguf", cut = temp_dir() + "/esh-cut.gguf";
  rewrite(old, /*drop=*/true, false);
  rewrite(cut, false, /*truncate=*/true);
  auto fo = open_file(old), fc = open_file(cut);
  auto stale = expert_slab_hashes(*fo, name);
  EXPECT_EQ(stale.status().code(), StatusCode::kNotFound);
  EXPECT_NE(stale.status().message().find("rewrite the backbone slice"), std::string::npos) << stale.status().message();
  auto short_array = expert_slab_hashes(*fc, name);
  EXPECT_EQ(short_array.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(short_array.status().message().find("7 hashes for 8 experts"), std::string::npos)
      << short_array.status().message();
}

}  // namespace
}  // namespace moesh::swarm

namespace moesh::swarm {
namespace {

// gpt-oss experts carry per-expert biases: an expert slice holds its range's bias rows (hashed),
// a backbone slice keeps the bias tensors, the store serves the same rows as the full model, and
// both ends' HELLOs state the same expert FFN (swiglu-oai + biases).
TEST(Slice, ExpertBiasesTravelWithTheirExperts) {
  const std::string path = std::string(MOESH_REFERENCE_DIR) + "/archs/gptoss-a.MXFP4_MOE.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SKIPPED: " << path << " absent";
  auto full = open_file(path);
  const std::string es = temp_dir() + "/gptoss-experts.gguf", bs = temp_dir() + "/gptoss-backbone.gguf";
  ASSERT_TRUE(write_expert_slice(*full, spec_of(*full, "0:2-5,1:7"), es).is_ok());
  ASSERT_TRUE(write_backbone_slice(*full, bs).is_ok());
  auto slice = ExpertStore::open(open_file(es), ExpertSet{});
  ASSERT_TRUE(slice.is_ok()) << slice.status().to_string();
  auto ref = ExpertStore::open(open_file(path), ExpertSet{});
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  for (auto [layer, e] : {std::pair{0u, 2u}, {0u, 5u}, {1u, 7u}}) {
    const ExpertStore::Slot a = (*slice)->find(layer, e), b = (*ref)->find(layer, e);
    ASSERT_NE(a.weights, nullptr);
    ASSERT_TRUE(a.weights->has_biases()) << "layer " << layer << " expert " << e;
    const TensorView* ab[3] = {&a.weights->gate_b, &a.weights->up_b, &a.weights->down_b};
    const TensorView* bb[3] = {&b.weights->gate_b, &b.weights->up_b, &b.weights->down_b};
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(std::memcmp(ab[t]->data + a.index * ab[t]->nb[1], bb[t]->data + b.index * bb[t]->nb[1],
                            ab[t]->ne[0] * sizeof(float)),
                0)
          << ab[t]->name << " expert " << e;
    }
  }
  // A flipped byte in a bias row is caught by its hash, like a weight slab's.
  {
    std::vector<uint8_t> bytes = read_all(es);
    auto f = open_file(es);
    const gguf::TensorInfo* ti = f->find_tensor("blk.0.ffn_up_exps.bias@2-5");
    ASSERT_NE(ti, nullptr);
    bytes[f->data_offset() + ti->offset + 3] ^= 0x40;
    auto damaged = gguf::File::from_bytes(std::move(bytes));
    ASSERT_TRUE(damaged.is_ok());
    auto st = ExpertStore::open(std::move(*damaged), ExpertSet{});
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.status().message().find("ffn_up_exps.bias"), std::string::npos) << st.status().to_string();
  }
  // The backbone slice keeps the bias tensors and drops only the stacked weights.
  auto bf = open_file(bs);
  EXPECT_NE(bf->find_tensor("blk.1.ffn_down_exps.bias"), nullptr);
  EXPECT_EQ(bf->find_tensor("blk.1.ffn_down_exps.weight"), nullptr);
  auto bb = Model::from_file(open_file(bs));
  ASSERT_TRUE(bb.is_ok()) << bb.status().to_string();
  EXPECT_TRUE((*bb)->layers[1].experts.down_b.valid());
  // Both ends state swiglu-oai + biases in HELLO v4.
  auto shape = model_shape(*bf);
  ASSERT_TRUE(shape.is_ok());
  const wire::Hello hb = make_hello(wire::PeerRole::kBackbone, *model_identity(*bf), *shape, {}, "b");
  EXPECT_EQ(hb.expert_act, wire::kExpertActSwigluOai);
  EXPECT_EQ(hb.expert_flags, wire::kExpertFlagBiases);
  const wire::Hello hw =
      make_hello(wire::PeerRole::kWorker, (*slice)->identity(), (*slice)->shape(), (*slice)->held(), "w");
  EXPECT_TRUE(wire::negotiate(hb, hw).is_ok());
  wire::Hello lying = hw;
  lying.expert_flags = 0;  // a worker that would compute the experts without their biases
  EXPECT_FALSE(wire::negotiate(hb, lying).is_ok());
}

}  // namespace
}  // namespace moesh::swarm

namespace moesh::swarm {
namespace {

// A hybrid (qwen3next): the backbone slice keeps every tensor of the recurrent (gated DeltaNet)
// blocks byte for byte and loads as a model with its recurrent layers; an expert slice serves
// the same slabs as the full file (the recurrent state never leaves the backbone).
TEST(Slice, HybridBackboneKeepsTheRecurrentBlocks) {
  const std::string path = std::string(MOESH_REFERENCE_DIR) + "/archs/qwen3next-a.Q8_0.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SKIPPED: " << path << " absent";
  auto full = open_file(path);
  const std::string es = temp_dir() + "/q3n-experts.gguf", bs = temp_dir() + "/q3n-backbone.gguf";
  ASSERT_TRUE(write_backbone_slice(*full, bs).is_ok());
  ASSERT_TRUE(write_expert_slice(*full, spec_of(*full, "0:1-4,1:*"), es).is_ok());
  auto bf = open_file(bs);
  size_t n_ssm = 0;
  for (const auto& t : full->tensors()) {
    if (t.name.find("ssm_") == std::string::npos && t.name.find("attn_qkv") == std::string::npos &&
        t.name.find("attn_gate") == std::string::npos) {
      continue;
    }
    ++n_ssm;
    const gguf::TensorInfo* o = bf->find_tensor(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(std::memcmp(bf->base() + bf->data_offset() + o->offset, full->base() + full->data_offset() + t.offset,
                          t.n_bytes),
              0)
        << t.name;
  }
  EXPECT_EQ(n_ssm, 8u);  // attn_qkv, attn_gate, ssm_a/ba/conv1d/dt/norm/out of block 0
  auto bb = Model::from_file(open_file(bs));
  ASSERT_TRUE(bb.is_ok()) << bb.status().to_string();
  EXPECT_EQ((*bb)->hparams().n_rec_layer, 1);
  EXPECT_TRUE((*bb)->layers[0].ssm_conv1d.valid());
  EXPECT_FALSE((*bb)->layers[0].experts.gate.valid());
  auto slice = ExpertStore::open(open_file(es), ExpertSet{});
  ASSERT_TRUE(slice.is_ok()) << slice.status().to_string();
  auto model = Model::load(path);
  ASSERT_TRUE(model.is_ok());
  const std::vector<ExpertWeights> layers = (*model)->expert_weights();
  for (auto [l, e] : {std::pair{0u, 1u}, {0u, 4u}, {1u, 7u}}) {
    const ExpertStore::Slot s = (*slice)->find(l, e);
    ASSERT_NE(s.weights, nullptr) << l << "/" << e;
    EXPECT_EQ(std::memcmp(layers[l].down.expert(e).data, s.weights->down.expert(s.index).data,
                          expert_slab_bytes(layers[l].down)),
              0);
  }
  EXPECT_EQ((*slice)->find(0, 5).weights, nullptr);
}

// Replica slices (wire STORE): a slab is checked against the model a slice describes — type and
// shape against the layout, bytes against the model's hash — then written as a one-expert slice
// that an ExpertStore maps and a store absorbs; the same pair twice, or another model's, is refused.
TEST(Slice, ReplicaSlabsAreCheckedWrittenAndAbsorbed) {
  const std::string path = small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 29);
  auto full = open_file(path);
  const std::string es = temp_dir() + "/replica-src.gguf", out = temp_dir() + "/replica-1-6.gguf";
  ASSERT_TRUE(write_expert_slice(*full, spec_of(*full, "*:0-3"), es).is_ok());
  auto slice = open_file(es);
  auto all = ExpertStore::open(open_file(path), ExpertSet{});
  ASSERT_TRUE(all.is_ok());
  const ExpertStore::Slot s = (*all)->find(1, 6);
  const wire::SlabMsg good = slab_of(*s.weights, s.index, 1, 6);
  EXPECT_TRUE(check_slab_for_model(*slice, good).is_ok());
  EXPECT_TRUE(check_slab_for_model(*full, good).is_ok());
  // Another expert's bytes under this id: not the model's.
  const ExpertStore::Slot s7 = (*all)->find(1, 7);
  wire::SlabMsg swapped = slab_of(*s7.weights, s7.index, 1, 6);
  Status st = check_slab_for_model(*slice, swapped);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("blk.1.ffn_gate_exps.weight expert 6: slab hashes to"), std::string::npos)
      << st.message();
  // A shape the model does not have; a dense or absent layer.
  wire::SlabMsg shape = good;
  shape.tensors[2].ne1 += 1;
  st = check_slab_for_model(*slice, shape);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("blk.1.ffn_down_exps.weight expert 6: slab is"), std::string::npos) << st.message();
  wire::SlabMsg layer = good;
  layer.layer = 9;
  EXPECT_EQ(check_slab_for_model(*slice, layer).code(), StatusCode::kCorrupt);
  EXPECT_EQ(write_replica_slice(*slice, swapped, out).code(), StatusCode::kCorrupt);
  EXPECT_FALSE(std::filesystem::exists(out));

  ASSERT_TRUE(write_replica_slice(*slice, good, out).is_ok());
  auto rep = ExpertStore::open(open_file(out), ExpertSet{});
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  EXPECT_EQ((*rep)->held().to_string(), "1:6");
  EXPECT_EQ((*rep)->identity(), (*all)->identity());
  auto base = ExpertStore::open(open_file(es), ExpertSet{});
  ASSERT_TRUE(base.is_ok());
  const uint64_t before = (*base)->slab_bytes();
  ASSERT_TRUE((*base)->absorb(std::move(*rep)).is_ok());
  EXPECT_TRUE((*base)->held().holds(1, 6));
  EXPECT_EQ((*base)->held().n_pairs(), 2 * 4 + 1u);
  EXPECT_GT((*base)->slab_bytes(), before);
  const ExpertStore::Slot got = (*base)->find(1, 6);
  ASSERT_NE(got.weights, nullptr);
  const wire::SlabMsg back = slab_of(*got.weights, got.index, 1, 6);
  for (int t = 0; t < 3; ++t) EXPECT_EQ(back.tensors[t].bytes, good.tensors[t].bytes);
  // Twice: refused; another model: refused.
  auto twice = ExpertStore::open(open_file(out), ExpertSet{});
  ASSERT_TRUE(twice.is_ok());
  EXPECT_EQ((*base)->absorb(std::move(*twice)).code(), StatusCode::kInvalidArgument);
  auto other = ExpertStore::open(open_file(small_model(MakeArch::kQwen3Moe, MakeFileType::kQ8_0, 30)), ExpertSet{});
  ASSERT_TRUE(other.is_ok());
  st = (*base)->absorb(std::move(*other));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("is of model"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace moesh::swarm
