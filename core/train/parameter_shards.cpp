#include "core/train/parameter_shards.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

ParameterShards::ParameterShards(Model& model, Group& group, const std::vector<StateShard>& shards,
                                 std::chrono::milliseconds timeout)
    : model_(model), backend_(model.backend()), group_(group), timeout_(timeout), shards_(shards) {
  const std::vector<Param*>& all = model.params();
  sharded_.assign(all.size(), false);
  kept_.assign(all.size(), false);
  for (const Param* p : all) shapes_.push_back(p->value.shape());
  for (const StateShard& s : shards_) {
    TANDEM_CHECK_MSG(s.param < all.size() && s.owner >= 0 && s.owner < group.size(),
                     InvalidArgument,
                     "parameter shards: a shard of parameter " << s.param << " of " << all.size()
                                                               << " owned by rank " << s.owner
                                                               << " of " << group.size());
    sharded_[s.param] = true;
    if (s.owner != group.rank()) continue;
    Mine m{s, {}};
    if (wholeParam(all, s)) {
      kept_[s.param] = true;
    } else {  // its rows copied out of the built value
      const Tensor rows = all[s.param]->value.slice(s.begin, s.end - s.begin);
      m.master = backend_.empty(rows.shape(), rows.dtype());
      backend_.copy(rows, m.master);
    }
    mine_.push_back(std::move(m));
  }
  layer_params_.resize(model.size());
  for (size_t l = 0; l < model.size(); ++l)
    for (const Param* p : model.layer(l).params()) {
      const auto at = std::find(all.begin(), all.end(), p);
      const auto index = static_cast<size_t>(at - all.begin());
      if (at != all.end() && sharded_[index]) layer_params_[l].push_back(index);
    }
  for (size_t l = 0; l < model.size(); ++l) release(l);
  notePeak();  // (from here: the built model was whole on every replica)
}

Tensor ParameterShards::shapedLike(size_t param) {
  Param& p = *model_.params()[param];
  if (!p.value.defined()) p.value = backend_.empty(shapes_[param]);
  return p.value;
}

void ParameterShards::gather(size_t layer) {
  const std::vector<Param*>& all = model_.params();
  std::vector<float> host;
  RootOptions o;
  o.timeout = timeout_;
  bool grown = false;
  for (const size_t index : layer_params_.at(layer)) {
    grown = grown || !all[index]->value.defined();
    const Tensor whole = shapedLike(index);
    for (const StateShard& s : shards_) {
      if (s.param != index) continue;
      const Tensor rows = shardOf(whole, all, s);
      if (s.owner == group_.rank() && !kept_[index])
        for (const Mine& m : mine_)
          if (m.shard == s) backend_.copy(m.master, rows);
      o.root = s.owner;
      o.tag = kGatherTags + next_tag_++;
      broadcastTensor(backend_, group_, rows, o, host);
    }
  }
  if (grown) notePeak();
}

void ParameterShards::release(size_t layer) {
  for (const size_t index : layer_params_.at(layer))
    if (!kept_[index]) model_.params()[index]->value = Tensor{};
}

void ParameterShards::makeWhole(const std::vector<const ParameterShards*>& owners) {
  const std::vector<Param*>& all = model_.params();
  std::vector<float> host;
  for (const StateShard& s : shards_) {
    const ParameterShards& owner = *owners.at(static_cast<size_t>(s.owner));
    const Tensor whole = shapedLike(s.param);
    const Tensor rows = shardOf(whole, all, s);
    Tensor from;
    if (owner.kept_[s.param]) {
      from = owner.model_.params()[s.param]->value;
    } else {
      for (const Mine& m : owner.mine_)
        if (m.shard == s) from = m.master;
    }
    TANDEM_CHECK_MSG(from.defined(), InvalidArgument,
                     "parameter shards: rank " << s.owner << " does not hold rows [" << s.begin
                                               << ", " << s.end << ") of '" << all[s.param]->name
                                               << "'");
    if (&owner == this) {
      if (!kept_[s.param]) backend_.copy(from, rows);
      continue;
    }
    host.resize(static_cast<size_t>(from.numel()));
    from.backend().download(from, host.data());
    backend_.upload(rows, host.data());
  }
}

std::vector<Param> ParameterShards::owned() const {
  const std::vector<Param*>& all = model_.params();
  std::vector<Param> out;
  for (const Mine& m : mine_) {
    Param p;
    p.name = all[m.shard.param]->name;
    p.value = m.master.defined() ? m.master : all[m.shard.param]->value;
    out.push_back(std::move(p));
  }
  return out;
}

int64_t ParameterShards::parameterBytes() const {
  int64_t bytes = 0;
  const std::vector<Param*>& all = model_.params();
  for (size_t i = 0; i < all.size(); ++i)  // (unsharded ones too: batch norm's statistics)
    if (all[i]->value.defined()) bytes += static_cast<int64_t>(all[i]->value.bytes());
  for (const Mine& m : mine_)
    if (m.master.defined()) bytes += static_cast<int64_t>(m.master.bytes());
  return bytes;
}

int64_t ParameterShards::keptBytes() const {
  int64_t bytes = 0;
  const std::vector<Param*>& all = model_.params();
  for (size_t i = 0; i < all.size(); ++i)
    if ((kept_[i] || !sharded_[i]) && all[i]->value.defined())
      bytes += static_cast<int64_t>(all[i]->value.bytes());
  for (const Mine& m : mine_)
    if (m.master.defined()) bytes += static_cast<int64_t>(m.master.bytes());
  return bytes;
}

void ParameterShards::notePeak() { peak_bytes_ = std::max(peak_bytes_, parameterBytes()); }

}  // namespace tandem
