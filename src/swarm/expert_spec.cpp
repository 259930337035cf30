// Expert specs (`--experts`): parsing against a model shape, canonical sets, and the model shape
// itself. The canonical form (sorted, merged) is what HELLOs carry and what slices record.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "moesh/model/model.h"
#include "moesh/swarm/swarm.h"

namespace moesh::swarm {

bool ModelShape::is_moe(uint32_t layer) const {
  return std::binary_search(moe_layers.begin(), moe_layers.end(), layer);
}

Result<ModelShape> model_shape(const gguf::File& f) {
  MOESH_ASSIGN_OR_RETURN(HParams hp, load_hparams(f));
  ModelShape s;
  s.n_layer = static_cast<uint32_t>(hp.n_layer);
  s.n_expert = static_cast<uint32_t>(hp.n_expert);
  s.n_embd = static_cast<uint32_t>(hp.n_embd_exp());  // the experts' row width (latent MoE: the latent)
  s.expert_ffn = hp.expert_ffn;
  if (f.has(kKeyMoeLayers)) {
    MOESH_ASSIGN_OR_RETURN(std::vector<int32_t> ls, f.get<std::vector<int32_t>>(kKeyMoeLayers));
    for (int32_t l : ls) {
      if (l < 0 || static_cast<uint32_t>(l) >= s.n_layer) {
        return make_error(StatusCode::kCorrupt, "{}: layer {} out of range (n_layer {})", kKeyMoeLayers, l, s.n_layer);
      }
      s.moe_layers.push_back(static_cast<uint32_t>(l));
    }
  } else {
    for (uint32_t l = 0; l < s.n_layer; ++l) {
      if (f.find_tensor(fmt::format("blk.{}.ffn_gate_exps.weight", l)) != nullptr) {
        s.moe_layers.push_back(l);
      }
    }
  }
  std::sort(s.moe_layers.begin(), s.moe_layers.end());
  s.moe_layers.erase(std::unique(s.moe_layers.begin(), s.moe_layers.end()), s.moe_layers.end());
  if (s.moe_layers.empty() || s.n_expert == 0) {
    return make_error(StatusCode::kInvalidArgument, "{}: the model has no routed experts", f.path());
  }
  return s;
}

// ---- ExpertSet --------------------------------------------------------------------------------

ExpertSet canonicalize(std::vector<wire::ExpertRange> ranges) {
  std::erase_if(ranges, [](const wire::ExpertRange& r) { return r.count == 0; });
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.layer != b.layer ? a.layer < b.layer : a.first < b.first; });
  ExpertSet out;
  for (const auto& r : ranges) {
    if (!out.ranges.empty()) {
      wire::ExpertRange& last = out.ranges.back();
      const uint64_t end = uint64_t{last.first} + last.count;
      if (last.layer == r.layer && r.first <= end) {  // overlapping or adjacent: merge
        const uint64_t new_end = std::max<uint64_t>(end, uint64_t{r.first} + r.count);
        last.count = static_cast<uint32_t>(new_end - last.first);
        continue;
      }
    }
    out.ranges.push_back(r);
  }
  return out;
}

bool ExpertSet::holds(uint32_t layer, uint32_t expert) const {
  // Last range starting at or before (layer, expert).
  auto it = std::upper_bound(ranges.begin(), ranges.end(), std::pair{layer, expert},
                             [](const std::pair<uint32_t, uint32_t>& k, const wire::ExpertRange& r) {
                               return k.first != r.layer ? k.first < r.layer : k.second < r.first;
                             });
  if (it == ranges.begin()) return false;
  --it;
  return it->layer == layer && expert >= it->first && uint64_t{expert} < uint64_t{it->first} + it->count;
}

bool ExpertSet::contains(const ExpertSet& other) const {
  for (const auto& r : other.ranges) {
    // Canonical sets merge adjacent ranges, so a contained range lies inside one held range.
    bool inside = false;
    for (const auto& h : ranges) {
      if (h.layer == r.layer && h.first <= r.first && uint64_t{r.first} + r.count <= uint64_t{h.first} + h.count) {
        inside = true;
        break;
      }
    }
    if (!inside) return false;
  }
  return true;
}

uint64_t ExpertSet::n_pairs() const {
  uint64_t n = 0;
  for (const auto& r : ranges) n += r.count;
  return n;
}

