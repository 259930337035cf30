// ExpertStore: zero-copy views of the experts a worker holds, from a full model or an expert
// slice, plus the page pre-faulting that makes a worker's resident memory ≈ its slab bytes.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "moesh/swarm/swarm.h"

namespace moesh::swarm {

namespace {

constexpr const char* kGate = "ffn_gate_exps.weight";
constexpr const char* kUp = "ffn_up_exps.weight";
constexpr const char* kDown = "ffn_down_exps.weight";

// "blk.L.ffn_gate_exps.weight@F-T" -> (L, F, T). False for any other name.
bool parse_slice_gate_name(std::string_view name, uint32_t* layer, uint32_t* first, uint32_t* last) {
  if (!name.starts_with("blk.")) return false;
  name.remove_prefix(4);
  auto num = [&](uint32_t* out) {
    auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), *out);
    if (ec != std::errc() || p == name.data()) return false;
    name.remove_prefix(static_cast<size_t>(p - name.data()));
    return true;
  };
  const std::string mid = fmt::format(".{}@", kGate);
  if (!num(layer) || !name.starts_with(mid)) return false;
  name.remove_prefix(mid.size());
  if (!num(first) || !name.starts_with("-")) return false;
  name.remove_prefix(1);
  return num(last) && name.empty() && *last >= *first;
}

Status check_triplet(const ExpertWeights& w, const ModelShape& shape) {
  MOESH_RETURN_IF_ERROR(w.validate());
  if (w.n_embd() != shape.n_embd) {
    return make_error(StatusCode::kCorrupt, "tensor '{}' has n_embd {}, the model has {}", w.gate.name, w.n_embd(),
                      shape.n_embd);
  }
  return Status::ok();
}

}  // namespace

struct ExpertStore::Region {
  void* base = nullptr;
  size_t bytes = 0;
  ~Region() {
    if (base != nullptr) ::munmap(base, bytes);
  }
};

ExpertStore::~ExpertStore() = default;

