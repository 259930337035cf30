// Malformed-input suite for the GGUF reader: a valid file built with the Writer is corrupted in
// one specific way per test (fields located by an independent walker), and the reader must
// answer with the right StatusCode and a message that names what is wrong and where. Also every
// llama.cpp reference file must parse and agree with manifest.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "gguf/gguf_test_util.h"
#include "moesh/gguf/gguf.h"

namespace moesh::gguf {
namespace {

using testing::Layout;
using testing::load;
using testing::random_bytes;
using testing::store;

struct Sample {
  std::vector<uint8_t> bytes;
  Layout layout;
  std::vector<std::vector<uint8_t>> data;
};

// kvs: 0 general.architecture, 1 general.alignment, 2 t.count, 3 t.other, 4 t.tokens, 5 t.nested
// tensors: 0 a.weight F32 [8,2] (64 B), 1 b.weight Q8_0 [32,2] (68 B, padded to 96),
//          2 blk.0.ffn_up_exps.weight F16 [16,2,3] (192 B, ends exactly at end of file)
Sample make_sample() {
  Sample s;
  Writer w;
  w.set("general.architecture", Value::str("testarch"));
  w.set("general.alignment", Value::u32(32));
  w.set("t.count", Value::u32(8));
  w.set("t.other", Value::i32(-3));
  w.set("t.tokens", Value::str_array({"a", "bb", "ccc"}));
  w.set("t.nested", Value::array(ValueType::ARRAY, {Value::i32_array({1, 2}), Value::i32_array({3})}));
  s.data = {random_bytes(64, 11), random_bytes(68, 12), random_bytes(192, 13)};
  EXPECT_TRUE(w.add_tensor("a.weight", GgmlType::F32, {8, 2}, s.data[0].data()).is_ok());
  EXPECT_TRUE(w.add_tensor("b.weight", GgmlType::Q8_0, {32, 2}, s.data[1].data()).is_ok());
  EXPECT_TRUE(w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::F16, {16, 2, 3}, s.data[2].data()).is_ok());
  auto r = w.write_bytes();
  EXPECT_TRUE(r.is_ok());
  s.bytes = std::move(r).value();
  s.layout = testing::walk(s.bytes);
  return s;
}

// Parses `bytes` and checks the failure: code and every expected substring of the message.
void expect_error(std::vector<uint8_t> bytes, StatusCode code, std::initializer_list<std::string> needles) {
  auto f = File::from_bytes(std::move(bytes));
  ASSERT_FALSE(f.is_ok()) << "corrupt file was accepted";
  EXPECT_EQ(f.status().code(), code) << f.status().to_string();
  for (const auto& n : needles) {
    EXPECT_NE(f.status().message().find(n), std::string::npos)
        << "message '" << f.status().message() << "' lacks '" << n << "'";
  }
}

std::vector<uint8_t> splice(std::vector<uint8_t> b, size_t at, size_t erase_n, const std::string& insert) {
  b.erase(b.begin() + at, b.begin() + at + erase_n);
  b.insert(b.begin() + at, insert.begin(), insert.end());
  return b;
}

TEST(GgufMalformed, SampleIsValidAndLayoutMatches) {
  Sample s = make_sample();
  ASSERT_EQ(s.layout.kvs.size(), 6u);
  ASSERT_EQ(s.layout.tensors.size(), 3u);
  EXPECT_EQ(s.layout.kvs[3].key, "t.other");
  EXPECT_EQ(s.layout.tensors[2].name, "blk.0.ffn_up_exps.weight");
  auto f = File::from_bytes(s.bytes);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->data_offset(), (s.layout.infos_end + 31) / 32 * 32);
  EXPECT_EQ((*f)->size(), (*f)->data_offset() + 64 + 96 + 192);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(testing::bytes_are_varied(s.data[i]));
    const TensorView v = (*f)->view((*f)->tensors()[i]);
    EXPECT_EQ(0, std::memcmp(v.data, s.data[i].data(), s.data[i].size()));
  }
}

