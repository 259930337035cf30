// Writes tests/tensor/data/ggml_mul_mat.bin: for every quantized weight type moesh runs, random
// weights quantized by ggml, random activations, and what ggml's CPU backend (built as llama.cpp
// builds it for an x86 AVX2 host: llamafile/tinyBLAS on, no repacking) computes for
// ggml_mul_mat(W, X) on one thread. tests/tensor/test_ggml_vectors.cpp checks every moesh kernel
// table against these bits. Not part of the build: see README.md here.
//
// File: "MOESHGGV1" then u32 n_cases; per case u32 type, K, N, T, then the N weight rows
// (ggml's block bytes), X as T rows of K floats, Y as T rows of N floats (little-endian).
#include <ggml-cpu.h>
#include <ggml.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static double uniform01(void) {  // splitmix64
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}
static float gauss(void) {  // sum of 4 uniforms, centred: bell-shaped, no libm
  return (float)((uniform01() + uniform01() + uniform01() + uniform01() - 2.0) * 1.7);
}

static void put_u32(FILE* f, uint32_t v) { fwrite(&v, 4, 1, f); }

static void write_case(FILE* f, enum ggml_type type, int K, int N, int T) {
  float* wf = malloc(sizeof(float) * (size_t)K * N);
  float* xf = malloc(sizeof(float) * (size_t)K * T);
  for (int i = 0; i < K * N; ++i) wf[i] = gauss() * 0.05f * (i % 37 == 0 ? 6.0f : 1.0f);
  for (int i = 0; i < K * T; ++i) xf[i] = gauss() * (i % 53 == 0 ? 8.0f : 1.0f);
  struct ggml_init_params ip = {64u << 20, NULL, false};
  struct ggml_context* ctx = ggml_init(ip);
  struct ggml_tensor* w = ggml_new_tensor_2d(ctx, type, K, N);
  ggml_quantize_chunk(type, wf, w->data, 0, N, K, NULL);
  struct ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, T);
  memcpy(x->data, xf, sizeof(float) * (size_t)K * T);
  struct ggml_tensor* y = ggml_mul_mat(ctx, w, x);
  struct ggml_cgraph* gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, y);
  ggml_graph_compute_with_ctx(ctx, gf, 1);
  put_u32(f, (uint32_t)type);
  put_u32(f, (uint32_t)K);
  put_u32(f, (uint32_t)N);
  put_u32(f, (uint32_t)T);
  fwrite(w->data, 1, ggml_row_size(type, K) * N, f);
  fwrite(xf, sizeof(float), (size_t)K * T, f);
  fwrite(y->data, sizeof(float), (size_t)N * T, f);
  ggml_free(ctx);
  free(wf);
  free(xf);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT.bin\n", argv[0]);
    return 2;
  }
  const enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                                  GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
                                  GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
  const int n_types = (int)(sizeof types / sizeof types[0]);
  FILE* f = fopen(argv[1], "wb");
  if (f == NULL) {
    perror(argv[1]);
    return 1;
  }
  fwrite("MOESHGGV1", 1, 9, f);
  // One token (ggml's vec_dot) and four (tinyBLAS where it takes the type, else vec_dot). IQ4_NL's
  // one-token vec_dot sums in another order than its tinyBLAS batch path; moesh keeps the batch
  // order for every count, so IQ4_NL has the four-token case only. 32-element block types also
  // get K = 96 (an odd number of blocks: MXFP4's vec_dot ends with a lone block).
  uint32_t n_cases = 0;
  for (int i = 0; i < n_types; ++i) {
    const int legacy = ggml_blck_size(types[i]) == 32;
    n_cases += (types[i] == GGML_TYPE_IQ4_NL ? 1 : 2) * (legacy ? 2 : 1);
  }
  put_u32(f, n_cases);
  for (int i = 0; i < n_types; ++i) {
    const int legacy = ggml_blck_size(types[i]) == 32;
    for (int k = 0; k < (legacy ? 2 : 1); ++k) {
      const int K = k == 0 ? 512 : 96;
      if (types[i] != GGML_TYPE_IQ4_NL) write_case(f, types[i], K, 8, 1);
      write_case(f, types[i], K, 8, 4);
    }
  }
  fclose(f);
  return 0;
}
