// libFuzzer target: a GGUF image (a model file or a slice sent over the wire). Whatever the
// bytes: no crash, no undefined behaviour, no read outside the image — parse, then read every
// key as each type and view every tensor, touching its first and last byte.
#include <cstdint>
#include <string>
#include <vector>

#include "moesh/gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = moesh::gguf::File::from_bytes(std::vector<uint8_t>(data, data + size));
  if (!f.is_ok()) return 0;
  const moesh::gguf::File& file = **f;
  uint64_t sink = 0;
  for (const auto& [key, value] : file.kvs()) {
    (void)value;
    if (auto s = file.get<std::string>(key); s.is_ok()) sink += s->size();
    if (auto i = file.get<int64_t>(key); i.is_ok()) sink += static_cast<uint64_t>(*i);
    if (auto d = file.get<double>(key); d.is_ok()) sink += *d > 0 ? 1 : 0;
    if (auto v = file.get<std::vector<int64_t>>(key); v.is_ok()) sink += v->size();
    if (auto v = file.get<std::vector<std::string>>(key); v.is_ok()) sink += v->size();
  }
  for (const auto& t : file.tensors()) {
    const moesh::TensorView v = file.view(t);
    if (t.n_bytes > 0 && v.data != nullptr) sink += v.data[0] + v.data[t.n_bytes - 1];
  }
  // Keeps the reads from being optimised away.
  asm volatile("" : : "r"(sink));
  return 0;
}
