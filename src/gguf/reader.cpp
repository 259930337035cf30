// GGUF reader: header, metadata, tensor-info table and data-section geometry.
//
// The bytes come from an untrusted file, so every read goes through a bounds-checked cursor and
// every count is compared with the bytes that remain before anything is allocated for it. Errors
// are built only on the failure path; inner helpers return messages without the "kv 3 ('key')"
// prefix and the record loop adds it, so the success path formats nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "moesh/gguf/gguf.h"

namespace moesh::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader decodes little-endian fields with memcpy");

namespace {

constexpr uint32_t k_magic = 0x46554747;                // "GGUF" read as a little-endian u32
constexpr uint64_t k_max_elements = uint64_t{1} << 30;  // ggml's cap on string and array lengths
constexpr int k_max_array_depth = 16;                   // nested arrays recurse; a bound keeps the stack safe
constexpr size_t k_max_name_bytes = 64;                 // GGML_MAX_NAME counts the NUL, so names are < 64 bytes
constexpr int k_max_dims = 4;
// Smallest possible records, used to reject absurd counts before looping over them:
// a KV is key length (8) + at least one key byte + value type (4) + at least one value byte;
// a tensor info is name length (8) + n_dims (4) + type (4) + offset (8).
constexpr uint64_t k_min_kv_bytes = 8 + 1 + 4 + 1;
constexpr uint64_t k_min_tensor_info_bytes = 8 + 4 + 4 + 8;

uint64_t align_up(uint64_t x, uint64_t a) {
  return x + (a - x % a) % a;
}

uint64_t sat_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<uint64_t>::max() : r;
}

// Bytes of one element on disk for fixed-size types; 0 for STRING/ARRAY.
size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    default:
      return 0;
  }
}

// Smallest encoding of one array element: a string is at least its length field, an array at
// least its element type and count.
size_t min_element_size(ValueType t) {
  if (t == ValueType::STRING) return 8;
  if (t == ValueType::ARRAY) return 12;
  return scalar_size(t);
}

// ggml ids that are valid upstream but have no geometry in moesh (IQ2/IQ3/IQ1, ternary, 2026
// additions). Named so the message says "unsupported", not "corrupt".
const char* upstream_only_type_name(uint32_t id) {
  switch (id) {
    case 16:
      return "IQ2_XXS";
    case 17:
      return "IQ2_XS";
    case 18:
      return "IQ3_XXS";
    case 19:
      return "IQ1_S";
    case 21:
      return "IQ3_S";
    case 22:
      return "IQ2_S";
    case 29:
      return "IQ1_M";
    case 34:
      return "TQ1_0";
    case 35:
      return "TQ2_0";
    case 40:
      return "NVFP4";
    case 41:
      return "Q1_0";
    case 42:
      return "Q2_0";
    default:
      return nullptr;
  }
}

std::string quoted_name(const std::string& s) {
  // Names come from the file; cap what we echo so a 1 GB "name" does not become a 1 GB message.
  constexpr size_t k_echo = 80;
  if (s.size() <= k_echo) return "'" + s + "'";
  return "'" + s.substr(0, k_echo) + "...'";
}

class Parser {
 public:
  Parser(const uint8_t* base, size_t size) : base_(base), size_(size) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  size_t size() const { return size_; }

  template <typename T>
  Status read(T* out, const char* field) {
    if (remaining() < sizeof(T)) return truncated(sizeof(T), field);
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::ok();
  }

  Status truncated(uint64_t need, const char* field) const {
    return make_error(StatusCode::kCorrupt, "truncated: {} at offset {} needs {} bytes, only {} left (file size {})",
                      field, pos_, need, remaining(), size_);
  }

