// GGUF reader/writer: round trips of every value type and several tensor types, typed accessors
// (coercion, range and type errors), alignment handling and expert-slab views.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "gguf/gguf_test_util.h"
#include "moesh/gguf/gguf.h"

namespace moesh::gguf {
namespace {

using testing::random_bytes;
using testing::values_equal;

// Every value type, boundary values, empty and nested arrays.
std::vector<std::pair<std::string, Value>> all_value_kinds() {
  std::vector<std::pair<std::string, Value>> kv;
  kv.emplace_back("general.architecture", Value::str("testarch"));
  kv.emplace_back("t.u8", Value::u8(255));
  kv.emplace_back("t.i8", Value::i8(-128));
  kv.emplace_back("t.u16", Value::u16(65535));
  kv.emplace_back("t.i16", Value::i16(-32768));
  kv.emplace_back("t.u32", Value::u32(4000000000u));
  kv.emplace_back("t.i32", Value::i32(-2000000000));
  kv.emplace_back("t.u64", Value::u64(std::numeric_limits<uint64_t>::max()));
  kv.emplace_back("t.i64", Value::i64(std::numeric_limits<int64_t>::min()));
  kv.emplace_back("t.f32", Value::f32(1e-6f));
  kv.emplace_back("t.f64", Value::f64(-3.141592653589793));
  kv.emplace_back("t.nan", Value::f32(std::numeric_limits<float>::quiet_NaN()));
  kv.emplace_back("t.true", Value::boolean(true));
  kv.emplace_back("t.false", Value::boolean(false));
  kv.emplace_back("t.str", Value::str("h\xC3\xA9llo \"world\"\n"));
  kv.emplace_back("t.empty_str", Value::str(""));
  kv.emplace_back("t.strs", Value::str_array({"a", "", "ccc", "\xE2\x96\x81tok"}));
  kv.emplace_back("t.i32s", Value::i32_array({1, -2, 3, 2147483647}));
  kv.emplace_back("t.f32s", Value::f32_array({0.5f, -1.25f, 1e30f}));
  kv.emplace_back("t.empty_arr", Value::array(ValueType::UINT64, {}));
  kv.emplace_back("t.bools", Value::array(ValueType::BOOL, {Value::boolean(true), Value::boolean(false)}));
  kv.emplace_back("t.u8s", Value::array(ValueType::UINT8, {Value::u8(0), Value::u8(200)}));
  kv.emplace_back("t.i64s", Value::array(ValueType::INT64, {Value::i64(-5), Value::i64(1LL << 40)}));
  kv.emplace_back("t.f64s", Value::array(ValueType::FLOAT64, {Value::f64(2.5)}));
  kv.emplace_back("t.nested", Value::array(ValueType::ARRAY, {Value::i32_array({1, 2, 3}), Value::i32_array({}),
                                                              Value::i32_array({-7})}));
  kv.emplace_back("t.nested_str", Value::array(ValueType::ARRAY, {Value::str_array({"x", "yy"})}));
  kv.emplace_back("t.nested2",
                  Value::array(ValueType::ARRAY, {Value::array(ValueType::ARRAY, {Value::f32_array({1.0f, 2.0f})})}));
  return kv;
}

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> bytes;
};

std::vector<TensorSpec> sample_tensors() {
  std::vector<TensorSpec> ts = {
      {"token_embd.weight", GgmlType::Q8_0, {64, 5}, {}},
      {"output_norm.weight", GgmlType::F32, {7}, {}},  // 28 bytes: exercises padding
      {"blk.0.attn_q.weight", GgmlType::F16, {8, 3}, {}},
      {"blk.0.ffn_up_exps.weight", GgmlType::Q4_K, {256, 2, 4}, {}},
      {"blk.0.ffn_down_exps.weight", GgmlType::Q6_K, {256, 1, 4}, {}},
      {"blk.0.bf16.weight", GgmlType::BF16, {3, 2, 2, 2}, {}},
      {"blk.0.ids", GgmlType::I32, {5}, {}},
      {"empty.weight", GgmlType::F32, {0, 4}, {}},
  };
  uint32_t seed = 1234;
  for (auto& t : ts) {
    int64_t rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) rows *= t.ne[d];
    t.bytes = random_bytes(type_row_bytes(t.type, t.ne[0]) * static_cast<size_t>(rows), seed++);
  }
  return ts;
}

