// GGUF v2/v3 reader and writer (format: docs/background/gguf-format.md).
//
// The reader maps the file read-only and hands out zero-copy TensorViews. Everything read from
// the file is untrusted: every count, length, offset and type is checked against the bytes
// actually present before use, and any violation is a kCorrupt/kUnsupported Status that names
// the field and its byte offset. No allocation is sized by an unchecked count.
//
// The writer produces files llama.cpp loads: tensor data in info order, each tensor padded to
// the alignment (general.alignment or 32), offsets = running sum of padded sizes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "moesh/tensor/tensor.h"
#include "moesh/tensor/types.h"
#include "moesh/util/status.h"

namespace moesh::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
  kCOUNT = 13
};
const char* value_type_name(ValueType t);

struct Value;
// An array keeps its declared element type; nested arrays are allowed (elem_type == ARRAY).
struct Array {
  ValueType elem_type = ValueType::UINT8;
  std::vector<Value> items;
};

struct Value {
  ValueType type = ValueType::UINT8;
  // Integers are held widened (u64 for unsigned, i64 for signed), floats as double; the declared
  // `type` keeps the on-disk width so a round trip writes the same bytes.
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> v;

  static Value u8(uint8_t x) { return {ValueType::UINT8, uint64_t{x}}; }
  static Value i8(int8_t x) { return {ValueType::INT8, int64_t{x}}; }
  static Value u16(uint16_t x) { return {ValueType::UINT16, uint64_t{x}}; }
  static Value i16(int16_t x) { return {ValueType::INT16, int64_t{x}}; }
  static Value u32(uint32_t x) { return {ValueType::UINT32, uint64_t{x}}; }
  static Value i32(int32_t x) { return {ValueType::INT32, int64_t{x}}; }
  static Value u64(uint64_t x) { return {ValueType::UINT64, x}; }
  static Value i64(int64_t x) { return {ValueType::INT64, x}; }
  static Value f32(float x) { return {ValueType::FLOAT32, double{x}}; }
  static Value f64(double x) { return {ValueType::FLOAT64, x}; }
  static Value boolean(bool x) { return {ValueType::BOOL, x}; }
  static Value str(std::string s) { return {ValueType::STRING, std::move(s)}; }
  static Value array(ValueType elem, std::vector<Value> items) {
    return {ValueType::ARRAY, Array{elem, std::move(items)}};
  }
  static Value str_array(const std::vector<std::string>& xs);
  static Value i32_array(const std::vector<int32_t>& xs);
  static Value f32_array(const std::vector<float>& xs);

  // One-line rendering for `moesh inspect`; arrays longer than max_items are abbreviated.
  std::string to_string(size_t max_items = 8) const;
};

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  uint64_t offset = 0;   // relative to the data section
  uint64_t n_bytes = 0;  // row bytes * rows
};

// How File::open holds a file's bytes.
//  kMap: a read-only file mapping (page cache, 4 KiB pages): instant, shared between processes,
//    reclaimable; what inspect/slice/worker use.
//  kMemory: read into private anonymous memory that asks for transparent huge pages
//    (MADV_HUGEPAGE): costs a read of the whole file, but a matvec streaming the weights then
//    crosses a page (a TLB miss, a prefetcher stop) every 2 MiB instead of every 4 KiB, which
//    made decode 1.4x faster on the perf model (docs/PERFORMANCE.md).
enum class FileLoad { kMap, kMemory };

class File {
 public:
  // Maps (or reads, per `how`) `path` and parses it.
  static Result<std::unique_ptr<File>> open(const std::string& path, FileLoad how = FileLoad::kMap);
  // Parses an in-memory image (the File keeps its own copy). Used by tests and slices.
  static Result<std::unique_ptr<File>> from_bytes(std::vector<uint8_t> bytes);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
  size_t size() const { return size_; }
  const uint8_t* base() const { return base_; }
  bool in_memory() const { return in_memory_; }  // read with FileLoad::kMemory

  // Key/values in file order.
  const std::vector<std::pair<std::string, Value>>& kvs() const { return kvs_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed access. T: bool, any integer type (range-checked coercion between integer widths),
  // float/double (from FLOAT32/FLOAT64), std::string, or std::vector<T> of those for arrays.
  // Errors name the key: "key 'qwen3moe.expert_count' not found" /
  // "key 'x' has type STRING, expected an integer".
  template <typename T>
  Result<T> get(std::string_view key) const;
  // Like get(), but a missing key gives `def`; a present key of the wrong type is still an error.
  template <typename T>
  Result<T> get_or(std::string_view key, T def) const {
    if (!has(key)) return def;
    return get<T>(key);
  }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // A zero-copy view; kNotFound names the tensor when absent.
  Result<TensorView> tensor(std::string_view name) const;
  TensorView view(const TensorInfo& info) const;

 private:
  File() = default;
  Status parse();

  std::string path_;
  std::vector<uint8_t> owned_;  // from_bytes() images
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;  // mmap()ed region (file or anonymous), if any
  bool in_memory_ = false;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF file in memory or on disk.
class Writer {
 public:
  Writer();
  // Adds or replaces a key (file order = first insertion order).
  void set(const std::string& key, Value v);
  // Adds a tensor; `data` must hold n_bytes(type, ne) bytes and stay alive until write().
  Status add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, const void* data);
  // Same, but the writer keeps its own copy of the bytes.
  Status add_tensor_copy(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, const void* data);
  Status write_file(const std::string& path) const;
  Result<std::vector<uint8_t>> write_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    const void* data;
    uint64_t n_bytes;
    std::shared_ptr<std::vector<uint8_t>> owned;
  };
  std::vector<std::pair<std::string, Value>> kvs_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace moesh::gguf