  Status read_string(std::string* out, const char* field) {
    const size_t at = pos_;
    uint64_t len = 0;
    MOESH_RETURN_IF_ERROR(read(&len, field));
    if (len > k_max_elements) {
      return make_error(StatusCode::kCorrupt, "{} length {} at offset {} exceeds the limit of 2^30", field, len, at);
    }
    if (len > remaining()) {
      return make_error(StatusCode::kCorrupt, "{} length {} at offset {} exceeds the {} bytes remaining (file size {})",
                        field, len, at, remaining(), size_);
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status::ok();
  }

  Status read_value_type(ValueType* out, const char* field) {
    const size_t at = pos_;
    uint32_t t = 0;
    MOESH_RETURN_IF_ERROR(read(&t, field));
    if (t >= static_cast<uint32_t>(ValueType::kCOUNT)) {
      return make_error(StatusCode::kCorrupt, "unknown {} id {} at offset {}", field, t, at);
    }
    *out = static_cast<ValueType>(t);
    return Status::ok();
  }

  Status read_value(ValueType type, int depth, Value* out) {
    out->type = type;
    switch (type) {
      case ValueType::UINT8:
        return read_scalar<uint8_t, uint64_t>(out, "UINT8 value");
      case ValueType::INT8:
        return read_scalar<int8_t, int64_t>(out, "INT8 value");
      case ValueType::UINT16:
        return read_scalar<uint16_t, uint64_t>(out, "UINT16 value");
      case ValueType::INT16:
        return read_scalar<int16_t, int64_t>(out, "INT16 value");
      case ValueType::UINT32:
        return read_scalar<uint32_t, uint64_t>(out, "UINT32 value");
      case ValueType::INT32:
        return read_scalar<int32_t, int64_t>(out, "INT32 value");
      case ValueType::UINT64:
        return read_scalar<uint64_t, uint64_t>(out, "UINT64 value");
      case ValueType::INT64:
        return read_scalar<int64_t, int64_t>(out, "INT64 value");
      case ValueType::FLOAT32:
        return read_scalar<float, double>(out, "FLOAT32 value");
      case ValueType::FLOAT64:
        return read_scalar<double, double>(out, "FLOAT64 value");
      case ValueType::BOOL: {
        uint8_t b = 0;
        MOESH_RETURN_IF_ERROR(read(&b, "BOOL value"));
        out->v = b != 0;  // ggml treats any nonzero byte as true
        return Status::ok();
      }
      case ValueType::STRING: {
        std::string s;
        MOESH_RETURN_IF_ERROR(read_string(&s, "string"));
        out->v = std::move(s);
        return Status::ok();
      }
      case ValueType::ARRAY:
        return read_array(depth, out);
      case ValueType::kCOUNT:
        break;
    }
    return make_error(StatusCode::kInternal, "read_value: bad type {}", static_cast<uint32_t>(type));
  }

 private:
  template <typename Disk, typename Held>
  Status read_scalar(Value* out, const char* field) {
    Disk x{};
    MOESH_RETURN_IF_ERROR(read(&x, field));
    out->v = static_cast<Held>(x);
    return Status::ok();
  }

  Status read_array(int depth, Value* out) {
    const size_t at = pos_;
    Array arr;
    MOESH_RETURN_IF_ERROR(read_value_type(&arr.elem_type, "array element type"));
    if (arr.elem_type == ValueType::ARRAY && depth + 1 >= k_max_array_depth) {
      return make_error(StatusCode::kUnsupported, "array at offset {} nests deeper than {} levels", at,
                        k_max_array_depth);
    }
    const size_t count_at = pos_;
    uint64_t count = 0;
    MOESH_RETURN_IF_ERROR(read(&count, "array count"));
    if (count > k_max_elements) {
      return make_error(StatusCode::kCorrupt, "array count {} at offset {} exceeds the limit of 2^30", count, count_at);
    }
    const uint64_t min_bytes = count * min_element_size(arr.elem_type);  // <= 2^33, no overflow
    if (min_bytes > remaining()) {
      return make_error(StatusCode::kCorrupt,
                        "array count {} of {} at offset {} needs at least {} bytes but only {} "
                        "remain (file size {})",
                        count, value_type_name(arr.elem_type), count_at, min_bytes, remaining(), size_);
    }
    arr.items.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      Status st = read_value(arr.elem_type, depth + 1, &arr.items[i]);
      if (!st.is_ok()) return Status(st.code(), fmt::format("element {}: {}", i, st.message()));
    }
    out->v = std::move(arr);
    return Status::ok();
  }

  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

Status with_prefix(const Status& st, const std::string& prefix) {
  return Status(st.code(), prefix + ": " + st.message());
}

}  // namespace

File::~File() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

