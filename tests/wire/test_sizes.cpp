// Bytes on the wire per token per layer, computed with the real encoders, checked against the
// formulas in docs/PROTOCOL.md, for n_embd 3072, top-8 with all 8 experts on one worker.
#include <gtest/gtest.h>

#include <cstdio>

#include "moesh/wire/wire.h"
#include "wire/wire_test_util.h"

namespace moesh::wire {
namespace {

struct Sizes {
  size_t dispatch, combine;
};

Sizes frame_sizes(uint32_t n_tokens, WireDType dtype, CombineMode mode, WireDType rdtype) {
  const uint32_t n_embd = 3072, k = 8;
  DispatchMsg req = testing::make_dispatch(1, 0, n_tokens, n_embd, k, dtype, mode, rdtype, 128);
  CombineMsg rep = testing::make_combine_for(req);
  return {encode_dispatch(req).value().size(), encode_combine(rep).value().size()};
}

Sizes frame_sizes(uint32_t n_tokens, WireDType dtype, CombineMode mode) {
  return frame_sizes(n_tokens, dtype, mode, dtype);
}

TEST(WireSizes, PerTokenBytesMatchTheFormulas) {
  const uint32_t n_embd = 3072, k = 8, n_small = 4, n_big = 68;  // both multiples of 4: no count padding
  std::printf("| dtype | mode | dispatch B/token | combine B/token | total B/token | fixed B/layer |\n");
  for (uint8_t d = 0; d < static_cast<uint8_t>(WireDType::kCOUNT); ++d)
    for (uint8_t mo = 0; mo < static_cast<uint8_t>(CombineMode::kCOUNT); ++mo) {
      const auto dtype = static_cast<WireDType>(d);
      const auto mode = static_cast<CombineMode>(mo);
      const Sizes one = frame_sizes(n_small, dtype, mode);
      const Sizes big = frame_sizes(n_big, dtype, mode);
      const size_t row = wire_row_bytes(dtype, n_embd);
      const size_t rows_back = mode == CombineMode::kExact ? k : 1;
      // Formula: dispatch = 32 + 24 + align4(T) + 8*pairs + T*row; combine = 32 + 24 + rows*row.
      EXPECT_EQ(one.dispatch, 32 + 24 + n_small + 8 * k * n_small + n_small * row);
      EXPECT_EQ(big.dispatch, 32 + 24 + n_big + 8 * k * n_big + n_big * row);
      EXPECT_EQ(one.combine, 32 + 24 + n_small * rows_back * row);
      EXPECT_EQ(frame_sizes(1, dtype, mode).dispatch, 32 + 24 + 4 + 8 * k + row);  // 1 count + 3 pad
      EXPECT_EQ(big.combine, 32 + 24 + n_big * rows_back * row);
      // Marginal bytes per extra token (the fixed part amortised away).
      const double disp_tok = double(big.dispatch - one.dispatch) / (n_big - n_small);
      const double comb_tok = double(big.combine - one.combine) / (n_big - n_small);
      EXPECT_DOUBLE_EQ(disp_tok, 1 + 8.0 * k + row);
      EXPECT_DOUBLE_EQ(comb_tok, double(rows_back * row));
      std::printf("| %s | %s | %.0f | %.0f | %.0f | %zu |\n", wire_dtype_name(dtype), combine_mode_name(mode), disp_tok,
                  comb_tok, disp_tok + comb_tok, one.dispatch + one.combine - n_small * size_t(disp_tok + comb_tok));
    }
  // The reference points quoted in the design: f32 exact is 12,353 + 98,304 bytes per token.
  const Sizes f32 = frame_sizes(n_big, WireDType::kF32, CombineMode::kExact);
  const Sizes f32_1 = frame_sizes(n_small, WireDType::kF32, CombineMode::kExact);
  EXPECT_EQ((f32.dispatch - f32_1.dispatch) / (n_big - n_small), 12353u);
  EXPECT_EQ((f32.combine - f32_1.combine) / (n_big - n_small), 98304u);
  // Q8 both ways with partial combine: 3,329 + 3,264 = 6,593 bytes per token, within 6.5 KiB.
  const Sizes q8 = frame_sizes(n_big, WireDType::kQ8, CombineMode::kPartial);
  const Sizes q8_1 = frame_sizes(n_small, WireDType::kQ8, CombineMode::kPartial);
  const size_t q8_tok = (q8.dispatch - q8_1.dispatch + q8.combine - q8_1.combine) / (n_big - n_small);
  EXPECT_EQ(q8_tok, 6593u);
  EXPECT_LE(q8_tok, 6656u);
}

TEST(WireSizes, Q8KHiddenWithQ8Return) {
  // "--wire q8" on k-quant experts: Q8K hidden rows (12 blocks of 260 B at n_embd 3072), Q8
  // return rows (32-value blocks).
  const uint32_t n_small = 4, n_big = 68;
  EXPECT_EQ(wire_row_bytes(WireDType::kQ8K, 3072), 3120u);
  for (CombineMode mode : {CombineMode::kExact, CombineMode::kPartial}) {
    const Sizes one = frame_sizes(n_small, WireDType::kQ8K, mode, WireDType::kQ8);
    const Sizes big = frame_sizes(n_big, WireDType::kQ8K, mode, WireDType::kQ8);
    const size_t disp_tok = (big.dispatch - one.dispatch) / (n_big - n_small);
    const size_t comb_tok = (big.combine - one.combine) / (n_big - n_small);
    EXPECT_EQ(disp_tok, 1 + 64 + 3120u);
    EXPECT_EQ(comb_tok, mode == CombineMode::kExact ? 8 * 3264u : 3264u);
    std::printf("| q8k/q8 | %s | %zu | %zu | %zu |\n", combine_mode_name(mode), disp_tok, comb_tok,
                disp_tok + comb_tok);
  }
  // Q8K hidden + Q8 partial: 3,185 + 3,264 = 6,449 B per token per layer.
  const Sizes a = frame_sizes(n_big, WireDType::kQ8K, CombineMode::kPartial, WireDType::kQ8);
  const Sizes b = frame_sizes(n_small, WireDType::kQ8K, CombineMode::kPartial, WireDType::kQ8);
  EXPECT_EQ((a.dispatch - b.dispatch + a.combine - b.combine) / (n_big - n_small), 6449u);
}

}  // namespace
}  // namespace moesh::wire