Result<std::unique_ptr<ExpertStore>> ExpertStore::open(std::unique_ptr<gguf::File> file, const ExpertSet& held,
                                                       bool hold_none) {
  std::unique_ptr<ExpertStore> s(new ExpertStore());
  const gguf::File& f = *file;
  const std::string kind = slice_kind(f);
  if (kind == kKindBackbone) {
    return make_error(StatusCode::kInvalidArgument, "{} is a backbone slice: it holds no routed experts", f.path());
  }
  MOESH_ASSIGN_OR_RETURN(s->shape_, model_shape(f));
  MOESH_ASSIGN_OR_RETURN(s->id_, model_identity(f));
  MOESH_ASSIGN_OR_RETURN(ExpertFfn ffn, expert_ffn_of(f));
  const ExpertActivation act = ffn.act;

  // What the file offers: one source block per stacked (full model) or range (slice) tensor.
  struct Source {
    uint32_t layer, first, count;
    size_t w_index;
  };
  std::vector<Source> sources;
  auto add_weights = [&](const std::string& suffix, uint32_t layer) -> Result<size_t> {
    auto w = std::make_unique<ExpertWeights>();
    const std::string p = fmt::format("blk.{}.", layer);
    MOESH_ASSIGN_OR_RETURN(w->gate, f.tensor(p + kGate + suffix));
    MOESH_ASSIGN_OR_RETURN(w->up, f.tensor(p + kUp + suffix));
    MOESH_ASSIGN_OR_RETURN(w->down, f.tensor(p + kDown + suffix));
    if (ffn.biases) {  // gpt-oss: per-expert bias rows next to the weights (a slice: its range's rows)
      MOESH_ASSIGN_OR_RETURN(w->gate_b, f.tensor(p + "ffn_gate_exps.bias" + suffix));
      MOESH_ASSIGN_OR_RETURN(w->up_b, f.tensor(p + "ffn_up_exps.bias" + suffix));
      MOESH_ASSIGN_OR_RETURN(w->down_b, f.tensor(p + "ffn_down_exps.bias" + suffix));
    }
    w->act = act;
    w->swiglu_limit = ffn.swiglu_limit_of(layer);
    w->situ_beta = ffn.situ_beta, w->situ_linear_beta = ffn.situ_linear_beta;
    MOESH_RETURN_IF_ERROR(check_triplet(*w, s->shape_));
    s->weights_.push_back(std::move(w));
    return s->weights_.size() - 1;
  };
  if (kind.empty() || kind == kKindSpan) {
    // A span slice holds its blocks' stacked tensors as a full model does.
    int32_t lo = 0, hi = static_cast<int32_t>(s->shape_.n_layer) - 1;
    if (kind == kKindSpan) {
      MOESH_ASSIGN_OR_RETURN(std::vector<int32_t> sp, f.get<std::vector<int32_t>>(kKeySpan));
      if (sp.size() != 2) return make_error(StatusCode::kCorrupt, "{}: {} is not [first, last]", f.path(), kKeySpan);
      lo = sp[0];
      hi = sp[1];
    }
    for (uint32_t l : s->shape_.moe_layers) {
      if (static_cast<int32_t>(l) < lo || static_cast<int32_t>(l) > hi) continue;
      MOESH_ASSIGN_OR_RETURN(size_t wi, add_weights("", l));
      if (s->weights_[wi]->n_expert() != s->shape_.n_expert) {
        return make_error(StatusCode::kCorrupt, "tensor '{}' stacks {} experts, the model has {}",
                          s->weights_[wi]->gate.name, s->weights_[wi]->n_expert(), s->shape_.n_expert);
      }
      sources.push_back({l, 0, s->shape_.n_expert, wi});
    }
  } else {
    for (const auto& t : f.tensors()) {
      uint32_t l, a, b;
      if (!parse_slice_gate_name(t.name, &l, &a, &b)) continue;
      if (!s->shape_.is_moe(l) || b >= s->shape_.n_expert) {
        return make_error(StatusCode::kCorrupt, "slice tensor '{}' is outside the model's experts", t.name);
      }
      MOESH_ASSIGN_OR_RETURN(size_t wi, add_weights(fmt::format("@{}-{}", a, b), l));
      if (s->weights_[wi]->n_expert() != int64_t{b} - a + 1) {
        return make_error(StatusCode::kCorrupt, "slice tensor '{}' stacks {} experts, its name says {}", t.name,
                          s->weights_[wi]->n_expert(), b - a + 1);
      }
      sources.push_back({l, a, b - a + 1, wi});
    }
  }
  std::vector<wire::ExpertRange> avail_ranges;
  for (const auto& src : sources) avail_ranges.push_back({src.layer, src.first, src.count});
  const ExpertSet available = canonicalize(avail_ranges);
  s->held_ = hold_none ? ExpertSet{} : held.empty() ? available : held;
  if (s->held_.empty() && !hold_none) return make_error(StatusCode::kNotFound, "{} holds no experts", f.path());
  if (!available.contains(s->held_)) {
    for (const auto& r : s->held_.ranges) {
      for (uint32_t e = r.first; e < r.first + r.count; ++e) {
        if (!available.holds(r.layer, e)) {
          return make_error(StatusCode::kNotFound, "{} does not hold layer {} expert {} (it holds {})", f.path(),
                            r.layer, e, available.to_string());
        }
      }
    }
  }

  // Blocks = held ranges intersected with the sources.
  for (const auto& r : s->held_.ranges) {
    for (const auto& src : sources) {
      if (src.layer != r.layer) continue;
      const uint32_t lo = std::max(r.first, src.first);
      const uint32_t hi = std::min(r.first + r.count, src.first + src.count);
      if (lo >= hi) continue;
      s->blocks_.push_back({r.layer, lo, hi - lo, int64_t{lo} - src.first, src.w_index});
    }
  }
  std::sort(s->blocks_.begin(), s->blocks_.end(),
            [](const Block& a, const Block& b) { return a.layer != b.layer ? a.layer < b.layer : a.first < b.first; });

  for (const Block& b : s->blocks_) {
    const ExpertWeights& w = *s->weights_[b.w_index];
    const TensorView* ts[6] = {&w.gate, &w.up, &w.down, &w.gate_b, &w.up_b, &w.down_b};
    for (const TensorView* t : ts) {
      if (!t->valid()) continue;
      const bool bias = t->n_dims == 2;  // a bias tensor: one row per expert
      const size_t slab = bias ? t->nb[1] : expert_slab_bytes(*t);
      const int64_t n_stack = bias ? t->ne[1] : t->ne[2];
      if (!bias) s->slab_bytes_ += uint64_t{b.count} * slab;
      if (kind.empty()) continue;
      // A slice carries a hash per slab: a damaged or tampered slice must not serve wrong numbers.
      const std::string key = kKeyHashPrefix + t->name;
      auto hashes = f.get<std::vector<uint64_t>>(key);
      if (!hashes) return hashes.status().with_context("slab hashes of " + f.path());
      if (static_cast<int64_t>(hashes->size()) != n_stack) {
        return make_error(StatusCode::kCorrupt, "{} has {} hashes for {} experts", key, hashes->size(), n_stack);
      }
      for (uint32_t i = 0; i < b.count; ++i) {
        const int64_t idx = b.index_base + i;
        const size_t off = bias ? static_cast<size_t>(idx) * t->nb[1] : expert_slab_offset(*t, idx);
        const uint64_t h = slab_hash(t->data + off, slab);
        if (h != (*hashes)[static_cast<size_t>(idx)]) {
          return make_error(StatusCode::kCorrupt,
                            "{}: slab of layer {} expert {} in tensor '{}' fails its hash "
                            "(stored {:016x}, computed {:016x}); the slice is damaged",
                            f.path(), b.layer, b.first + i, t->name, (*hashes)[static_cast<size_t>(idx)], h);
        }
      }
    }
  }
  s->file_ = std::move(file);
  return s;
}