std::string ExpertSet::to_string() const {
  // Consecutive layers holding the same experts share one item ("0-47:0-31", not 48 items); the
  // parser reads either form back to the same set.
  std::string s;
  size_t i = 0;
  while (i < ranges.size()) {
    size_t j = i;
    while (j < ranges.size() && ranges[j].layer == ranges[i].layer) ++j;  // [i, j): one layer
    uint32_t last = ranges[i].layer;
    size_t next = j;
    while (next < ranges.size() && ranges[next].layer == last + 1) {
      size_t k = next;
      while (k < ranges.size() && ranges[k].layer == ranges[next].layer) ++k;
      bool same = k - next == j - i;
      for (size_t q = 0; same && q < j - i; ++q) {
        same = ranges[next + q].first == ranges[i + q].first && ranges[next + q].count == ranges[i + q].count;
      }
      if (!same) break;
      last = ranges[next].layer;
      next = k;
    }
    const std::string layers =
        last == ranges[i].layer ? fmt::format("{}", last) : fmt::format("{}-{}", ranges[i].layer, last);
    for (size_t q = i; q < j; ++q) {
      const auto& r = ranges[q];
      if (!s.empty()) s += ',';
      if (r.count == 1)
        s += fmt::format("{}:{}", layers, r.first);
      else
        s += fmt::format("{}:{}-{}", layers, r.first, r.first + r.count - 1);
    }
    i = next;
  }
  return s;
}

// ---- parsing ----------------------------------------------------------------------------------

namespace {

struct Side {
  bool all = false;
  uint32_t lo = 0, hi = 0;  // inclusive
};

Result<uint32_t> parse_number(std::string_view t, std::string_view item) {
  uint32_t v = 0;
  const char* b = t.data();
  const char* e = t.data() + t.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (t.empty() || ec != std::errc() || p != e) {
    return make_error(StatusCode::kInvalidArgument, "expert spec item '{}': '{}' is not a number", item, t);
  }
  return v;
}

Result<Side> parse_side(std::string_view t, std::string_view item) {
  Side s;
  if (t == "*") {
    s.all = true;
    return s;
  }
  const size_t dash = t.find('-');
  if (dash == std::string_view::npos) {
    MOESH_ASSIGN_OR_RETURN(s.lo, parse_number(t, item));
    s.hi = s.lo;
    return s;
  }
  MOESH_ASSIGN_OR_RETURN(s.lo, parse_number(t.substr(0, dash), item));
  MOESH_ASSIGN_OR_RETURN(s.hi, parse_number(t.substr(dash + 1), item));
  if (s.hi < s.lo) {
    return make_error(StatusCode::kInvalidArgument, "expert spec item '{}': range {}-{} is reversed", item, s.lo, s.hi);
  }
  return s;
}

std::string_view trim(std::string_view t) {
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  return t;
}

}  // namespace

Result<ExpertSet> parse_expert_spec(std::string_view spec, const ModelShape& shape) {
  std::vector<wire::ExpertRange> ranges;
  if (trim(spec).empty()) return make_error(StatusCode::kInvalidArgument, "expert spec is empty");
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string_view::npos) comma = spec.size();
    const std::string_view item = trim(spec.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) {
      return make_error(StatusCode::kInvalidArgument, "expert spec '{}' has an empty item", spec);
    }
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos || item.find(':', colon + 1) != std::string_view::npos) {
      return make_error(StatusCode::kInvalidArgument, "expert spec item '{}' must be LAYERS:EXPERTS (e.g. '0-23:*')",
                        item);
    }
    MOESH_ASSIGN_OR_RETURN(Side ls, parse_side(trim(item.substr(0, colon)), item));
    MOESH_ASSIGN_OR_RETURN(Side es, parse_side(trim(item.substr(colon + 1)), item));
    if (ls.all) {
      ls.lo = 0;
      ls.hi = shape.n_layer - 1;
    } else if (ls.hi >= shape.n_layer) {
      return make_error(StatusCode::kInvalidArgument,
                        "expert spec item '{}': layer {} out of range (the model has {} layers)", item, ls.hi,
                        shape.n_layer);
    }
    if (es.all) {
      es.lo = 0;
      es.hi = shape.n_expert - 1;
    } else if (es.hi >= shape.n_expert) {
      return make_error(StatusCode::kInvalidArgument,
                        "expert spec item '{}': expert {} out of range (the model has {} experts per layer)", item,
                        es.hi, shape.n_expert);
    }
    bool any = false;
    for (uint32_t l = ls.lo; l <= ls.hi; ++l) {
      if (!shape.is_moe(l)) continue;
      any = true;
      ranges.push_back({l, es.lo, es.hi - es.lo + 1});
    }
    if (!any) {
      return make_error(StatusCode::kInvalidArgument,
                        "expert spec item '{}': no MoE layer in layers {}-{} (they are dense)", item, ls.lo, ls.hi);
    }
  }
  return canonicalize(std::move(ranges));
}

Result<ExpertSet> expert_set_from_ranges(const std::vector<wire::ExpertRange>& ranges, const ModelShape& shape) {
  for (const auto& r : ranges) {
    if (r.count == 0 || r.layer >= shape.n_layer || !shape.is_moe(r.layer) ||
        uint64_t{r.first} + r.count > shape.n_expert) {
      return make_error(StatusCode::kInvalidArgument,
                        "expert range layer {} experts [{}, {}) is not valid for this model "
                        "({} layers, {} experts, MoE layers only)",
                        r.layer, r.first, uint64_t{r.first} + r.count, shape.n_layer, shape.n_expert);
    }
  }
  return canonicalize(ranges);
}

}  // namespace moesh::swarm