Writer build_writer(const std::vector<std::pair<std::string, Value>>& kvs, const std::vector<TensorSpec>& ts) {
  Writer w;
  for (const auto& [k, v] : kvs) w.set(k, v);
  for (const auto& t : ts) {
    Status st = w.add_tensor(t.name, t.type, t.ne, t.bytes.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return w;
}

std::unique_ptr<File> parse_ok(std::vector<uint8_t> bytes) {
  auto f = File::from_bytes(std::move(bytes));
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f.is_ok() ? std::move(f).value() : nullptr;
}

TEST(GgufRoundTrip, EveryValueTypeAndTensorTypeReadsBackIdentically) {
  const auto kvs = all_value_kinds();
  const auto ts = sample_tensors();
  for (const auto& t : ts) {
    if (!t.bytes.empty()) {
      EXPECT_TRUE(testing::bytes_are_varied(t.bytes)) << t.name;
    }
  }
  Writer w = build_writer(kvs, ts);
  auto bytes = w.write_bytes();
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto f = parse_ok(*bytes);
  ASSERT_NE(f, nullptr);

  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  ASSERT_EQ(f->kvs().size(), kvs.size());
  for (size_t i = 0; i < kvs.size(); ++i) {
    EXPECT_EQ(f->kvs()[i].first, kvs[i].first) << "KVs must keep insertion order";
    EXPECT_TRUE(values_equal(f->kvs()[i].second, kvs[i].second))
        << kvs[i].first << ": wrote " << kvs[i].second.to_string() << ", read " << f->kvs()[i].second.to_string();
  }

  ASSERT_EQ(f->tensors().size(), ts.size());
  EXPECT_EQ(f->data_offset() % 32, 0u);
  uint64_t expect_offset = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorInfo& info = f->tensors()[i];
    EXPECT_EQ(info.name, ts[i].name);
    EXPECT_EQ(info.type, ts[i].type);
    EXPECT_EQ(info.n_dims, static_cast<int>(ts[i].ne.size()));
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(info.ne[d], d < ts[i].ne.size() ? ts[i].ne[d] : 1);
    // ggml's strict layout: offsets are the running sum of sizes padded to the alignment.
    EXPECT_EQ(info.offset, expect_offset) << info.name;
    EXPECT_EQ(info.n_bytes, ts[i].bytes.size());
    expect_offset += (info.n_bytes + 31) / 32 * 32;

    auto v = f->tensor(ts[i].name);
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(v->data, f->base() + f->data_offset() + info.offset) << "view must be zero-copy";
    EXPECT_EQ(v->n_bytes(), ts[i].bytes.size());
    EXPECT_EQ(v->nb[0], type_block_bytes(ts[i].type));
    EXPECT_EQ(v->nb[1], type_row_bytes(ts[i].type, ts[i].ne[0]));
    EXPECT_EQ(v->nb[2], v->nb[1] * static_cast<size_t>(v->ne[1]));
    EXPECT_EQ(v->nb[3], v->nb[2] * static_cast<size_t>(v->ne[2]));
    if (!ts[i].bytes.empty()) {
      EXPECT_EQ(0, std::memcmp(v->data, ts[i].bytes.data(), ts[i].bytes.size())) << ts[i].name;
    }
  }
  EXPECT_EQ(f->size(), f->data_offset() + expect_offset);

  // Rewriting what was read gives the same bytes.
  Writer w2;
  for (const auto& [k, v] : f->kvs()) w2.set(k, v);
  for (const auto& info : f->tensors()) {
    std::vector<int64_t> ne(info.ne, info.ne + info.n_dims);
    ASSERT_TRUE(w2.add_tensor(info.name, info.type, ne, f->view(info).data).is_ok());
  }
  auto bytes2 = w2.write_bytes();
  ASSERT_TRUE(bytes2.is_ok());
  EXPECT_EQ(*bytes, *bytes2);
}

TEST(GgufRoundTrip, VocabOnlyFileHasNoPaddingAndNoTensors) {
  Writer w;
  w.set("tokenizer.ggml.tokens", Value::str_array({"<s>", "</s>", "a"}));
  auto bytes = w.write_bytes();
  ASSERT_TRUE(bytes.is_ok());
  // 24 header + key (8 + 21) + type 4 + array header 12 + 3 strings (8+3, 8+4, 8+1)
  EXPECT_EQ(bytes->size(), 24u + 29u + 4u + 12u + 11u + 12u + 9u);
  auto f = parse_ok(*bytes);
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->data_offset(), f->size()) << "no tensors: no padding, data section at the end";
  auto toks = f->get<std::vector<std::string>>("tokenizer.ggml.tokens");
  ASSERT_TRUE(toks.is_ok());
  EXPECT_EQ(*toks, (std::vector<std::string>{"<s>", "</s>", "a"}));
}

