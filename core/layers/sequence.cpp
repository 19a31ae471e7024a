#include "core/layers/sequence.h"

#include <algorithm>

#include "core/error.h"
#include "core/layers/registry.h"

namespace tandem {

Sequence::Sequence(const std::vector<LayerSpec>& specs) {
  for (size_t i = 0; i < specs.size(); ++i) {
    try {
      layers_.push_back(makeLayer(specs[i]));
    } catch (const InvalidArgument& e) {
      const std::string where = specs[i].where.empty() ? "" : " at " + specs[i].where;
      throw InvalidArgument("layer " + std::to_string(i) + " (" + specs[i].type + where +
                            "): " + e.what());
    }
    where_.push_back(specs[i].where);
  }
}

Shape Sequence::setup(const Shape& input) {
  Shape shape = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    try {
      shape = layers_[i]->setup(shape);
    } catch (const InvalidArgument& e) {
      const std::string where = where_[i].empty() ? "" : " at " + where_[i];
      throw InvalidArgument("layer " + std::to_string(i) + " (" + layers_[i]->type() + where +
                            "): " + e.what());
    }
  }
  return shape;
}

void Sequence::build(Backend& backend, Rng& rng, const std::string& prefix) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->build(backend, rng);
    for (Param* p : layers_[i]->params()) p->name = prefix + std::to_string(i) + "." + p->name;
  }
}

void Sequence::build(Backend& backend, uint64_t seed, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    Rng rng(combineSeeds(seed, i));
    layers_.at(i)->build(backend, rng);
    for (Param* p : layers_[i]->params()) p->name = std::to_string(i) + "." + p->name;
  }
}

std::vector<Param*> Sequence::params(size_t begin, size_t end) {
  std::vector<Param*> out;
  for (size_t i = begin; i < std::min(end, layers_.size()); ++i)
    for (Param* p : layers_[i]->params()) out.push_back(p);
  return out;
}

Tensor Sequence::forward(const Tensor& x, Stash& stash, const ForwardContext& ctx, size_t begin,
                         size_t end) {
  TANDEM_CHECK_MSG(
      begin <= end && end <= layers_.size(), InvalidArgument,
      "layer range [" << begin << ", " << end << ") outside a sequence of " << layers_.size());
  stash.children.assign(end - begin, Stash{});
  Tensor h = x;
  for (size_t i = begin; i < end; ++i) {
    ForwardContext c = ctx;
    c.seed = combineSeeds(ctx.seed, i);
    h = layers_[i]->forward(h, stash.children[i - begin], c);
  }
  return h;
}

Tensor Sequence::decode(const Tensor& x, DecodeState& state, size_t begin, size_t end) {
  TANDEM_CHECK_MSG(
      begin <= end && end <= layers_.size(), InvalidArgument,
      "layer range [" << begin << ", " << end << ") outside a sequence of " << layers_.size());
  if (state.children.size() != end - begin) state.children.assign(end - begin, DecodeState{});
  Tensor h = x;
  for (size_t i = begin; i < end; ++i) h = layers_[i]->decode(h, state.children[i - begin]);
  return h;
}

Tensor Sequence::decodeEach(const Tensor& x, const std::vector<DecodeState*>& states, size_t begin,
                            size_t end) {
  TANDEM_CHECK_MSG(
      begin <= end && end <= layers_.size(), InvalidArgument,
      "layer range [" << begin << ", " << end << ") outside a sequence of " << layers_.size());
  for (DecodeState* s : states)
    if (s->children.size() != end - begin) s->children.assign(end - begin, DecodeState{});
  Tensor h = x;
  std::vector<DecodeState*> layer_states(states.size());
  for (size_t i = begin; i < end; ++i) {
    for (size_t b = 0; b < states.size(); ++b) layer_states[b] = &states[b]->children[i - begin];
    h = layers_[i]->decodeEach(h, layer_states);
  }
  return h;
}