ExpertStore::Slot ExpertStore::find(uint32_t layer, uint32_t expert) const {
  auto it = std::upper_bound(blocks_.begin(), blocks_.end(), std::pair{layer, expert},
                             [](const std::pair<uint32_t, uint32_t>& k, const Block& b) {
                               return k.first != b.layer ? k.first < b.layer : k.second < b.first;
                             });
  if (it == blocks_.begin()) return {};
  --it;
  if (it->layer != layer || expert < it->first || expert >= it->first + it->count) return {};
  return {weights_[it->w_index].get(), it->index_base + (expert - it->first)};
}

Status ExpertStore::absorb(std::unique_ptr<ExpertStore> other) {
  if (other->id_ != id_) {
    return make_error(StatusCode::kInvalidArgument, "{} is of model {}, this store's is {}", other->file().path(),
                      other->id_.hex(), id_.hex());
  }
  for (const wire::ExpertRange& r : other->held_.ranges) {
    for (uint32_t e = r.first; e < r.first + r.count; ++e) {
      if (held_.holds(r.layer, e))
        return make_error(StatusCode::kInvalidArgument, "layer {} expert {} is already held", r.layer, e);
    }
  }
  const size_t base = weights_.size();
  for (auto& w : other->weights_) weights_.push_back(std::move(w));
  for (Block b : other->blocks_) {
    b.w_index += base;
    blocks_.push_back(b);
  }
  std::sort(blocks_.begin(), blocks_.end(),
            [](const Block& a, const Block& b) { return a.layer != b.layer ? a.layer < b.layer : a.first < b.first; });
  std::vector<wire::ExpertRange> ranges = held_.ranges;
  ranges.insert(ranges.end(), other->held_.ranges.begin(), other->held_.ranges.end());
  held_ = canonicalize(std::move(ranges));
  slab_bytes_ += other->slab_bytes_;
  absorbed_.push_back(std::move(other));
  return Status::ok();
}

Result<std::unique_ptr<ExpertStore>> ExpertStore::release(uint32_t layer, uint32_t expert) {
  if (!held_.holds(layer, expert))
    return make_error(StatusCode::kNotFound, "layer {} expert {} is not held (this store holds {})", layer, expert,
                      held_.to_string());
  auto it = std::find_if(absorbed_.begin(), absorbed_.end(),
                         [&](const std::unique_ptr<ExpertStore>& r) { return r->held_.holds(layer, expert); });
  if (it == absorbed_.end())
    return make_error(StatusCode::kUnsupported, "layer {} expert {} is part of {}, not a replica", layer, expert,
                      file_ != nullptr ? file_->path() : std::string("this store's own file"));
  if ((*it)->held_.n_pairs() != 1)
    return make_error(StatusCode::kUnsupported,
                      "layer {} expert {} is in replica {} with {} other experts ({}): it is let go of only whole",
                      layer, expert, (*it)->file().path(), (*it)->held_.n_pairs() - 1, (*it)->held_.to_string());
  // Its block (one expert) goes from the table; the weights it pointed at are no longer referenced.
  // After load_into_memory the block may point into the region instead: that copy stays allocated
  // (the region is one mapping), the replica's file is still unmapped.
  for (auto b = blocks_.begin(); b != blocks_.end();) {
    if (b->layer == layer && b->first == expert && b->count == 1) {
      weights_[b->w_index].reset();
      b = blocks_.erase(b);
    } else {
      ++b;
    }
  }
  std::vector<wire::ExpertRange> left;
  for (const wire::ExpertRange& r : held_.ranges) {
    if (r.layer != layer || expert < r.first || expert >= r.first + r.count) {
      left.push_back(r);
      continue;
    }
    if (expert > r.first) left.push_back({r.layer, r.first, expert - r.first});
    if (expert + 1 < r.first + r.count) left.push_back({r.layer, expert + 1, r.first + r.count - expert - 1});
  }
  held_ = canonicalize(std::move(left));
  slab_bytes_ -= std::min(slab_bytes_, (*it)->slab_bytes_);
  std::unique_ptr<ExpertStore> out = std::move(*it);
  absorbed_.erase(it);
  return out;
}