namespace {

// The whole file into fresh anonymous memory that asks for huge pages, then read-only.
Result<void*> read_into_memory(int fd, const std::string& path, size_t size) {
  void* a = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) {
    const int err = errno;
    return make_error(StatusCode::kIoError,
                      "cannot allocate {} bytes to load '{}' into memory: {} (map it instead: --mmap)", size, path,
                      std::strerror(err));
  }
#if defined(MADV_HUGEPAGE)
  (void)::madvise(a, size, MADV_HUGEPAGE);  // a hint: without THP the copy still works
#endif
  auto* dst = static_cast<uint8_t*>(a);
  size_t done = 0;
  while (done < size) {
    const size_t want = std::min<size_t>(size - done, size_t{1} << 30);
    const ssize_t got = ::pread(fd, dst + done, want, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : 0;
      ::munmap(a, size);
      return make_error(StatusCode::kIoError, "reading '{}' at byte {} of {}: {}", path, done, size,
                        got < 0 ? std::strerror(err) : "unexpected end of file");
    }
    done += static_cast<size_t>(got);
  }
  (void)::mprotect(a, size, PROT_READ);  // weights are never written
  return a;
}

}  // namespace

Result<std::unique_ptr<File>> File::open(const std::string& path, FileLoad how) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return make_error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, "cannot open '{}': {}", path,
                      std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(StatusCode::kIoError, "'{}' is not a regular file", path);
  }
  std::unique_ptr<File> f(new File());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0 && how == FileLoad::kMemory) {
    auto a = read_into_memory(fd, path, f->size_);
    if (!a) {
      ::close(fd);
      return a.status();
    }
    f->map_ = *a;
    f->base_ = static_cast<const uint8_t*>(*a);
    f->in_memory_ = true;
  } else if (f->size_ > 0) {
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error(StatusCode::kIoError, "cannot mmap '{}' ({} bytes): {}", path, f->size_, std::strerror(err));
    }
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping keeps the file alive
  Status pst = f->parse();
  if (!pst.is_ok()) return pst.with_context(path);
  return f;
}

Result<std::unique_ptr<File>> File::from_bytes(std::vector<uint8_t> bytes) {
  std::unique_ptr<File> f(new File());
  f->path_ = "<memory>";
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  MOESH_RETURN_IF_ERROR(f->parse());
  return f;
}