TEST(GgufRoundTrip, CustomAlignmentIsRespected) {
  const auto ts = sample_tensors();
  auto kvs = all_value_kinds();
  kvs.emplace_back("general.alignment", Value::u32(256));
  auto bytes = build_writer(kvs, ts).write_bytes();
  ASSERT_TRUE(bytes.is_ok());
  auto f = parse_ok(*bytes);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->alignment(), 256u);
  EXPECT_EQ(f->data_offset() % 256, 0u);
  for (const auto& info : f->tensors()) EXPECT_EQ(info.offset % 256, 0u) << info.name;
  // The 28-byte F32 tensor is followed by 228 bytes of padding.
  EXPECT_EQ(f->tensors()[2].offset - f->tensors()[1].offset, 256u);
  auto v = f->tensor("blk.0.ffn_up_exps.weight");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(0, std::memcmp(v->data, ts[3].bytes.data(), ts[3].bytes.size()));
}

TEST(GgufRoundTrip, Version2IsAccepted) {
  auto bytes = build_writer(all_value_kinds(), sample_tensors()).write_bytes();
  ASSERT_TRUE(bytes.is_ok());
  testing::store<uint32_t>(&*bytes, 4, 2);
  auto f = parse_ok(*bytes);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 2u);
}

TEST(GgufRoundTrip, WriteFileThenMmapOpen) {
  const auto ts = sample_tensors();
  Writer w = build_writer(all_value_kinds(), ts);
  const auto dir = std::filesystem::temp_directory_path() / ("moesh_gguf_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.gguf").string();
  ASSERT_TRUE(w.write_file(path).is_ok());
  // The temp file was renamed away: only the target is left.
  size_t n_files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n_files;
  EXPECT_EQ(n_files, 1u);

  auto f = File::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->path(), path);
  auto mem = w.write_bytes();
  ASSERT_TRUE(mem.is_ok());
  ASSERT_EQ((*f)->size(), mem->size());
  EXPECT_EQ(0, std::memcmp((*f)->base(), mem->data(), mem->size()));
  auto v = (*f)->tensor("token_embd.weight");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(0, std::memcmp(v->row(1), ts[0].bytes.data() + v->nb[1], v->nb[1]));

  EXPECT_FALSE((*f)->in_memory());

  // Read into (huge-page) memory instead: the same bytes and views, the file no longer needed.
  auto m = File::open(path, FileLoad::kMemory);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_TRUE((*m)->in_memory());
  ASSERT_EQ((*m)->size(), mem->size());
  EXPECT_EQ(0, std::memcmp((*m)->base(), mem->data(), mem->size()));
  std::filesystem::remove(path);
  auto vm = (*m)->tensor("token_embd.weight");
  ASSERT_TRUE(vm.is_ok());
  EXPECT_EQ(0, std::memcmp(vm->row(1), ts[0].bytes.data() + vm->nb[1], vm->nb[1]));

  // A truncated file read into memory is refused by the parser like a mapped one.
  ASSERT_TRUE(w.write_file(path).is_ok());
  std::filesystem::resize_file(path, mem->size() - 10);
  for (const FileLoad how : {FileLoad::kMap, FileLoad::kMemory}) {
    auto t = File::open(path, how);
    ASSERT_FALSE(t.is_ok());
    EXPECT_EQ(t.status().code(), StatusCode::kCorrupt) << t.status().to_string();
  }

  for (const FileLoad how : {FileLoad::kMap, FileLoad::kMemory}) {
    auto missing = File::open((dir / "nope.gguf").string(), how);
    ASSERT_FALSE(missing.is_ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    EXPECT_NE(missing.status().message().find("nope.gguf"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(GgufExperts, ExpertSlabsMatchWhatWasWritten) {
  // ne = [K, M, n_expert] = [64, 3, 5] Q8_0: row 68 bytes, slab 204 bytes.
  constexpr int64_t k_k = 64, k_m = 3, k_e = 5;
  std::vector<std::vector<uint8_t>> slabs;
  std::vector<uint8_t> stacked;
  const size_t slab_bytes = type_row_bytes(GgmlType::Q8_0, k_k) * k_m;
  for (int e = 0; e < k_e; ++e) {
    slabs.push_back(random_bytes(slab_bytes, 900 + e));
    // Tag each slab with its expert id so a misplaced slab breaks the comparison for sure.
    slabs.back()[0] = static_cast<uint8_t>(0xE0 + e);
    stacked.insert(stacked.end(), slabs.back().begin(), slabs.back().end());
  }
  ASSERT_TRUE(testing::bytes_are_varied(stacked));
  Writer w;
  w.set("general.architecture", Value::str("testarch"));
  std::vector<uint8_t> norm = random_bytes(4 * 64, 7);
  ASSERT_TRUE(w.add_tensor("blk.0.ffn_norm.weight", GgmlType::F32, {64}, norm.data()).is_ok());
  ASSERT_TRUE(w.add_tensor_copy("blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, {k_k, k_m, k_e}, stacked.data()).is_ok());
  stacked.assign(stacked.size(), 0);  // the writer kept its own copy
  auto bytes = w.write_bytes();
  ASSERT_TRUE(bytes.is_ok());
  auto f = parse_ok(*bytes);
  ASSERT_NE(f, nullptr);
  auto t = f->tensor("blk.0.ffn_gate_exps.weight");
  ASSERT_TRUE(t.is_ok());
  ASSERT_EQ(t->n_dims, 3);
  EXPECT_EQ(t->nb[2], slab_bytes);
  EXPECT_EQ(expert_slab_bytes(*t), slab_bytes);
  for (int64_t e = 0; e < k_e; ++e) {
    TensorView x = t->expert(e);
    EXPECT_EQ(x.n_dims, 2);
    EXPECT_EQ(x.ne[0], k_k);
    EXPECT_EQ(x.ne[1], k_m);
    EXPECT_EQ(x.ne[2], 1);
    EXPECT_EQ(x.data, t->data + e * t->nb[2]);
    EXPECT_EQ(x.n_bytes(), slab_bytes);
    EXPECT_EQ(x.data[0], 0xE0 + e);
    EXPECT_EQ(0, std::memcmp(x.data, slabs[e].data(), slab_bytes)) << "expert " << e;
    // Row r of expert e.
    EXPECT_EQ(0, std::memcmp(x.row(2), slabs[e].data() + 2 * x.nb[1], x.nb[1]));
  }
  TensorView r = t->expert_range(1, 3);
  EXPECT_EQ(r.ne[2], 3);
  EXPECT_EQ(r.n_bytes(), 3 * slab_bytes);
  EXPECT_EQ(r.data, t->data + expert_slab_offset(*t, 1));
  for (int64_t e = 0; e < 3; ++e) {
    EXPECT_EQ(0, std::memcmp(r.row(0, e), slabs[1 + e].data(), slab_bytes)) << "range slot " << e;
  }
}

// ---- typed accessors ----

class GgufAccessors : public ::testing::Test {
 protected:
  void SetUp() override {
    Writer w;
    w.set("u32", Value::u32(70000));
    w.set("u32small", Value::u32(12));
    w.set("i32neg", Value::i32(-1));
    w.set("i8", Value::i8(-100));
    w.set("u64max", Value::u64(std::numeric_limits<uint64_t>::max()));
    w.set("i64", Value::i64(-(1LL << 40)));
    w.set("f32", Value::f32(0.25f));
    w.set("f64", Value::f64(1e300));
    w.set("flag", Value::boolean(true));
    w.set("name", Value::str("qwen3moe"));
    w.set("ints", Value::i32_array({4, -5, 6}));
    w.set("u8s", Value::array(ValueType::UINT16, {Value::u16(7), Value::u16(300)}));
    w.set("strs", Value::str_array({"x", "y"}));
    w.set("floats", Value::f32_array({1.5f, -2.0f}));
    w.set("nested", Value::array(ValueType::ARRAY, {Value::i32_array({1}), Value::i32_array({2, 3})}));
    w.set("name", Value::str("qwen3moe"));  // replacing keeps one entry
    auto bytes = w.write_bytes();
    ASSERT_TRUE(bytes.is_ok());
    f_ = parse_ok(*bytes);
    ASSERT_NE(f_, nullptr);
  }
  std::unique_ptr<File> f_;
};

TEST_F(GgufAccessors, IntegerCoercionWithinRange) {
  EXPECT_EQ(f_->kvs().size(), 15u);
  EXPECT_EQ(*f_->get<int64_t>("u32"), 70000);
  EXPECT_EQ(*f_->get<uint32_t>("u32"), 70000u);
  EXPECT_EQ(*f_->get<uint16_t>("u32small"), 12);
  EXPECT_EQ(*f_->get<int8_t>("u32small"), 12);
  EXPECT_EQ(*f_->get<int32_t>("i32neg"), -1);
  EXPECT_EQ(*f_->get<int64_t>("i8"), -100);
  EXPECT_EQ(*f_->get<int16_t>("i8"), -100);
  EXPECT_EQ(*f_->get<uint64_t>("u64max"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(*f_->get<int64_t>("i64"), -(1LL << 40));
  EXPECT_EQ(*f_->get<size_t>("u32"), 70000u);
}

TEST_F(GgufAccessors, IntegerOutOfRangeNamesKeyAndTarget) {
  auto a = f_->get<uint16_t>("u32");
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(a.status().message(), "key 'u32' value 70000 (UINT32) does not fit in uint16");
  auto b = f_->get<uint32_t>("i32neg");
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(b.status().message().find("-1"), std::string::npos);
  auto c = f_->get<int64_t>("u64max");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("int64"), std::string::npos);
  auto d = f_->get<int32_t>("i64");
  EXPECT_FALSE(d.is_ok());
  auto e = f_->get<uint8_t>("i8");
  EXPECT_FALSE(e.is_ok());
}

TEST_F(GgufAccessors, WrongTypeNamesKeyFoundAndExpected) {
  auto a = f_->get<int32_t>("name");
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().code(), StatusCode::kTypeMismatch);
  EXPECT_EQ(a.status().message(), "key 'name' has type STRING, expected an integer");
  auto b = f_->get<std::string>("u32");
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().message(), "key 'u32' has type UINT32, expected STRING");
  auto c = f_->get<float>("u32");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("expected FLOAT32 or FLOAT64"), std::string::npos);
  auto d = f_->get<int64_t>("f32");
  EXPECT_EQ(d.status().code(), StatusCode::kTypeMismatch);
  auto e = f_->get<bool>("u32small");
  EXPECT_EQ(e.status().message(), "key 'u32small' has type UINT32, expected BOOL");
  auto g = f_->get<std::vector<int32_t>>("name");
  EXPECT_EQ(g.status().message(), "key 'name' has type STRING, expected ARRAY");
  auto h = f_->get<int32_t>("ints");
  EXPECT_EQ(h.status().message(), "key 'ints' has type ARRAY, expected an integer");
  auto m = f_->get<int32_t>("nope");
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(m.status().message(), "key 'nope' not found");
}

TEST_F(GgufAccessors, FloatsBoolsStrings) {
  EXPECT_EQ(*f_->get<float>("f32"), 0.25f);
  EXPECT_EQ(*f_->get<double>("f32"), 0.25);
  EXPECT_EQ(*f_->get<double>("f64"), 1e300);
  EXPECT_TRUE(*f_->get<bool>("flag"));
  EXPECT_EQ(*f_->get<std::string>("name"), "qwen3moe");
}

TEST_F(GgufAccessors, Arrays) {
  EXPECT_EQ(*f_->get<std::vector<int32_t>>("ints"), (std::vector<int32_t>{4, -5, 6}));
  EXPECT_EQ(*f_->get<std::vector<int64_t>>("ints"), (std::vector<int64_t>{4, -5, 6}));
  EXPECT_EQ(*f_->get<std::vector<std::string>>("strs"), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(*f_->get<std::vector<float>>("floats"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(*f_->get<std::vector<uint32_t>>("u8s"), (std::vector<uint32_t>{7, 300}));
  auto nested = f_->get<std::vector<std::vector<int32_t>>>("nested");
  ASSERT_TRUE(nested.is_ok()) << nested.status().to_string();
  EXPECT_EQ(*nested, (std::vector<std::vector<int32_t>>{{1}, {2, 3}}));

  auto narrow = f_->get<std::vector<uint8_t>>("u8s");
  ASSERT_FALSE(narrow.is_ok());
  EXPECT_EQ(narrow.status().message(), "key 'u8s' element 1 value 300 (UINT16) does not fit in uint8");
  auto neg = f_->get<std::vector<uint32_t>>("ints");
  EXPECT_FALSE(neg.is_ok());
  auto wrong = f_->get<std::vector<std::string>>("ints");
  EXPECT_EQ(wrong.status().message(), "key 'ints' element 0 has type INT32, expected STRING");
}

TEST_F(GgufAccessors, GetOrDefaultsOnlyWhenMissing) {
  EXPECT_EQ(*f_->get_or<uint32_t>("missing", 42u), 42u);
  EXPECT_EQ(*f_->get_or<uint32_t>("u32small", 42u), 12u);
  EXPECT_FALSE(f_->get_or<uint32_t>("name", 42u).is_ok());
}

TEST(GgufValue, ToStringAbbreviatesArrays) {
  std::vector<std::string> toks;
  for (int i = 0; i < 512; ++i) toks.push_back("t" + std::to_string(i));
  EXPECT_EQ(Value::str_array(toks).to_string(2), "[512 x STRING] [\"t0\", \"t1\", ... ]");
  EXPECT_EQ(Value::i32_array({1, -2}).to_string(), "[2 x INT32] [1, -2]");
  EXPECT_EQ(Value::f32(1e-6f).to_string(), "1e-06");
  EXPECT_EQ(Value::boolean(false).to_string(), "false");
  EXPECT_EQ(Value::str("a\"b\n").to_string(), "\"a\\\"b\\n\"");
  EXPECT_EQ(Value::array(ValueType::ARRAY, {Value::i32_array({1, 2, 3})}).to_string(2),
            "[1 x ARRAY] [[3 x INT32] [1, 2, ... ]]");
  EXPECT_EQ(Value::u64(18446744073709551615ull).to_string(), "18446744073709551615");
}

TEST(GgufWriter, RejectsInvalidTensorsAndValues) {
  Writer w;
  std::vector<uint8_t> buf(1024);
  EXPECT_EQ(w.add_tensor("q", GgmlType::Q4_K, {100, 2}, buf.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor(std::string(64, 'x'), GgmlType::F32, {4}, buf.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("five", GgmlType::F32, {1, 1, 1, 1, 1}, buf.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("neg", GgmlType::F32, {-4}, buf.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("bad", static_cast<GgmlType>(4), {4}, buf.data()).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.add_tensor("ok", GgmlType::F32, {4}, buf.data()).is_ok());
  EXPECT_EQ(w.add_tensor("ok", GgmlType::F32, {4}, buf.data()).code(), StatusCode::kInvalidArgument);

  Writer mixed;
  mixed.set("mixed", Value::array(ValueType::INT32, {Value::i32(1), Value::str("x")}));
  auto r = mixed.write_bytes();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'mixed'"), std::string::npos);

  Writer align;
  align.set("general.alignment", Value::u32(24));
  EXPECT_FALSE(align.write_bytes().is_ok());
  align.set("general.alignment", Value::u64(64));
  EXPECT_FALSE(align.write_bytes().is_ok());
}

}  // namespace
}  // namespace moesh::gguf