void ExpertStore::prefault() const {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  volatile uint8_t sink = 0;
  for (const Block& b : blocks_) {
    const ExpertWeights& w = *weights_[b.w_index];
    const TensorView* ts[3] = {&w.gate, &w.up, &w.down};
    for (const TensorView* t : ts) {
      const uint8_t* p0 = t->data + expert_slab_offset(*t, b.index_base);
      const size_t n = size_t{b.count} * expert_slab_bytes(*t);
      const uintptr_t a0 = reinterpret_cast<uintptr_t>(p0) & ~(uintptr_t{page} - 1);
      const uintptr_t a1 = reinterpret_cast<uintptr_t>(p0) + n;
      (void)::madvise(reinterpret_cast<void*>(a0), a1 - a0, MADV_WILLNEED);
      // Read one byte per page: WILLNEED only starts read-ahead, the reads map the pages.
      for (uintptr_t a = std::max(a0, reinterpret_cast<uintptr_t>(p0)); a < a1;
           a = (a & ~(uintptr_t{page} - 1)) + page) {
        sink = sink + *reinterpret_cast<const uint8_t*>(a);
      }
    }
  }
  (void)sink;
}

Status ExpertStore::load_into_memory() {
  if (region_ != nullptr) return Status::ok();
  constexpr size_t kAlign = 64;  // every copied slab run starts on a cache line
  auto tensors_of = [](ExpertWeights& w) {
    return std::array<TensorView*, 6>{&w.gate, &w.up, &w.down, &w.gate_b, &w.up_b, &w.down_b};
  };
  // A block's run of experts in tensor t: its bytes and where it starts in the source.
  auto run_of = [](const TensorView& t, const Block& b) {
    const bool bias = t.n_dims == 2;  // one row per expert
    const size_t slab = bias ? t.nb[1] : expert_slab_bytes(t);
    const size_t off = bias ? static_cast<size_t>(b.index_base) * t.nb[1] : expert_slab_offset(t, b.index_base);
    return std::pair<size_t, size_t>{off, size_t{b.count} * slab};
  };
  size_t total = 0;
  for (const Block& b : blocks_) {
    for (TensorView* t : tensors_of(*weights_[b.w_index])) {
      if (t->valid()) total += (run_of(*t, b).second + kAlign - 1) & ~(kAlign - 1);
    }
  }
  if (total == 0) return Status::ok();
  auto r = std::make_unique<Region>();
  void* a = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) {
    const int err = errno;
    return make_error(StatusCode::kIoError, "cannot allocate {} bytes for the held slabs: {}", total,
                      std::strerror(err));
  }
  r->base = a;
  r->bytes = total;
#if defined(MADV_HUGEPAGE)
  (void)::madvise(a, total, MADV_HUGEPAGE);  // a hint: without THP the copy still works
#endif
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const bool mapped_file = file_ != nullptr && !file_->in_memory() && file_->size() > 0;
  auto* dst = static_cast<uint8_t*>(a);
  std::vector<Block> blocks = blocks_;
  std::vector<std::unique_ptr<ExpertWeights>> copies;  // one per block, pointing into the region
  for (Block& b : blocks) {
    auto w = std::make_unique<ExpertWeights>(*weights_[b.w_index]);
    for (TensorView* t : tensors_of(*w)) {
      if (!t->valid()) continue;
      const auto [off, n] = run_of(*t, b);
      const uint8_t* src = t->data + off;
      std::memcpy(dst, src, n);
      if (t->n_dims == 2) {
        t->ne[1] = b.count;
        t->nb[2] = t->nb[1] * static_cast<size_t>(t->ne[1]);
      } else {
        t->ne[2] = b.count;
      }
      t->nb[3] = t->nb[2] * static_cast<size_t>(t->ne[2]);
      t->data = dst;
      dst += (n + kAlign - 1) & ~(kAlign - 1);
      // Drop the file's pages of this run from our mapping (they refault from the page cache if
      // ever read again): only whole pages inside the run, and never an anonymous copy of the
      // file (there DONTNEED would zero the bytes).
      if (mapped_file) {
        const uintptr_t p0 = (reinterpret_cast<uintptr_t>(src) + page - 1) & ~(uintptr_t{page} - 1);
        const uintptr_t p1 = (reinterpret_cast<uintptr_t>(src) + n) & ~(uintptr_t{page} - 1);
        if (p1 > p0) (void)::madvise(reinterpret_cast<void*>(p0), p1 - p0, MADV_DONTNEED);
      }
    }
    b.index_base = 0;
    b.w_index = weights_.size() + copies.size();
    copies.push_back(std::move(w));
  }
  (void)::mprotect(a, total, PROT_READ);  // weights are never written
  // The copies go after the file's views, which stay valid (nothing points at them any more).
  for (auto& w : copies) weights_.push_back(std::move(w));
  blocks_ = std::move(blocks);
  region_ = std::move(r);
  return Status::ok();
}

}  // namespace moesh::swarm
