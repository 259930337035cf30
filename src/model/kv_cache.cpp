// Per-sequence F32 KV cache (see include/moesh/model/kv_cache.h).
#include "moesh/model/kv_cache.h"

#include <algorithm>

namespace moesh {

KvCache::KvCache(int64_t n_layer, int64_t k_width, int64_t v_width, int64_t n_ctx)
    : n_layer_(n_layer), k_width_(k_width), v_width_(v_width), n_ctx_(n_ctx) {}

KvCache::Seq* KvCache::find(int32_t seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

const KvCache::Seq* KvCache::find(int32_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

int64_t KvCache::seq_len(int32_t seq) const {
  const Seq* s = find(seq);
  return s == nullptr ? 0 : static_cast<int64_t>(s->pos.size());
}

int64_t KvCache::seq_pos_max(int32_t seq) const {
  const Seq* s = find(seq);
  return (s == nullptr || s->pos.empty()) ? -1 : s->pos.back();
}

Result<int64_t> KvCache::append(int32_t seq, const int64_t* positions, int64_t n) {
  Seq& s = seqs_[seq];
  const int64_t first = static_cast<int64_t>(s.pos.size());
  if (first + n > n_ctx_) {
    return make_error(StatusCode::kOutOfRange, "sequence {} would hold {} cells, more than the context size {}", seq,
                      first + n, n_ctx_);
  }
  int64_t last = s.pos.empty() ? -1 : s.pos.back();
  for (int64_t i = 0; i < n; ++i) {
    if (positions[i] <= last) {
      return make_error(StatusCode::kInvalidArgument, "sequence {}: position {} does not follow position {}", seq,
                        positions[i], last);
    }
    last = positions[i];
  }
  s.pos.insert(s.pos.end(), positions, positions + n);
  const size_t need = static_cast<size_t>(first + n) * cell_stride();
  s.layers.resize(static_cast<size_t>(n_layer_));
  for (auto& l : s.layers) {
    if (l.size() < need) {
      // Grow geometrically so a long decode reallocates O(log n) times.
      l.resize(std::max(need, std::min(l.size() * 2, static_cast<size_t>(n_ctx_) * cell_stride())));
    }
  }
  return first;
}

int64_t KvCache::restorable(int32_t seq, int64_t n) const {
  return std::clamp<int64_t>(n, 0, seq_len(seq));
}

Status KvCache::truncate(int32_t seq, int64_t n_keep) {
  Seq* s = find(seq);
  if (s != nullptr && n_keep < static_cast<int64_t>(s->pos.size())) {
    s->pos.resize(static_cast<size_t>(std::max<int64_t>(0, n_keep)));
  }
  return Status::ok();
}

void KvCache::remove(int32_t seq) {
  seqs_.erase(seq);
}

Status KvCache::copy(int32_t src, int32_t dst, int64_t n) {
  if (src == dst) return make_error(StatusCode::kInvalidArgument, "copy: source and destination are both {}", src);
  const Seq* s = find(src);
  const int64_t have = s == nullptr ? 0 : static_cast<int64_t>(s->pos.size());
  if (n < 0 || n > have) {
    return make_error(StatusCode::kOutOfRange, "copy: sequence {} holds {} cells, asked for {}", src, have, n);
  }
  Seq copy;
  if (s != nullptr) {
    copy.pos.assign(s->pos.begin(), s->pos.begin() + n);
    copy.layers.resize(s->layers.size());
    for (size_t l = 0; l < s->layers.size(); ++l) {
      copy.layers[l].assign(s->layers[l].begin(),
                            s->layers[l].begin() + static_cast<ptrdiff_t>(static_cast<size_t>(n) * cell_stride()));
    }
  }
  seqs_[dst] = std::move(copy);
  return Status::ok();
}

void KvCache::clear() {
  seqs_.clear();
}

float* KvCache::k(int32_t seq, int64_t layer, int64_t cell) {
  Seq* s = find(seq);
  if (s->layers.empty()) return nullptr;  // nothing appended yet
  return s->layers[static_cast<size_t>(layer)].data() + static_cast<size_t>(cell) * cell_stride();
}

float* KvCache::v(int32_t seq, int64_t layer, int64_t cell) {
  return k(seq, layer, cell) + k_width_;
}

const int64_t* KvCache::positions(int32_t seq) const {
  const Seq* s = find(seq);
  return s == nullptr ? nullptr : s->pos.data();
}

}  // namespace moesh
