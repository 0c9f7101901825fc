// How a layer declares its weights. Each weight is written down once, in the layer that uses it:
// its name (Megatron's legacy one, relative to the layer's prefix), its whole shape, how tensor
// parallelism splits it, its initialisation and weight decay, whether it is a norm's parameter,
// and the Params / Grads fields it binds to. The model walks its layers' declarations with a
// WeightVisitor: one visitor builds the ParamTable (offsets, ZeRO's shard plans, checkpoint names),
// another binds the Params and Grads structs to a buffer laid out by that table (the FP32 master,
// its BF16 copy, the gradients, ZeRO-3's staging slots). Nothing else names a weight.
//
//   void declare_norm(const NormConfig& cfg, const WeightScope& s, NormParams* p, NormGrads* g) {
//     s({.name = "weight", .shape = {C}, .init = InitRule::kOnes, .weight_decay = false,
//        .norm = true}, slot(field(p, &NormParams::weight), field(g, &NormGrads::weight)));
//     ...
//   }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trident/core/bf16.h"
#include "trident/model/layers/layer.h"

namespace trident::model {

enum class InitRule : std::uint8_t {
  kNormal,        // N(0, init_method_std)
  kScaledNormal,  // N(0, init_method_std / sqrt(2 * num_layers)): output projections of a block
  kOnes,          // LayerNorm weights
  kZeros,         // biases
};

}  // namespace trident::model

namespace trident::model::layers {

// One weight as its layer declares it.
struct WeightDecl {
  std::string name;                 // relative to the layer's prefix, e.g. "dense_4h_to_h.weight"
  std::vector<std::int64_t> shape;  // of the whole parameter (before the tensor-parallel split)
  int tp_split = -1;                // dim split across tensor-parallel ranks; -1: replicated
  InitRule init = InitRule::kNormal;
  bool weight_decay = true;  // false for biases and norm parameters
  // A norm's parameter: under sequence parallelism each tp rank normalises only its rows, so the
  // parameter's gradient is summed over the tp group.
  bool norm = false;
  // A second copy of a weight held elsewhere (the tied word embedding on a last pipeline stage
  // without the embedding): not counted twice in the gradient norm.
  bool shared = false;
  // The word embedding an output layer is tied to, or the last stage's copy of it: with pipeline
  // parallelism its gradient is summed between the first and the last stage.
  bool tied = false;
  // Partly replicated split of dim 0 (grouped-query attention with fewer key/value groups than
  // tp ranks; ParamSpec explains it). 1: a plain split.
  int tp_replicas = 1;
  std::int64_t split_rows = 0, block_rows = 0;
  int layer = -1;  // transformer layer (global index), set by the scope; -1 outside the blocks
  // A mixture-of-experts expert weight, dim 0 the experts: split over the expert-parallel ranks.
  bool expert = false;
};

// The fields one weight binds to: its FP32 view, its BF16 copy (the matmul weights: Weight's
// bf16) and its gradient. Null: not bound (the struct is not being bound, or has no such field).
struct WeightSlot {
  const float** f32 = nullptr;
  const core::bf16** bf16 = nullptr;
  float** grad = nullptr;
};
inline WeightSlot slot(Weight* w, float** grad) {
  return {w != nullptr ? &w->f32 : nullptr, w != nullptr ? &w->bf16 : nullptr, grad};
}
inline WeightSlot slot(const float** f32, float** grad) { return {f32, nullptr, grad}; }
// &(s->*m), or null for a null struct: the declarations bind Params and Grads one at a time.
template <class S, class T>
T* field(S* s, T S::*m) {
  return s != nullptr ? &(s->*m) : nullptr;
}

class WeightVisitor {
 public:
  virtual ~WeightVisitor() = default;
  // `decl.name` is the full name (the scopes' prefixes joined).
  virtual void weight(const WeightDecl& decl, const WeightSlot& slot) = 0;
};

// Where a layer declares: the visitor, the name prefix of the layer inside the model, the
// transformer layer it belongs to and the tensor-parallel size it is split over.
class WeightScope {
 public:
  WeightScope(WeightVisitor& visitor, int tp_size) : visitor_(&visitor), tp_size_(tp_size) {}

  void operator()(WeightDecl decl, const WeightSlot& slot) const {
    decl.name.insert(0, prefix_);
    decl.layer = layer_;
    visitor_->weight(decl, slot);
  }
  // A sub-layer's scope: `prefix` (ending in '.') appended to this one's.
  WeightScope sub(std::string_view prefix) const {
    WeightScope s = *this;
    s.prefix_ += prefix;
    return s;
  }
  WeightScope in_layer(std::int64_t layer) const {
    WeightScope s = *this;
    s.layer_ = static_cast<int>(layer);
    return s;
  }
  int tp_size() const { return tp_size_; }
  int layer() const { return layer_; }  // the global layer index, -1 outside the layers

 private:
  WeightVisitor* visitor_;
  std::string prefix_;
  int layer_ = -1;
  int tp_size_ = 1;
};

}  // namespace trident::model::layers