TEST(GgufMalformed, Header) {
  Sample s = make_sample();
  auto b = s.bytes;
  b[0] = 'X';
  expect_error(b, StatusCode::kCorrupt, {"bad magic", "58 47 55 46", "offset 0"});
  for (uint32_t v : {0u, 1u}) {
    b = s.bytes;
    store<uint32_t>(&b, 4, v);
    expect_error(b, StatusCode::kUnsupported, {"version " + std::to_string(v), "offset 4"});
  }
  b = s.bytes;
  store<uint32_t>(&b, 4, 4);
  expect_error(b, StatusCode::kUnsupported, {"version 4", "newer"});
  b = s.bytes;
  store<uint32_t>(&b, 4, 0x03000000);  // v3 written big-endian
  expect_error(b, StatusCode::kUnsupported, {"byte-swapped", "0x03000000"});
  b = s.bytes;
  store<uint64_t>(&b, 8, uint64_t{1} << 40);
  expect_error(b, StatusCode::kCorrupt, {"tensor_count 1099511627776", "offset 8"});
  b = s.bytes;
  store<uint64_t>(&b, 8, ~uint64_t{0});  // -1 as i64
  expect_error(b, StatusCode::kCorrupt, {"tensor_count", "impossible"});
  b = s.bytes;
  store<uint64_t>(&b, 16, 1000000);
  expect_error(b, StatusCode::kCorrupt, {"kv_count 1000000", "offset 16"});
  expect_error({}, StatusCode::kCorrupt, {"truncated"});
}

TEST(GgufMalformed, KeyValues) {
  Sample s = make_sample();
  const auto& kv = s.layout.kvs;

  auto b = s.bytes;
  store<uint32_t>(&b, kv[2].type, 13);
  expect_error(b, StatusCode::kCorrupt,
               {"kv 2 ('t.count')", "unknown value type id 13", "offset " + std::to_string(kv[2].type)});

  b = s.bytes;
  store<uint32_t>(&b, kv[4].value, 99);  // array element type
  expect_error(b, StatusCode::kCorrupt, {"kv 4 ('t.tokens')", "unknown array element type id 99"});

  b = s.bytes;
  store<uint64_t>(&b, kv[0].value, 1000000);  // string value length
  expect_error(
      b, StatusCode::kCorrupt,
      {"kv 0 ('general.architecture')", "string length 1000000", "offset " + std::to_string(kv[0].value), "exceeds"});

  b = s.bytes;
  store<uint64_t>(&b, kv[1].record, uint64_t{1} << 35);  // key length
  expect_error(b, StatusCode::kCorrupt, {"kv 1 at offset", "key length", "2^30"});

  b = s.bytes;
  store<uint64_t>(&b, kv[4].value + 4, 1000000);  // array count: more than bytes remaining
  expect_error(b, StatusCode::kCorrupt, {"kv 4 ('t.tokens')", "array count 1000000", "remain"});
  b = s.bytes;
  store<uint64_t>(&b, kv[4].value + 4, uint64_t{1} << 31);
  expect_error(b, StatusCode::kCorrupt, {"array count 2147483648", "2^30"});

  b = s.bytes;
  // Second string element of t.tokens ("bb"): value = type(4) count(8) then "a" (8+1).
  store<uint64_t>(&b, kv[4].value + 12 + 9, 5000);
  expect_error(b, StatusCode::kCorrupt, {"kv 4 ('t.tokens')", "element 1", "string length 5000"});

  b = s.bytes;
  // Inner array of t.nested: element 1's count.
  const size_t inner1 = kv[5].value + 12 + (12 + 8);
  store<uint64_t>(&b, inner1 + 4, 1u << 29);
  expect_error(b, StatusCode::kCorrupt, {"kv 5 ('t.nested')", "element 1", "array count 536870912"});

  b = s.bytes;
  store<uint64_t>(&b, kv[2].record, 0);  // empty key
  expect_error(b, StatusCode::kCorrupt, {"kv 2 at offset " + std::to_string(kv[2].record), "empty key"});

  b = s.bytes;
  std::memcpy(b.data() + kv[3].record + 8, "t.count", 7);  // "t.other" -> "t.count"
  expect_error(b, StatusCode::kCorrupt, {"kv 3 ('t.count')", "duplicate key", "first at kv 2"});
}

