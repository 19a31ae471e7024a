#include "core/model.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace tandem {

std::string describe(const std::vector<LayerRange>& ranges) {
  std::ostringstream out;
  for (size_t i = 0; i < ranges.size(); ++i)
    out << (i ? ", [" : "[") << ranges[i].begin << ", " << ranges[i].end << ")";
  return out.str();
}

Model::Model(const ModelSpec& spec) : name_(spec.name), input_(spec.input), layers_(spec.layers) {
  TANDEM_CHECK_MSG(input_.rank() > 0 && input_.numel() > 0, InvalidArgument,
                   "model '" << name_ << "': input shape " << input_ << " must be non-empty");
  TANDEM_CHECK_MSG(layers_.size() > 0, InvalidArgument, "model '" << name_ << "' has no layers");
  output_ = layers_.setup(input_);
}

DType Model::inputDType() const { return layers_.layer(0).inputDType(); }

void Model::build(Backend& backend, uint64_t seed, size_t begin, size_t end) {
  if (end == kEnd) end = size();
  build(backend, seed, std::vector<LayerRange>{{begin, end}});
}

void Model::build(Backend& backend, uint64_t seed, const std::vector<LayerRange>& ranges) {
  TANDEM_CHECK_MSG(!ranges.empty(), InvalidArgument, "model '" << name_ << "': no layers to build");
  int64_t count = 0, bytes = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto [begin, end] = ranges[i];
    TANDEM_CHECK_MSG(begin < end && end <= size(), InvalidArgument,
                     "model '" << name_ << "': layer range [" << begin << ", " << end
                               << ") is empty or outside its " << size() << " layers");
    TANDEM_CHECK_MSG(i == 0 || ranges[i - 1].end <= begin, InvalidArgument,
                     "model '" << name_ << "': layer range [" << begin << ", " << end
                               << ") does not come after [" << ranges[i - 1].begin << ", "
                               << ranges[i - 1].end << ")");
    count += paramCount(begin, end);
    bytes += paramBytes(begin, end);
  }
  // Parameters, their gradients and up to two optimizer slots must fit on the device (an
  // over-estimate for int8 weights, which have neither: four times their bytes).
  const DeviceInfo device = backend.info();
  const int64_t need = bytes * 4;
  TANDEM_CHECK_MSG(need <= device.memory_bytes, InvalidArgument,
                   "model '" << name_ << "' has " << count << " parameters in layers "
                             << describe(ranges) << ", needing " << need
                             << " bytes with gradients and optimizer state; " << device.name
                             << " has " << device.memory_bytes << " bytes");
  params_.clear();
  for (const auto& [begin, end] : ranges) {
    layers_.build(backend, seed, begin, end);
    for (Param* p : layers_.params(begin, end)) params_.push_back(p);
  }
  backend_ = &backend;
  built_ = ranges;
}

std::vector<TensorRole> Model::splitForTensor(size_t begin, size_t end, Group& group,
                                              const std::vector<double>& shares) {
  TANDEM_CHECK_MSG(backend_ == nullptr, InvalidArgument,
                   "model '" << name_ << "': a tensor split comes before build");
  if (end == kEnd) end = size();
  const std::vector<TensorRole> roles = planTensorSplit(layers_, begin, end);
  applyTensorSplit(layers_, roles, group, shares);
  output_ = layers_.setup(input_);
  return roles;
}

std::vector<TensorRole> Model::tensorRoles(size_t begin, size_t end) const {
  return findTensorSplit(layers_, begin, end);
}

int Model::tensorAllreduces(const std::vector<TensorRole>& roles) const {
  return tandem::tensorAllreduces(layers_, roles);
}

void Model::requireBuilt(size_t begin, size_t end) const {
  TANDEM_CHECK_MSG(backend_ != nullptr, InvalidArgument, "model '" << name_ << "' is not built");
  for (const LayerRange& r : built_)
    if (begin >= r.begin && end <= r.end) return;
  throw InvalidArgument("model '" + name_ + "': layers [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") run, but only " + describe(built_) + " are built");
}

Backend& Model::backend() const {
  TANDEM_CHECK_MSG(backend_ != nullptr, InvalidArgument, "model '" << name_ << "' is not built");
  return *backend_;
}

Param& Model::param(const std::string& name) const {
  for (Param* p : params_)
    if (p->name == name) return *p;
  throw InvalidArgument("model '" + name_ + "' has no parameter '" + name + "'");
}

