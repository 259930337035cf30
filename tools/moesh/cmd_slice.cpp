// `moesh slice`: cuts an expert slice (for workers) or a backbone slice (no routed experts) out
// of a model (docs/slice.md).
#include <cstdio>
#include <string>

#include "command.h"
#include "moesh/swarm/swarm.h"

namespace moesh::cli {
namespace {

struct SliceArgs {
  std::string model;
  std::string experts;
  bool backbone = false;
  std::string out;
};

int run_slice(const SliceArgs& a) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "moesh slice: error: %s\n", s.to_string().c_str());
    return 1;
  };
  if (a.backbone == !a.experts.empty()) {
    return fail(make_error(StatusCode::kInvalidArgument, "give exactly one of --experts SPEC or --backbone"));
  }
  auto file = gguf::File::open(a.model);
  if (!file) return fail(file.status());
  auto id = swarm::model_identity(**file);
  if (!id) return fail(id.status());
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

const CommandRegistrar kReg{
    Command{"slice", "Write an expert slice (--experts) or a backbone slice (--backbone) of a model",
            [](CLI::App* sub) -> std::function<int()> {
              auto a = std::make_shared<SliceArgs>();
              sub->add_option("-m,--model", a->model, "Model GGUF (or an expert slice to cut further)")->required();
              sub->add_option("--experts", a->experts, "Experts to keep: LAYERS:EXPERTS items, e.g. '*:0-63'");
              sub->add_flag("--backbone", a->backbone, "Keep everything except the routed expert tensors");
              sub->add_option("-o,--out", a->out, "Output GGUF")->required();
              return [a] { return run_slice(*a); };
            }}};

}  // namespace
}  // namespace moesh::cli
