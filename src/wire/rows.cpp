// Row codecs: f32 rows <-> F32 / F16 / BF16 / Q8 / Q8K wire bytes (PROTOCOL.md "Row encodings").
#include <algorithm>
#include <cmath>
#include <cstring>

#include "moesh/tensor/fp16.h"
#include "moesh/tensor/ops.h"
#include "moesh/tensor/quant.h"
#include "moesh/wire/wire.h"

namespace moesh::wire {

size_t wire_row_bytes(WireDType t, uint32_t n_cols) {
  switch (t) {
    case WireDType::kF32:
      return size_t{4} * n_cols;
    case WireDType::kF16:
    case WireDType::kBF16:
      return size_t{2} * n_cols;
    case WireDType::kQ8:
      return kQ8BlockBytes * ((size_t{n_cols} + kQ8BlockSize - 1) / kQ8BlockSize);
    case WireDType::kQ8K:
      return kQ8KBlockBytes * ((size_t{n_cols} + kQ8KBlockSize - 1) / kQ8KBlockSize);
    case WireDType::kCOUNT:
      break;
  }
  return 0;
}

// Q8 is moesh's canonical Q8_0 activation quantizer (quant.h): amax = max|x|, d = amax/127,
// id = amax ? 127/amax : 0, q = round-half-even(x*id), stored d = f16(d). The quantized values
// use the unrounded f32 scale, the decoder the f16 one — exactly like the local path, which is
// what lets a worker's Q8_0 dot products equal the backbone's.
void q8_encode_row(const float* src, uint32_t n, uint8_t* dst) {
  for (uint32_t b0 = 0; b0 < n; b0 += kQ8BlockSize) {
    const uint32_t len = std::min(kQ8BlockSize, n - b0);
    float amax = 0.f;
    for (uint32_t j = 0; j < len; ++j) amax = std::max(amax, std::fabs(src[b0 + j]));
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(dst, &dh, 2);
    int8_t* q = reinterpret_cast<int8_t*>(dst + 2);
    for (uint32_t j = 0; j < kQ8BlockSize; ++j) {
      // nearbyintf rounds half to even in the default rounding mode, which we never change.
      const float v = j < len ? std::nearbyintf(src[b0 + j] * id) : 0.f;
      q[j] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
    }
    dst += kQ8BlockBytes;
  }
}

void q8_decode_row(const uint8_t* src, uint32_t n, float* dst) {
  for (uint32_t b0 = 0; b0 < n; b0 += kQ8BlockSize) {
    const uint32_t len = std::min(kQ8BlockSize, n - b0);
    uint16_t dh;
    std::memcpy(&dh, src, 2);
    const float d = fp16_to_fp32(dh);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (uint32_t j = 0; j < len; ++j) dst[b0 + j] = d * static_cast<float>(q[j]);
    src += kQ8BlockBytes;
  }
}

// Q8K is the Q8_K activation quantizer the backbone's own k-quant matmuls use (quantize_rows ->
// the kernel table's from_float, bit-identical to quant::quantize_row_ref): the wire carries its
// d and q, and drops the bsums, which are a function of q. A row whose length is not a multiple
// of 256 is quantized as if zero-padded: zeros never win the |x| maximum (strict '>') and
// quantize to 0, so the full blocks are what the unpadded row's blocks would be.
void q8k_encode_row(const float* src, uint32_t n, uint8_t* dst) {
  const uint32_t n_blocks = (n + kQ8KBlockSize - 1) / kQ8KBlockSize;
  std::vector<float> padded(size_t{n_blocks} * kQ8KBlockSize, 0.f);
  std::copy_n(src, n, padded.data());
  QuantizedRows q;
  quantize_rows(GgmlType::Q8_K, padded.data(), 1, static_cast<int64_t>(padded.size()), &q, nullptr);
  const auto* blocks = reinterpret_cast<const quant::BlockQ8_K*>(q.data.data());
  for (uint32_t b = 0; b < n_blocks; ++b, dst += kQ8KBlockBytes) {
    std::memcpy(dst, &blocks[b].d, 4);
    std::memcpy(dst + 4, blocks[b].qs, kQ8KBlockSize);
  }
}

void q8k_decode_row(const uint8_t* src, uint32_t n, float* dst) {
  for (uint32_t b0 = 0; b0 < n; b0 += kQ8KBlockSize, src += kQ8KBlockBytes) {
    const uint32_t len = std::min(kQ8KBlockSize, n - b0);
    float d;
    std::memcpy(&d, src, 4);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 4);
    for (uint32_t j = 0; j < len; ++j) dst[b0 + j] = d * static_cast<float>(q[j]);
  }
}

