#include "core/model.h"

#include "core/error.h"

namespace tandem {

Model::Model(const ModelSpec& spec) : name_(spec.name), input_(spec.input), layers_(spec.layers) {
  TANDEM_CHECK_MSG(input_.rank() > 0 && input_.numel() > 0, InvalidArgument,
                   "model '" << name_ << "': input shape " << input_ << " must be non-empty");
  TANDEM_CHECK_MSG(layers_.size() > 0, InvalidArgument, "model '" << name_ << "' has no layers");
  output_ = layers_.setup(input_);
}

DType Model::inputDType() const { return layers_.layer(0).inputDType(); }

void Model::build(Backend& backend, uint64_t seed) {
  // Parameters, their gradients and up to two optimizer slots must fit on the device.
  const DeviceInfo device = backend.info();
  const double need = static_cast<double>(paramCount()) * 4.0 * 4.0;
  TANDEM_CHECK_MSG(need <= static_cast<double>(device.memory_bytes), InvalidArgument,
                   "model '" << name_ << "' has " << paramCount() << " parameters, needing "
                             << need << " bytes with gradients and optimizer state; "
                             << device.name << " has " << device.memory_bytes);
  Rng rng(seed);
  layers_.build(backend, rng);
  backend_ = &backend;
  params_ = layers_.params();
}

void Model::requireBuilt() const {
  TANDEM_CHECK_MSG(backend_ != nullptr, InvalidArgument, "model '" << name_ << "' is not built");
}

Backend& Model::backend() const {
  requireBuilt();
  return *backend_;
}

Param& Model::param(const std::string& name) const {
  for (Param* p : params_)
    if (p->name == name) return *p;
  throw InvalidArgument("model '" + name_ + "' has no parameter '" + name + "'");
}

void Model::zeroGrad() {
  for (Param* p : params_) backend_->fill(p->grad, 0.0f);
}

Tensor Model::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx, size_t begin,
                      size_t end) {
  requireBuilt();
  if (end == kEnd) end = size();
  const Shape& want = begin == 0 ? input_ : layers_.layer(begin - 1).outputShape();
  TANDEM_CHECK_MSG(x.shape().rank() == want.rank() + 1 && x.shape().dropFirst() == want,
                   InvalidArgument,
                   "model '" << name_ << "': layer " << begin << " expects a batch of " << want
                             << ", got " << x.shape());
  return layers_.forward(x, stash, ctx, begin, end);
}

Tensor Model::backward(const Tensor& dy, Stash& stash, bool need_dx, size_t begin, size_t end) {
  requireBuilt();
  if (end == kEnd) end = size();
  return layers_.backward(dy, stash, need_dx, begin, end);
}

int64_t Model::paramCount() const {
  int64_t n = 0;
  for (size_t i = 0; i < size(); ++i) n += layers_.layer(i).paramCount();
  return n;
}

ModelSpec Model::spec() const { return {name_, input_, layers_.specs()}; }

}  // namespace tandem