TEST(GgufMalformed, Alignment) {
  Sample s = make_sample();
  const auto& al = s.layout.kvs[1];
  ASSERT_EQ(al.key, "general.alignment");
  for (uint32_t a : {0u, 24u, 33u}) {
    auto b = s.bytes;
    store<uint32_t>(&b, al.value, a);
    expect_error(b, StatusCode::kCorrupt, {"general.alignment", std::to_string(a) + " is not a power of two"});
  }
  auto b = s.bytes;
  store<uint32_t>(&b, al.type, static_cast<uint32_t>(ValueType::INT32));
  expect_error(b, StatusCode::kCorrupt, {"general.alignment", "type INT32, expected UINT32"});
  // A larger power of two is legal, but then the 32-aligned offsets are not aligned any more.
  b = s.bytes;
  store<uint32_t>(&b, al.value, 64);
  expect_error(b, StatusCode::kCorrupt, {"tensor", "not a multiple of the alignment 64"});
}

TEST(GgufMalformed, TensorInfos) {
  Sample s = make_sample();
  const auto& t = s.layout.tensors;
  const std::string size = std::to_string(s.bytes.size());

  auto b = s.bytes;
  store<uint32_t>(&b, t[1].n_dims, 5);
  expect_error(b, StatusCode::kCorrupt, {"tensor 1 ('b.weight')", "n_dims 5", "exceeds 4"});

  b = s.bytes;
  store<int64_t>(&b, t[0].ne, -8);
  expect_error(b, StatusCode::kCorrupt,
               {"tensor 0 ('a.weight')", "ne[0] = -8", "negative", "offset " + std::to_string(t[0].ne)});

  b = s.bytes;
  store<uint64_t>(&b, t[2].ne + 8, uint64_t{1} << 62);
  expect_error(b, StatusCode::kCorrupt, {"tensor 2", "overflows int64", "ne[1]"});

  // A zero dimension keeps the element count at 0 whatever the others are: their product must
  // still not overflow (found by the gguf fuzzer).
  b = s.bytes;
  store<uint64_t>(&b, t[2].ne, 0);
  store<uint64_t>(&b, t[2].ne + 8, uint64_t{1} << 62);
  store<uint64_t>(&b, t[2].ne + 16, uint64_t{1} << 62);
  expect_error(b, StatusCode::kCorrupt, {"tensor 2", "overflows"});

  b = s.bytes;
  store<uint32_t>(&b, t[0].type, 4);  // removed Q4_2
  expect_error(b, StatusCode::kCorrupt, {"tensor 0 ('a.weight')", "ggml type id 4", "offset"});
  b = s.bytes;
  store<uint32_t>(&b, t[0].type, 1000);
  expect_error(b, StatusCode::kCorrupt, {"ggml type id 1000"});
  b = s.bytes;
  store<uint32_t>(&b, t[0].type, 16);
  expect_error(b, StatusCode::kUnsupported, {"IQ2_XXS", "not supported"});

  b = s.bytes;
  store<uint64_t>(&b, t[1].ne, 48);
  expect_error(b, StatusCode::kCorrupt, {"tensor 1 ('b.weight')", "ne[0] = 48", "Q8_0 block size 32"});

  b = s.bytes;
  store<uint64_t>(&b, t[1].offset, load<uint64_t>(b, t[1].offset) + 4);
  expect_error(b, StatusCode::kCorrupt,
               {"tensor 1 ('b.weight')", "data offset 68", "offset " + std::to_string(t[1].offset), "alignment 32"});

  b = s.bytes;
  store<uint64_t>(&b, t[2].offset, 160 + 3200);
  auto f = File::from_bytes(s.bytes);
  ASSERT_TRUE(f.is_ok());
  const uint64_t start = (*f)->data_offset() + 3360;
  expect_error(b, StatusCode::kCorrupt,
               {"tensor 2 ('blk.0.ffn_up_exps.weight'): data [" + std::to_string(start) + ", " +
                std::to_string(start + 192) + ") past end of file (size " + size + ")"});

  b = s.bytes;
  store<uint64_t>(&b, t[2].offset, ~uint64_t{0} - 31);  // aligned, and start+size overflows
  expect_error(b, StatusCode::kCorrupt, {"tensor 2", "past end of file"});

  b = s.bytes;
  store<uint64_t>(&b, t[1].offset, 32);  // a.weight occupies [0, 64)
  expect_error(b, StatusCode::kCorrupt, {"overlaps", "'a.weight'", "'b.weight'"});

  b = s.bytes;
  std::memcpy(b.data() + t[1].record + 8, "a", 1);  // "b.weight" -> "a.weight"
  expect_error(b, StatusCode::kCorrupt, {"tensor 1 ('a.weight')", "duplicate tensor name"});

  // Lengthen "a.weight" to 72 bytes; 64 inserted bytes keep the data section aligned, so only
  // the name is wrong.
  b = splice(s.bytes, t[0].record + 8, 8, "a.weight" + std::string(64, 'x'));
  store<uint64_t>(&b, t[0].record, 72);
  expect_error(b, StatusCode::kCorrupt, {"tensor 0", "name is 72 bytes", "limit is 63"});
}

