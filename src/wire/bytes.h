// Little-endian byte writer/reader used by the wire codecs. The reader never reads past its
// span: every get_* reports failure instead, so a decoder can turn short input into a Status.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "moesh/wire/wire.h"

namespace moesh::wire::detail {

// Host order is little-endian on every target we build for; memcpy keeps unaligned access legal.
static_assert(std::endian::native == std::endian::little, "moesh wire codecs assume a little-endian host");

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  void u8(uint8_t v) { out_->push_back(v); }
  void u16(uint16_t v) { raw(&v, 2); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void raw(const void* p, size_t n) {
    const size_t at = out_->size();
    out_->resize(at + n);
    if (n) std::memcpy(out_->data() + at, p, n);
  }
  void zeros(size_t n) { out_->resize(out_->size() + n, 0); }
  size_t size() const { return out_->size(); }

 private:
  std::vector<uint8_t>* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  bool u8(uint8_t* v) { return raw(v, 1); }
  bool u16(uint16_t* v) { return raw(v, 2); }
  bool u32(uint32_t* v) { return raw(v, 4); }
  bool u64(uint64_t* v) { return raw(v, 8); }
  bool f32(float* v) { return raw(v, 4); }
  bool raw(void* p, size_t n) {
    if (n > remaining()) return false;
    if (n) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // A view of the next n bytes (advances), or an empty optional-like span + false.
  bool view(size_t n, std::span<const uint8_t>* out) {
    if (n > remaining()) return false;
    *out = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

// A row block's dtype, byte count and (unless allowed) finiteness; errors with `code`, prefixed
// by `what` (messages.cpp, shared by every message that carries rows).
Status check_rows(StatusCode code, const char* what, const WireRows& rows, const DecodeLimits& lim);

}  // namespace moesh::wire::detail
