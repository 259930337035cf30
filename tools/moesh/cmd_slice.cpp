// `moesh slice`: cuts an expert slice (for workers) or a backbone slice (no routed experts) out
// of a model (docs/slice.md).
#include <cstdio>
#include <string>

#include "command.h"
#include "moesh/model/span.h"
#include "moesh/swarm/swarm.h"

namespace moesh::cli {
namespace {

struct SliceArgs {
  std::string model;
  std::string experts;
  bool backbone = false;
  std::string layers;  // --layers F-L: a span slice
  std::string out;
};

int run_slice(const SliceArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh slice: error: %s\n", s.to_string().c_str());
    return 1;
  };
  if (int(a.backbone) + int(!a.experts.empty()) + int(!a.layers.empty()) != 1) {
    return fail(
        make_error(StatusCode::kInvalidArgument, "give exactly one of --experts SPEC, --backbone or --layers F-L"));
  }
  auto file = gguf::File::open(a.model);
  if (!file) return fail(file.status());
  auto id = swarm::model_identity(**file);
  if (!id) return fail(id.status());
  if (!a.layers.empty()) {
    auto sp = parse_layer_span(a.layers);
    if (!sp) return fail(sp.status().with_context("--layers"));
    if (Status s = swarm::write_span_slice(**file, sp->first, sp->last, a.out); !s.is_ok()) return fail(s);
    std::printf("wrote span slice %s: blocks %d-%d (model id %s)\n", a.out.c_str(), sp->first, sp->last,
                id->hex().c_str());
    return 0;
  }
  if (a.backbone) {
    if (Status s = swarm::write_backbone_slice(**file, a.out); !s.is_ok()) return fail(s);
    std::printf("wrote backbone slice %s (model id %s)\n", a.out.c_str(), id->hex().c_str());
    return 0;
  }
  auto shape = swarm::model_shape(**file);
  if (!shape) return fail(shape.status());
  auto set = swarm::parse_expert_spec(a.experts, *shape);
  if (!set) return fail(set.status());
  if (Status s = swarm::write_expert_slice(**file, *set, a.out); !s.is_ok()) return fail(s);
  std::printf("wrote expert slice %s: %llu experts (%s), model id %s\n", a.out.c_str(),
              static_cast<unsigned long long>(set->n_pairs()), set->to_string().c_str(), id->hex().c_str());
  return 0;
}

const CommandRegistrar kRegisterSlice{Command{
    "slice", "Write an expert slice (--experts), a backbone slice (--backbone) or a span slice (--layers)",
    [](CLI::App* sub) -> std::function<int()> {
      auto a = std::make_shared<SliceArgs>();
      sub->add_option("-m,--model", a->model, "Model GGUF (or an expert slice to cut further)")->required();
      sub->add_option("--experts", a->experts, "Experts to keep: LAYERS:EXPERTS items, e.g. '*:0-63'");
      sub->add_flag("--backbone", a->backbone, "Keep everything except the routed expert tensors");
      sub->add_option("--layers", a->layers, "Keep blocks F-L whole (a span slice for moesh span --layers F-L)");
      sub->add_option("-o,--out", a->out, "Output GGUF")->required();
      return [a] { return run_slice(*a); };
    }}};

}  // namespace
}  // namespace moesh::cli