TEST(GgufMalformed, LongestLegalNameAndZeroCountsParse) {
  Writer w;
  std::vector<uint8_t> d = random_bytes(16, 3);
  ASSERT_TRUE(w.add_tensor(std::string(63, 'n'), GgmlType::F32, {4}, d.data()).is_ok());
  auto b = w.write_bytes();
  ASSERT_TRUE(b.is_ok());
  auto f = File::from_bytes(*b);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->tensors()[0].name.size(), 63u);

  Writer empty;
  auto e = empty.write_bytes();
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->size(), 24u);
  auto g = File::from_bytes(*e);
  ASSERT_TRUE(g.is_ok());
  EXPECT_TRUE((*g)->kvs().empty());
}

TEST(GgufMalformed, DeeplyNestedArraysAreRefused) {
  Value v = Value::i32_array({1});
  for (int i = 0; i < 40; ++i) v = Value::array(ValueType::ARRAY, {v});
  Writer w;
  w.set("deep", v);
  auto b = w.write_bytes();
  ASSERT_TRUE(b.is_ok());
  expect_error(*b, StatusCode::kUnsupported, {"kv 0 ('deep')", "nests deeper than"});
}

TEST(GgufMalformed, TruncatedAtEveryByte) {
  Sample s = make_sample();
  ASSERT_GT(s.bytes.size(), 400u);
  for (size_t n = 0; n < s.bytes.size(); ++n) {
    std::vector<uint8_t> b(s.bytes.begin(), s.bytes.begin() + n);
    auto f = File::from_bytes(std::move(b));
    ASSERT_FALSE(f.is_ok()) << "prefix of " << n << " bytes accepted";
    ASSERT_EQ(f.status().code(), StatusCode::kCorrupt) << n << ": " << f.status().to_string();
    const std::string& m = f.status().message();
    const bool explained = m.find("truncated") != std::string::npos || m.find("remain") != std::string::npos ||
                           m.find("past end of file") != std::string::npos;
    EXPECT_TRUE(explained) << n << ": " << m;
  }
}

TEST(GgufMalformed, RandomByteCorruptionNeverCrashes) {
  Sample s = make_sample();
  std::mt19937 rng(20240611);
  int n_rejected = 0;
  const size_t meta_end = s.layout.infos_end;  // corrupt only metadata: data bytes are opaque
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = s.bytes;
    const int n_flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_flips; ++k) b[rng() % meta_end] = static_cast<uint8_t>(rng());
    auto f = File::from_bytes(std::move(b));
    if (!f.is_ok()) {
      ++n_rejected;
      EXPECT_FALSE(f.status().message().empty());
      EXPECT_TRUE(f.status().code() == StatusCode::kCorrupt || f.status().code() == StatusCode::kUnsupported)
          << f.status().to_string();
    }
  }
  RecordProperty("n_rejected", n_rejected);
  // Most random metadata damage must be detected (key/name text and scalar values can change
  // and stay valid); 2674 of 3000 are rejected with this seed.
  EXPECT_GT(n_rejected, 2200);
}

// ---- llama.cpp reference files ----

