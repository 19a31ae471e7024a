#include "core/layers/layer.h"

namespace tandem {

Param makeParam(Backend& backend, std::string name, const Shape& shape,
                const std::vector<float>& init) {
  Param p;
  p.name = std::move(name);
  p.value = toDevice(backend, shape, init);
  p.grad = backend.zeros(shape);
  return p;
}

std::vector<float> uniformInit(Rng& rng, int64_t n, float bound) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.uniform(-bound, bound);
  return v;
}

}  // namespace tandem
