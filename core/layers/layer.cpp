#include "core/layers/layer.h"

#include <set>

#include "core/error.h"

namespace tandem {

Param makeParam(Backend& backend, std::string name, const Shape& shape,
                const std::vector<float>& init) {
  Param p;
  p.name = std::move(name);
  p.value = toDevice(backend, shape, init);
  p.grad = backend.zeros(shape);
  return p;
}

Tensor Layer::decode(const Tensor& x, DecodeState& state) {
  (void)x, (void)state;
  throw Unsupported("layer '" + type() +
                    "' cannot decode token by token (a language model's layers can: embedding, "
                    "positional, attention, transformer, residual, layernorm, linear, "
                    "activations, dropout)");
}

Tensor Layer::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states) {
  TANDEM_CHECK_MSG(x.shape().rank() >= 2 && x.shape()[0] == static_cast<int64_t>(states.size()) &&
                       x.shape()[1] == 1,
                   InvalidArgument,
                   "layer '" << type() << "': decoding one token of " << states.size()
                             << " sequences expects [" << states.size() << ", 1, ...], got "
                             << x.shape());
  Tensor y;
  for (size_t b = 0; b < states.size(); ++b) {
    const auto i = static_cast<int64_t>(b);
    const Tensor one = decode(x.slice(i, 1), *states[b]);
    if (!y.defined()) y = backend_->empty(one.shape().dropFirst().withBatch(x.shape()[0]));
    backend_->copy(one, y.slice(i, 1));
  }
  return y;
}

Tensor Layer::forwardPerToken(const Tensor& x) {
  Stash stash;
  return forward(x, stash, ForwardContext{false, 0});
}

std::vector<float> uniformInit(Rng& rng, int64_t n, float bound) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(-bound, bound);
  return v;
}

std::vector<OpUse> f32Ops(bool training, std::initializer_list<Op> forward,
                          std::initializer_list<Op> backward) {
  std::vector<OpUse> out;
  for (Op op : forward) out.push_back({op, DType::kF32});
  if (training)
    for (Op op : backward) out.push_back({op, DType::kF32});
  return unionOps({out});
}

std::vector<OpUse> unionOps(const std::vector<std::vector<OpUse>>& lists) {
  std::set<OpUse> all;
  for (const auto& list : lists) all.insert(list.begin(), list.end());
  return {all.begin(), all.end()};
}

}  // namespace tandem
