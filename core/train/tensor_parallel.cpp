#include "core/train/tensor_parallel.h"

#include <map>
#include <string>

#include "core/error.h"
#include "core/spin.h"

namespace tandem {

void copyIntoPart(const Model& whole, Model& part) {
  for (Param* p : part.params()) {
    std::vector<float> values = toHost(whole.param(p->name).value);
    if (p->slice) values = takeSlice(values, *p->slice);
    TANDEM_CHECK_MSG(static_cast<int64_t>(values.size()) == p->value.shape().numel(),
                     InvalidArgument,
                     "tensor part: " << p->name << " holds " << p->value.shape() << ", the whole "
                                     << "model's part of it " << values.size() << " values");
    part.backend().upload(p->value, values.data());
  }
}

TensorParallelTrainer::TensorParallelTrainer(
    const ModelSpec& spec, const std::vector<Backend*>& backends, const std::vector<Group*>& groups,
    std::vector<double> shares, const OptimizerOptions& optimizer, const TrainOptions& options)
    : spec_(spec), shares_(std::move(shares)), optimizer_options_(optimizer), groups_(groups) {
  const size_t ranks = backends.size();
  TANDEM_CHECK_MSG(ranks >= 1 && groups.size() == ranks, InvalidArgument,
                   "tensor parallel: " << backends.size() << " backends for " << groups.size()
                                       << " group ranks");
  if (shares_.empty()) shares_.assign(ranks, 1.0);
  TANDEM_CHECK_MSG(shares_.size() == ranks, InvalidArgument,
                   "tensor parallel: " << shares_.size() << " shares for " << ranks << " ranks");
  for (size_t r = 0; r < ranks; ++r) {
    TANDEM_CHECK_MSG(groups[r]->rank() == static_cast<int>(r), InvalidArgument,
                     "tensor parallel: group " << r << " is rank " << groups[r]->rank());
    models_.push_back(std::make_unique<Model>(spec));
    roles_ = models_.back()->splitForTensor(0, Model::kEnd, *groups[r], shares_);
    models_.back()->build(*backends[r], options.seed);
    optimizers_.push_back(std::make_unique<Optimizer>(*backends[r], optimizer));
    trainers_.push_back(std::make_unique<Trainer>(*models_.back(), *optimizers_.back(), options));
    if (r > 0)
      threads_.push_back(std::make_unique<JobThread>(waitBeforeSleeping(static_cast<int>(ranks))));
    resync_ = resync_ || backends[r]->info().name != backends[0]->info().name;
  }
}

TensorParallelTrainer::~TensorParallelTrainer() = default;

namespace {
// The resync broadcasts' tags, apart from the split layers' all-reduces (counted from 0).
constexpr uint64_t kResyncTag = uint64_t{1} << 41;
}  // namespace

void broadcastReplicated(Model& m, Group& group, RootOptions o) {
  for (Param* p : m.params()) {
    ++o.tag;
    if (!p->slice && p->value.dtype() == DType::kF32)
      broadcastTensor(m.backend(), p->value, group, o);
  }
}

void TensorParallelTrainer::resync(int r) {
  RootOptions o;
  o.tag = kResyncTag;
  broadcastReplicated(*models_[static_cast<size_t>(r)], *groups_[static_cast<size_t>(r)], o);
}

void TensorParallelTrainer::startFrom(const Model& whole) {
  for (auto& m : models_) copyIntoPart(whole, *m);
}

double TensorParallelTrainer::step(const float* x, const int32_t* labels, int64_t n) {
  double loss = 0;
  runOnEvery(threads_, [&](int r) {
    const double mine = trainers_[static_cast<size_t>(r)]->step(x, labels, n);
    if (resync_) resync(r);
    if (r == 0) loss = mine;
  });
  return loss;
}

EpochReport TensorParallelTrainer::trainEpoch(
    const Dataset& data, int64_t epoch, const std::function<void(const StepReport&)>& progress) {
  EpochReport report;
  runOnEvery(threads_, [&](int r) {
    const EpochReport mine = trainers_[static_cast<size_t>(r)]->trainEpoch(
        data, epoch, [&, r](const StepReport& s) {  // after each step
          if (resync_) resync(r);
          if (r == 0 && progress) progress(s);
        });
    if (r == 0) report = mine;
  });
  return report;
}

EvalResult TensorParallelTrainer::evaluate(const Dataset& data, int64_t batch) {
  EvalResult result;
  runOnEvery(threads_, [&](int r) {
    const EvalResult mine = tandem::evaluate(*models_[static_cast<size_t>(r)], data, batch);
    if (r == 0) result = mine;
  });
  return result;
}

TensorParts mergeTensorParts(const ModelSpec& spec, const std::vector<LayerRange>& layers,
                             const std::vector<const Model*>& parts,
                             const std::vector<const Optimizer*>& optimizers, Backend& backend,
                             const OptimizerOptions& optimizer) {
  TANDEM_CHECK_MSG(
      !parts.empty() && (optimizers.empty() || optimizers.size() == parts.size()), InvalidArgument,
      "tensor merge: " << parts.size() << " parts and " << optimizers.size() << " optimizers");
  TensorParts m;
  m.model = std::make_unique<Model>(spec);
  if (layers.empty())  // every value is overwritten below
    m.model->build(backend, 0);
  else
    m.model->build(backend, 0, layers);
  // The whole of `param` (or of its optimizer slot `name`) from the ranks' parts: each
  // rank's put in its place (Param::slice); rank 0's where every rank holds it whole.
  auto whole = [&](const std::string& name, const std::string& param, const Shape& shape,
                   const std::function<Tensor(size_t)>& part) {
    std::vector<float> values;
    for (size_t r = 0; r < parts.size(); ++r) {
      const std::optional<ParamSlice>& slice = parts[r]->param(param).slice;
      if (!slice) {
        values = toHost(part(0));
        break;
      }
      values.resize(static_cast<size_t>(shape.numel()));
      placeSlice(*slice, toHost(part(r)), values);
    }
    TANDEM_CHECK_MSG(static_cast<int64_t>(values.size()) == shape.numel(), InvalidArgument,
                     "tensor merge: the ranks' parts of " << name << " hold " << values.size()
                                                          << " values for " << shape);
    return toDevice(backend, shape, values);
  };
  for (Param* p : m.model->params()) {
    const Tensor t = whole(p->name, p->name, p->value.shape(),
                           [&](size_t r) { return parts[r]->param(p->name).value; });
    backend.copy(t, p->value);
  }
  if (optimizers.empty()) return m;
  m.optimizer = std::make_unique<Optimizer>(backend, optimizer);
  std::vector<std::map<std::string, Tensor>> states;
  for (const Optimizer* o : optimizers) {
    states.emplace_back();
    for (const auto& [name, t] : o->state()) states.back()[name] = t;
  }
  std::vector<std::pair<std::string, Tensor>> state;
  for (const auto& entry : states.at(0)) {
    const std::string& name = entry.first;  // (not a structured binding: the lambda uses it)
    const std::string param = name.substr(0, name.rfind('.'));
    state.emplace_back(name, whole(name, param, m.model->param(param).value.shape(),
                                   [&](size_t r) { return states[r].at(name); }));
  }
  m.optimizer->restore(state, optimizers.front()->steps());
  return m;
}

std::vector<std::pair<std::string, Tensor>> partOfState(
    const Model& part, const std::vector<std::pair<std::string, Tensor>>& whole) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : whole) {
    const size_t dot = name.rfind('.');
    TANDEM_CHECK_MSG(dot != std::string::npos, InvalidArgument,
                     "optimizer state '" << name << "' names no parameter");
    const Param& p = part.param(name.substr(0, dot));
    std::vector<float> mine = toHost(t);
    if (p.slice) mine = takeSlice(mine, *p.slice);
    TANDEM_CHECK_MSG(static_cast<int64_t>(mine.size()) == p.value.shape().numel(), InvalidArgument,
                     "optimizer state '" << name << "': " << t.shape() << " where " << p.name
                                         << "'s part holds " << p.value.shape());
    out.emplace_back(name, toDevice(part.backend(), p.value.shape(), mine));
  }
  return out;
}

TensorParts TensorParallelTrainer::merged(Backend& backend) const {
  std::vector<const Model*> parts;
  std::vector<const Optimizer*> optimizers;
  for (size_t r = 0; r < models_.size(); ++r) {
    parts.push_back(models_[r].get());
    optimizers.push_back(optimizers_[r].get());
  }
  return mergeTensorParts(spec_, {}, parts, optimizers, backend, optimizer_options_);
}

}  // namespace tandem