void Model::zeroGrad() {
  for (Param* p : params_)
    if (p->grad.defined()) backend_->fill(p->grad, 0.0f);  // (int8 weights have none)
}

void Model::requireTrainable(size_t begin, size_t end) const {
  std::string which;
  if (!layers_.trains(begin, end, &which))
    throw Unsupported("model '" + name_ + "': " + which +
                      " holds int8 weights, which are for inference only: train or fine-tune "
                      "the f32 model, then quantize it (tandem quantize)");
}

Tensor Model::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx, size_t begin,
                      size_t end) {
  if (end == kEnd) end = size();
  requireBuilt(begin, end);
  const Shape& want = begin == 0 ? input_ : layers_.layer(begin - 1).outputShape();
  TANDEM_CHECK_MSG(x.shape().rank() == want.rank() + 1 && x.shape().dropFirst() == want,
                   InvalidArgument,
                   "model '" << name_ << "': layer " << begin << " expects a batch of " << want
                             << ", got " << x.shape());
  return layers_.forward(x, stash, ctx, begin, end);
}

Tensor Model::decode(const Tensor& x, DecodeState& state, size_t begin, size_t end) {
  if (end == kEnd) end = size();
  requireBuilt(begin, end);
  const Shape& want = begin == 0 ? input_ : layers_.layer(begin - 1).outputShape();
  // Like forward's, but any number of tokens in place of the sequence length.
  TANDEM_CHECK_MSG(
      x.shape().rank() == want.rank() + 1 && want.rank() >= 1 &&
          x.shape().dropFirst().dropFirst() == want.dropFirst(),
      InvalidArgument,
      "model '" << name_ << "': decoding layer " << begin << " expects [B, tokens"
                << (want.rank() > 1 ? ", " + want.dropFirst().str().substr(1) : std::string("]"))
                << ", got " << x.shape());
  return layers_.decode(x, state, begin, end);
}

Tensor Model::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states, size_t begin,
                         size_t end) {
  if (end == kEnd) end = size();
  requireBuilt(begin, end);
  const Shape& want = begin == 0 ? input_ : layers_.layer(begin - 1).outputShape();
  TANDEM_CHECK_MSG(
      !states.empty() && x.shape().rank() == want.rank() + 1 && want.rank() >= 1 &&
          x.shape()[0] == static_cast<int64_t>(states.size()) && x.shape()[1] == 1 &&
          x.shape().dropFirst().dropFirst() == want.dropFirst(),
      InvalidArgument,
      "model '" << name_ << "': decoding one token of " << states.size() << " sequences at layer "
                << begin << " expects [" << states.size() << ", 1"
                << (want.rank() > 1 ? ", " + want.dropFirst().str().substr(1) : std::string("]"))
                << ", got " << x.shape());
  return layers_.decodeEach(x, states, begin, end);
}

Tensor Model::backward(const Tensor& dy, Stash& stash, bool need_dx, size_t begin, size_t end,
                       const LayerDone& done) {
  if (end == kEnd) end = size();
  requireBuilt(begin, end);
  return layers_.backward(dy, stash, need_dx, begin, end, done);
}

Tensor Model::backwardInput(const Tensor& dy, Stash& stash, size_t begin, size_t end,
                            bool need_dx) {
  if (end == kEnd) end = size();
  requireBuilt(begin, end);
  return layers_.backwardInput(dy, stash, begin, end, need_dx);
}

void Model::backwardWeights(Stash& stash, size_t begin, size_t end, const LayerDone& done,
                            bool first_done) {
  if (end == kEnd) end = size();
  requireBuilt(begin, end);
  layers_.backwardWeights(stash, begin, end, done, first_done);
}

size_t Model::firstWithParams(size_t begin, size_t end) const {
  return layers_.firstWithParams(begin, std::min(end, size()));
}

int64_t Model::paramCount(size_t begin, size_t end) const {
  int64_t n = 0;
  for (size_t i = begin; i < std::min(end, size()); ++i) n += layers_.layer(i).paramCount();
  return n;
}

int64_t Model::paramBytes(size_t begin, size_t end) const {
  int64_t n = 0;
  for (size_t i = begin; i < std::min(end, size()); ++i) n += layers_.layer(i).paramBytes();
  return n;
}

ModelSpec Model::spec() const { return {name_, input_, layers_.specs()}; }

}  // namespace tandem