void q8k_row_to_blocks(const uint8_t* src, uint32_t n, void* dst) {
  auto* blocks = static_cast<quant::BlockQ8_K*>(dst);
  const uint32_t n_blocks = (n + kQ8KBlockSize - 1) / kQ8KBlockSize;
  for (uint32_t b = 0; b < n_blocks; ++b, src += kQ8KBlockBytes) {
    quant::BlockQ8_K& blk = blocks[b];
    std::memcpy(&blk.d, src, 4);
    std::memcpy(blk.qs, src + 4, kQ8KBlockSize);
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += blk.qs[16 * g + l];
      blk.bsums[g] = static_cast<int16_t>(s);
    }
  }
}

Result<WireRows> encode_rows(WireDType t, const float* src, uint32_t n_rows, uint32_t n_cols) {
  if (static_cast<uint8_t>(t) >= static_cast<uint8_t>(WireDType::kCOUNT))
    return make_error(StatusCode::kInvalidArgument, "unknown wire dtype {}", static_cast<int>(t));
  WireRows out;
  out.dtype = t;
  out.n_rows = n_rows;
  out.n_cols = n_cols;
  const size_t row_bytes = wire_row_bytes(t, n_cols);
  out.bytes.resize(row_bytes * n_rows);
  for (uint32_t r = 0; r < n_rows; ++r) {
    const float* x = src + size_t{r} * n_cols;
    uint8_t* dst = out.bytes.data() + row_bytes * r;
    switch (t) {
      case WireDType::kF32:
        std::memcpy(dst, x, row_bytes);
        break;
      case WireDType::kF16:
        for (uint32_t c = 0; c < n_cols; ++c) {
          const uint16_t h = fp32_to_fp16(x[c]);
          // A finite value that became inf would silently corrupt the peer's result.
          if ((h & 0x7c00u) == 0x7c00u && std::isfinite(x[c]))
            return make_error(StatusCode::kOutOfRange, "value {} at row {} column {} overflows f16", x[c], r, c);
          std::memcpy(dst + 2 * c, &h, 2);
        }
        break;
      case WireDType::kBF16:
        for (uint32_t c = 0; c < n_cols; ++c) {
          const uint16_t h = fp32_to_bf16(x[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
        break;
      case WireDType::kQ8K:
        for (uint32_t c = 0; c < n_cols; ++c)
          if (!std::isfinite(x[c]))
            return make_error(StatusCode::kInvalidArgument,
                              "non-finite value at row {} column {} cannot be encoded as q8k", r, c);
        // d = -max/127 of a finite max is finite; nothing else can overflow.
        q8k_encode_row(x, n_cols, dst);
        break;
      case WireDType::kQ8:
        for (uint32_t c = 0; c < n_cols; ++c)
          if (!std::isfinite(x[c]))
            return make_error(StatusCode::kInvalidArgument,
                              "non-finite value at row {} column {} cannot be encoded as q8", r, c);
        q8_encode_row(x, n_cols, dst);
        for (size_t b = 0; b < row_bytes; b += kQ8BlockBytes) {
          uint16_t dh;
          std::memcpy(&dh, dst + b, 2);
          if ((dh & 0x7c00u) == 0x7c00u)
            return make_error(StatusCode::kOutOfRange, "q8 block scale of row {} block {} overflows f16", r,
                              b / kQ8BlockBytes);
        }
        break;
      case WireDType::kCOUNT:
        break;
    }
  }
  return out;
}

void decode_row(const WireRows& rows, uint32_t r, float* dst) {
  const size_t row_bytes = wire_row_bytes(rows.dtype, rows.n_cols);
  const uint8_t* src = rows.bytes.data() + row_bytes * r;
  const uint32_t n = rows.n_cols;
  switch (rows.dtype) {
    case WireDType::kF32:
      std::memcpy(dst, src, row_bytes);
      break;
    case WireDType::kF16:
      for (uint32_t c = 0; c < n; ++c) {
        uint16_t h;
        std::memcpy(&h, src + 2 * c, 2);
        dst[c] = fp16_to_fp32(h);
      }
      break;
    case WireDType::kBF16:
      for (uint32_t c = 0; c < n; ++c) {
        uint16_t h;
        std::memcpy(&h, src + 2 * c, 2);
        dst[c] = bf16_to_fp32(h);
      }
      break;
    case WireDType::kQ8:
      q8_decode_row(src, n, dst);
      break;
    case WireDType::kQ8K:
      q8k_decode_row(src, n, dst);
      break;
    case WireDType::kCOUNT:
      break;
  }
}

void decode_rows(const WireRows& rows, float* dst) {
  for (uint32_t r = 0; r < rows.n_rows; ++r) decode_row(rows, r, dst + size_t{r} * rows.n_cols);
}

Status check_rows_finite(const WireRows& rows) {
  const size_t row_bytes = wire_row_bytes(rows.dtype, rows.n_cols);
  for (uint32_t r = 0; r < rows.n_rows; ++r) {
    const uint8_t* src = rows.bytes.data() + row_bytes * r;
    switch (rows.dtype) {
      case WireDType::kF32:
        for (uint32_t c = 0; c < rows.n_cols; ++c) {
          uint32_t u;
          std::memcpy(&u, src + 4 * c, 4);
          if ((u & 0x7f800000u) == 0x7f800000u)
            return make_error(StatusCode::kCorrupt, "non-finite f32 at row {} column {}", r, c);
        }
        break;
      case WireDType::kF16:
      case WireDType::kBF16: {
        const uint16_t exp_mask = rows.dtype == WireDType::kF16 ? 0x7c00u : 0x7f80u;
        for (uint32_t c = 0; c < rows.n_cols; ++c) {
          uint16_t h;
          std::memcpy(&h, src + 2 * c, 2);
          if ((h & exp_mask) == exp_mask)
            return make_error(StatusCode::kCorrupt, "non-finite {} at row {} column {}", wire_dtype_name(rows.dtype), r,
                              c);
        }
        break;
      }
      case WireDType::kQ8:
        // int8 values are always finite; only the block scales can be inf/NaN.
        for (size_t b = 0; b < row_bytes; b += kQ8BlockBytes) {
          uint16_t dh;
          std::memcpy(&dh, src + b, 2);
          if ((dh & 0x7c00u) == 0x7c00u)
            return make_error(StatusCode::kCorrupt, "non-finite q8 scale at row {} block {}", r, b / kQ8BlockBytes);
        }
        break;
      case WireDType::kQ8K:
        for (size_t b = 0; b < row_bytes; b += kQ8KBlockBytes) {
          uint32_t u;
          std::memcpy(&u, src + b, 4);
          if ((u & 0x7f800000u) == 0x7f800000u)
            return make_error(StatusCode::kCorrupt, "non-finite q8k scale at row {} block {}", r, b / kQ8KBlockBytes);
        }
        break;
      case WireDType::kCOUNT:
        break;
    }
  }
  return Status::ok();
}

}  // namespace moesh::wire