namespace {

void checkStash(const Stash& stash, size_t begin, size_t end) {
  TANDEM_CHECK_MSG(stash.children.size() == end - begin, InvalidArgument,
                   "backward over " << end - begin << " layers with a stash of "
                                    << stash.children.size() << " (was forward run?)");
}

}  // namespace

size_t Sequence::firstWithParams(size_t begin, size_t end) const {
  for (size_t i = begin; i < end; ++i)
    if (layers_[i]->paramCount() > 0) return i;
  return end;
}

Tensor Sequence::backward(const Tensor& dy, Stash& stash, bool need_dx, size_t begin, size_t end,
                          const LayerDone& done) {
  checkStash(stash, begin, end);
  // Below the first layer with parameters nothing needs a gradient unless the caller
  // asked for the range's input gradient: e.g. a linear layer after a flatten must not
  // spend a GEMM on a dx that only the parameter-free flatten would consume.
  const size_t first_param = firstWithParams(begin, end);
  const size_t stop = need_dx ? begin : first_param;
  Tensor g = dy;
  for (size_t i = end; i-- > stop;) {
    g = layers_[i]->backward(g, stash.children[i - begin], need_dx || i > first_param);
    stash.children[i - begin].clear();  // free what backward no longer needs
    if (done) done(i);
  }
  for (size_t i = stop; i-- > begin;) {
    stash.children[i - begin].clear();
    if (done) done(i);
  }
  return need_dx ? g : Tensor();
}

Tensor Sequence::backwardInput(const Tensor& dy, Stash& stash, size_t begin, size_t end,
                               bool need_dx) {
  checkStash(stash, begin, end);
  Tensor g = dy;
  // Without the input gradient the layers through the first with parameters run whole,
  // as backward() runs them: it without its input gradient, those below it not at all.
  const size_t first = need_dx ? end : firstWithParams(begin, end);
  const size_t whole = need_dx ? begin : std::min(first + 1, end);
  for (size_t i = end; i-- > whole;) g = layers_[i]->backwardInput(g, stash.children[i - begin]);
  if (need_dx) return g;
  if (first < end) layers_[first]->backward(g, stash.children[first - begin], false);
  for (size_t i = begin; i < whole; ++i) stash.children[i - begin].clear();
  return Tensor();
}

void Sequence::backwardWeights(Stash& stash, size_t begin, size_t end, const LayerDone& done,
                               bool first_done) {
  checkStash(stash, begin, end);
  const size_t whole = first_done ? std::min(firstWithParams(begin, end) + 1, end) : begin;
  for (size_t i = end; i-- > begin;) {
    if (i >= whole) layers_[i]->backwardWeights(stash.children[i - begin]);
    stash.children[i - begin].clear();
    if (done) done(i);
  }
}

int64_t Sequence::total(int64_t (Layer::*fact)() const) const {
  int64_t n = 0;
  for (const auto& l : layers_) n += (l.get()->*fact)();
  return n;
}

int64_t Sequence::workspaceBytes(int64_t batch) const {
  int64_t n = 0;
  for (const auto& l : layers_) n = std::max(n, l->workspaceBytes(batch));
  return n;
}

std::vector<LayerSpec> Sequence::specs() const {
  std::vector<LayerSpec> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    out.push_back(layers_[i]->spec());
    out.back().where = where_[i];
  }
  return out;
}

std::vector<OpUse> Sequence::ops(bool training, size_t begin, size_t end) const {
  std::vector<std::vector<OpUse>> lists;
  for (size_t i = begin; i < std::min(end, layers_.size()); ++i)
    lists.push_back(layers_[i]->ops(training));
  return unionOps(lists);
}

bool Sequence::trains(size_t begin, size_t end, std::string* which) const {
  for (size_t i = begin; i < std::min(end, size()); ++i)
    if (!layers_[i]->trains()) {
      if (which) *which = "layer " + std::to_string(i) + " (" + layers_[i]->type() + ")";
      return false;
    }
  return true;
}

}  // namespace tandem