Status File::parse() {
  Parser p(base_, size_);

  // ---- header ----
  uint32_t magic = 0;
  if (size_ < 4) {
    return make_error(StatusCode::kCorrupt, "truncated: file is {} bytes, too small for the magic", size_);
  }
  MOESH_RETURN_IF_ERROR(p.read(&magic, "magic"));
  if (magic != k_magic) {
    return make_error(StatusCode::kCorrupt, "bad magic {:02x} {:02x} {:02x} {:02x} at offset 0 (expected 'GGUF')",
                      base_[0], base_[1], base_[2], base_[3]);
  }
  MOESH_RETURN_IF_ERROR(p.read(&version_, "version"));
  if (version_ == 0 || version_ == 1) {
    return make_error(StatusCode::kUnsupported,
                      "GGUF version {} at offset 4 is not supported (only v2 and v3; v1 used "
                      "32-bit lengths)",
                      version_);
  }
  if ((version_ & 0xFFFF) == 0) {
    return make_error(StatusCode::kUnsupported,
                      "version field 0x{:08x} at offset 4 looks byte-swapped: big-endian GGUF "
                      "files are not supported",
                      version_);
  }
  if (version_ > 3) {
    return make_error(StatusCode::kUnsupported, "GGUF version {} at offset 4 is newer than the supported v3", version_);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  MOESH_RETURN_IF_ERROR(p.read(&n_tensors, "tensor_count"));
  MOESH_RETURN_IF_ERROR(p.read(&n_kv, "kv_count"));
  constexpr uint64_t k_i64_max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (n_tensors > k_i64_max || n_tensors > p.remaining() / k_min_tensor_info_bytes) {
    return make_error(StatusCode::kCorrupt,
                      "tensor_count {} at offset 8 is impossible: each tensor info needs at least "
                      "{} bytes and only {} remain (file size {})",
                      n_tensors, k_min_tensor_info_bytes, p.remaining(), size_);
  }
  if (n_kv > k_i64_max || n_kv > p.remaining() / k_min_kv_bytes ||
      n_kv * k_min_kv_bytes + n_tensors * k_min_tensor_info_bytes > p.remaining()) {
    return make_error(StatusCode::kCorrupt,
                      "kv_count {} at offset 16 is impossible: each kv needs at least {} bytes "
                      "and only {} remain after {} tensor infos (file size {})",
                      n_kv, k_min_kv_bytes, p.remaining(), n_tensors, size_);
  }

  // ---- key/values ----
  std::vector<size_t> kv_offsets;
  kvs_.reserve(n_kv);
  kv_offsets.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t rec = p.pos();
    std::string key;
    Status st = p.read_string(&key, "key");
    if (!st.is_ok()) return with_prefix(st, fmt::format("kv {} at offset {}", i, rec));
    const std::string where = fmt::format("kv {} ({})", i, quoted_name(key));
    if (key.empty()) {
      return make_error(StatusCode::kCorrupt, "kv {} at offset {}: empty key", i, rec);
    }
    if (auto it = kv_index_.find(key); it != kv_index_.end()) {
      return make_error(StatusCode::kCorrupt, "{} at offset {}: duplicate key (first at kv {})", where, rec,
                        it->second);
    }
    ValueType type{};
    st = p.read_value_type(&type, "value type");
    if (!st.is_ok()) return with_prefix(st, where);
    Value v;
    st = p.read_value(type, 0, &v);
    if (!st.is_ok()) return with_prefix(st, where);
    kv_index_.emplace(key, kvs_.size());
    kvs_.emplace_back(std::move(key), std::move(v));
    kv_offsets.push_back(rec);
  }

  // ---- alignment ----
  alignment_ = 32;
  if (auto it = kv_index_.find("general.alignment"); it != kv_index_.end()) {
    const Value& v = kvs_[it->second].second;
    const size_t rec = kv_offsets[it->second];
    if (v.type != ValueType::UINT32) {
      return make_error(StatusCode::kCorrupt, "kv {} ('general.alignment') at offset {}: has type {}, expected UINT32",
                        it->second, rec, value_type_name(v.type));
    }
    const uint64_t a = std::get<uint64_t>(v.v);
    if (a == 0 || !std::has_single_bit(a)) {
      return make_error(StatusCode::kCorrupt,
                        "kv {} ('general.alignment') at offset {}: value {} is not a power of two", it->second, rec, a);
    }
    alignment_ = a;
  }

  // ---- tensor infos ----
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const size_t rec = p.pos();
    TensorInfo info;
    Status st = p.read_string(&info.name, "tensor name");
    if (!st.is_ok()) return with_prefix(st, fmt::format("tensor {} at offset {}", i, rec));
    const std::string where = fmt::format("tensor {} ({})", i, quoted_name(info.name));
    if (info.name.size() >= k_max_name_bytes) {
      return make_error(StatusCode::kCorrupt, "{} at offset {}: name is {} bytes, limit is {}", where, rec,
                        info.name.size(), k_max_name_bytes - 1);
    }
    if (auto it = tensor_index_.find(info.name); it != tensor_index_.end()) {
      return make_error(StatusCode::kCorrupt, "{} at offset {}: duplicate tensor name (first at tensor {})", where, rec,
                        it->second);
    }
    size_t at = p.pos();
    uint32_t n_dims = 0;
    st = p.read(&n_dims, "n_dims");
    if (!st.is_ok()) return with_prefix(st, where);
    if (n_dims > k_max_dims) {
      return make_error(StatusCode::kCorrupt, "{}: n_dims {} at offset {} exceeds {}", where, n_dims, at, k_max_dims);
    }
    info.n_dims = static_cast<int>(n_dims);
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      at = p.pos();
      uint64_t ne = 0;
      st = p.read(&ne, "ne");
      if (!st.is_ok()) return with_prefix(st, where);
      if (ne > k_i64_max) {
        return make_error(StatusCode::kCorrupt, "{}: ne[{}] = {} at offset {} is negative", where, d,
                          static_cast<int64_t>(ne), at);
      }
      info.ne[d] = static_cast<int64_t>(ne);
      if (__builtin_mul_overflow(n_elements, info.ne[d], &n_elements)) {
        return make_error(StatusCode::kCorrupt, "{}: element count overflows int64 at ne[{}] = {} (offset {})", where,
                          d, info.ne[d], at);
      }
    }
    at = p.pos();
    uint32_t type_id = 0;
    st = p.read(&type_id, "tensor type");
    if (!st.is_ok()) return with_prefix(st, where);
    if (!type_is_known(type_id)) {
      if (const char* up = upstream_only_type_name(type_id)) {
        return make_error(StatusCode::kUnsupported, "{}: ggml type id {} ({}) at offset {} is not supported by moesh",
                          where, type_id, up, at);
      }
      return make_error(StatusCode::kCorrupt, "{}: unknown or removed ggml type id {} at offset {}", where, type_id,
                        at);
    }
    info.type = static_cast<GgmlType>(type_id);
    const auto& tr = type_traits(info.type);
    if (info.ne[0] % tr.block_size != 0) {
      return make_error(StatusCode::kCorrupt, "{}: ne[0] = {} is not a multiple of the {} block size {}", where,
                        info.ne[0], tr.name, tr.block_size);
    }
    at = p.pos();
    st = p.read(&info.offset, "tensor data offset");
    if (!st.is_ok()) return with_prefix(st, where);
    if (info.offset % alignment_ != 0) {
      return make_error(StatusCode::kCorrupt, "{}: data offset {} at offset {} is not a multiple of the alignment {}",
                        where, info.offset, at, alignment_);
    }
    // n_elements fits int64 — but a zero dimension hides the others' product, so the row count
    // is checked on its own; the byte count may overflow as well.
    const uint64_t n_blocks_per_row = static_cast<uint64_t>(info.ne[0] / tr.block_size);
    uint64_t n_rows = 0;
    uint64_t row_bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(info.ne[1]), static_cast<uint64_t>(info.ne[2]), &n_rows) ||
        __builtin_mul_overflow(n_rows, static_cast<uint64_t>(info.ne[3]), &n_rows) ||
        __builtin_mul_overflow(n_blocks_per_row, tr.block_bytes, &row_bytes) ||
        __builtin_mul_overflow(row_bytes, n_rows, &info.n_bytes)) {
      return make_error(StatusCode::kCorrupt, "{}: byte size of [{}, {}, {}, {}] {} overflows", where, info.ne[0],
                        info.ne[1], info.ne[2], info.ne[3], tr.name);
    }
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  // ---- data section ----
  // Like ggml, pad to the data section only when there is one: a vocab-only file may end right
  // after its metadata.
  const uint64_t infos_end = p.pos();
  data_offset_ = n_tensors > 0 ? align_up(infos_end, alignment_) : infos_end;
  if (n_tensors > 0 && data_offset_ > size_) {
    return make_error(StatusCode::kCorrupt,
                      "truncated: data section starts at {} (tensor infos end at {}, aligned to "
                      "{}) past end of file (size {})",
                      data_offset_, infos_end, alignment_, size_);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    const uint64_t start = sat_add(data_offset_, t.offset);
    const uint64_t end = sat_add(start, t.n_bytes);
    if (end > size_) {
      return make_error(StatusCode::kCorrupt, "tensor {} ({}): data [{}, {}) past end of file (size {})", i,
                        quoted_name(t.name), start, end, size_);
    }
  }
  // Overlap: sort non-empty tensors by offset and compare neighbours.
  std::vector<size_t> order;
  order.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].n_bytes > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors_[a].offset < tensors_[b].offset || (tensors_[a].offset == tensors_[b].offset && a < b);
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& a = tensors_[order[k - 1]];
    const TensorInfo& b = tensors_[order[k]];
    if (a.offset + a.n_bytes > b.offset) {
      return make_error(StatusCode::kCorrupt, "tensor {} ({}): data [{}, {}) overlaps tensor {} ({}) data [{}, {})",
                        order[k], quoted_name(b.name), data_offset_ + b.offset, data_offset_ + b.offset + b.n_bytes,
                        order[k - 1], quoted_name(a.name), data_offset_ + a.offset,
                        data_offset_ + a.offset + a.n_bytes);
    }
  }
  return Status::ok();
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<TensorView> File::tensor(std::string_view name) const {
  const TensorInfo* info = find_tensor(name);
  if (info == nullptr) {
    return make_error(StatusCode::kNotFound, "tensor '{}' not found in {}", name, path_);
  }
  return view(*info);
}

TensorView File::view(const TensorInfo& info) const {
  TensorView v;
  v.name = info.name;
  v.type = info.type;
  v.n_dims = info.n_dims;
  for (int d = 0; d < 4; ++d) v.ne[d] = info.ne[d];
  v.data = base_ + data_offset_ + info.offset;
  v.set_contiguous_strides();
  return v;
}

}  // namespace moesh::gguf