std::vector<std::filesystem::path> reference_ggufs(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& sub : {dir, dir / "vocab"}) {
    if (!std::filesystem::is_directory(sub)) continue;
    for (const auto& e : std::filesystem::directory_iterator(sub)) {
      if (e.path().extension() == ".gguf") out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GgufReference, EveryReferenceFileParsesAndMatchesManifest) {
  const std::filesystem::path dir = MOESH_REFERENCE_DIR;
  if (!std::filesystem::is_directory(dir)) {
    GTEST_SKIP() << "SKIPPED: ../shared/reference not found (" << dir << ")";
  }
  nlohmann::json manifest;
  {
    std::ifstream in(dir / "manifest.json");
    ASSERT_TRUE(in.good());
    manifest = nlohmann::json::parse(in);
  }
  std::map<std::string, nlohmann::json> by_file;
  for (const auto& [model, m] : manifest["models"].items()) {
    for (const auto& [quant, fj] : m["files"].items()) by_file[fj["gguf"].get<std::string>()] = fj;
  }

  const auto files = reference_ggufs(dir);
  ASSERT_GE(files.size(), 6u);
  int n_model_files = 0, n_vocab_files = 0;
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    auto r = File::open(path.string());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const File& f = **r;
    EXPECT_EQ(f.version(), 3u);
    const std::string fname = path.filename().string();
    if (path.parent_path().filename() == "vocab") {
      ++n_vocab_files;
      EXPECT_TRUE(f.tensors().empty());
      auto toks = f.get<std::vector<std::string>>("tokenizer.ggml.tokens");
      ASSERT_TRUE(toks.is_ok()) << toks.status().to_string();
      EXPECT_GT(toks->size(), 1000u);
      EXPECT_TRUE(f.has("tokenizer.ggml.model"));
      continue;
    }
    ++n_model_files;
    ASSERT_TRUE(by_file.count(fname)) << "not in manifest";
    const auto& fj = by_file[fname];
    EXPECT_EQ(f.size(), fj["bytes"].get<size_t>());
    // Every tensor: name, shape, type as llama.cpp's gguf-py wrote them.
    ASSERT_EQ(f.tensors().size(), fj["tensors"].size());
    for (const auto& tj : fj["tensors"]) {
      const std::string name = tj["name"];
      const TensorInfo* info = f.find_tensor(name);
      ASSERT_NE(info, nullptr) << name;
      EXPECT_EQ(type_name(info->type), tj["type"].get<std::string>()) << name;
      ASSERT_EQ(info->n_dims, static_cast<int>(tj["ne"].size())) << name;
      for (int d = 0; d < info->n_dims; ++d) EXPECT_EQ(info->ne[d], tj["ne"][d].get<int64_t>());
      EXPECT_EQ(info->offset % f.alignment(), 0u);
    }
    // Every scalar metadata key with its value.
    for (const auto& [key, vj] : fj["metadata"].items()) {
      if (vj.is_string()) {
        EXPECT_EQ(*f.get<std::string>(key), vj.get<std::string>()) << key;
      } else if (vj.is_boolean()) {
        EXPECT_EQ(*f.get<bool>(key), vj.get<bool>()) << key;
      } else if (vj.is_number_integer()) {
        auto v = f.get<int64_t>(key);
        ASSERT_TRUE(v.is_ok()) << v.status().to_string();
        EXPECT_EQ(*v, vj.get<int64_t>()) << key;
      } else if (vj.is_number_float()) {
        auto v = f.get<double>(key);
        ASSERT_TRUE(v.is_ok()) << v.status().to_string();
        EXPECT_EQ(*v, vj.get<double>()) << key;
      }
    }
    const std::string arch = *f.get<std::string>("general.architecture");
    const auto n_expert = f.get<uint32_t>(arch + ".expert_count");
    ASSERT_TRUE(n_expert.is_ok()) << n_expert.status().to_string();
    const uint32_t want_experts = arch == "deepseek2" ? 16u : 8u;  // qwen3moe-s, mixtral-s: 8
    EXPECT_EQ(*n_expert, want_experts);
    // A stacked expert tensor's slabs tile it exactly.
    auto exps = f.tensor("blk.1.ffn_down_exps.weight");
    ASSERT_TRUE(exps.is_ok());
    EXPECT_EQ(exps->ne[2], static_cast<int64_t>(*n_expert));
    EXPECT_EQ(exps->expert(*n_expert - 1).data + exps->nb[2], exps->data + exps->n_bytes());
  }
  EXPECT_GE(n_model_files, 6);
  EXPECT_GE(n_vocab_files, 3);
}

}  // namespace
}  // namespace moesh::gguf
