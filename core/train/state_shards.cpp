#include "core/train/state_shards.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace tandem {

std::vector<StateShard> stateShards(const std::vector<int64_t>& rows,
                                    const std::vector<int64_t>& row_bytes, size_t replicas,
                                    const std::vector<double>& shares) {
  TANDEM_CHECK_MSG(replicas > 0, InvalidArgument, "optimizer state shared by no replica");
  TANDEM_CHECK_MSG(rows.size() == row_bytes.size(), InvalidArgument,
                   rows.size() << " row counts for " << row_bytes.size() << " row sizes");
  TANDEM_CHECK_MSG(shares.empty() || shares.size() == replicas, InvalidArgument,
                   shares.size() << " state shares for " << replicas << " replicas");
  for (const double s : shares)
    TANDEM_CHECK_MSG(s > 0 && std::isfinite(s), InvalidArgument,
                     "state share " << s << " is not a positive number");
  double total = 0, room = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    total += static_cast<double>(rows[i]) * static_cast<double>(row_bytes[i]);
  for (size_t r = 0; r < replicas; ++r) room += shares.empty() ? 1.0 : shares[r];
  // Replica r's run ends where the bytes before it reach its cumulative share of `total`.
  std::vector<double> ends;
  double cumulative = 0;
  for (size_t r = 0; r + 1 < replicas; ++r) {
    cumulative += shares.empty() ? 1.0 : shares[r];
    ends.push_back(total * cumulative / room);
  }
  std::vector<StateShard> out;
  size_t owner = 0;
  double before = 0;  // bytes of the rows before parameter i
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto w = static_cast<double>(row_bytes[i]);
    if (rows[i] <= 0 || w <= 0) continue;  // (no values: no state)
    const double after = before + w * static_cast<double>(rows[i]);
    // The current run ends at the row boundary nearest its end: inside this parameter (the
    // next run goes on from there), at or before its start (nothing of it here), or past
    // its end (it takes the rest and goes on into the next parameter).
    for (int64_t begin = 0; begin < rows[i];) {
      const bool last = owner == ends.size();
      const int64_t end_row = last ? rows[i] : std::llround((ends[owner] - before) / w);
      const int64_t cut = std::clamp<int64_t>(end_row, begin, rows[i]);
      if (cut > begin) out.push_back({i, begin, cut, static_cast<int>(owner)});
      begin = cut;
      if (last || end_row > rows[i]) break;
      ++owner;
    }
    before = after;
  }
  return out;
}

std::vector<StateShard> modelStateShards(const Model& model, size_t replicas,
                                         const std::vector<double>& shares) {
  std::vector<int64_t> rows, row_bytes;
  for (const Param* p : model.params()) {
    const bool whole = p->value.shape().rank() == 0 || !p->grad.defined() ||
                       p->value.dtype() != DType::kF32;  // (no state, or no rows to cut)
    rows.push_back(whole ? 1 : p->value.shape()[0]);
    row_bytes.push_back(p->grad.defined() ? static_cast<int64_t>(p->value.bytes()) /
                                                std::max<int64_t>(1, rows.back())
                                          : 0);
  }
  return stateShards(rows, row_bytes, replicas, shares);
}

bool wholeParam(const std::vector<Param*>& params, const StateShard& shard) {
  const Param& p = *params.at(shard.param);
  const bool rowed = p.value.shape().rank() > 0 && p.value.dtype() == DType::kF32;
  return shard.begin == 0 && (!rowed || shard.end == p.value.shape()[0]);
}

Tensor shardOf(const Tensor& t, const std::vector<Param*>& params, const StateShard& shard) {
  return wholeParam(params, shard) ? t : t.slice(shard.begin, shard.end - shard.begin);
}

std::vector<Param> ownedRows(const std::vector<Param*>& params,
                             const std::vector<StateShard>& shards, int rank) {
  std::vector<Param> out;
  for (const StateShard& s : shards)
    if (s.owner == rank) out.push_back(shardRows(params, s));
  return out;
}

Param shardRows(const std::vector<Param*>& params, const StateShard& shard) {
  const Param& p = *params.at(shard.param);
  if (wholeParam(params, shard)) return p;
  Param part;
  part.name = p.name;
  part.value = p.value.slice(shard.begin, shard.end - shard.begin);
  if (p.grad.defined()) part.grad = p.grad.slice(shard.begin, shard.end - shard.begin);
  return part;
}

void shareSteppedRows(Model& model, Group& group, const std::vector<StateShard>& shards,
                      uint64_t tag, std::chrono::milliseconds timeout) {
  Backend& be = model.backend();
  const std::vector<Param*>& params = model.params();
  std::vector<float> values;
  RootOptions ro;
  ro.timeout = timeout;
  for (size_t k = 0; k < shards.size(); ++k) {
    ro.root = shards[k].owner;
    ro.tag = tag + k;
    broadcastTensor(be, group, shardRows(params, shards[k]).value, ro, values);
  }
}

void broadcastTensor(Backend& backend, Group& group, const Tensor& t, const RootOptions& o,
                     std::vector<float>& scratch) {
  const auto n = static_cast<size_t>(t.numel());
  if (const void* host = backend.hostData(t)) {
    group.broadcast({const_cast<float*>(static_cast<const float*>(host)), n}, o);
    return;
  }
  const bool own = o.root == group.rank();
  scratch.resize(n);
  if (own) backend.download(t, scratch.data());
  group.broadcast(scratch, o);
  if (!own) backend.upload(t, scratch.data());
}

bool isSlotOf(const std::string& key, const std::string& param) {
  return key.size() > param.size() + 1 && key.compare(0, param.size() + 1, param + ".") == 0 &&
         key.find('.', param.size() + 1) == std::string::npos;
}

std::vector<std::string> stateSlots(const OptimizerOptions& options) {
  if (options.kind == "adamw") return {"m", "v"};
  if (options.momentum > 0.0f) return {"velocity"};
  return {};
}

std::vector<std::pair<std::string, Tensor>> gatherShardedState(
    const Optimizer& optimizer, const Model& model, Group& group,
    const std::vector<StateShard>& shards, uint64_t tag, std::chrono::milliseconds timeout) {
  const bool root = group.rank() == 0;
  Backend& be = model.backend();
  const std::vector<Param*>& params = model.params();
  const std::vector<std::string> slots = stateSlots(optimizer.options());
  std::map<std::string, Tensor> held;
  for (auto& [key, t] : optimizer.state()) held[key] = t;
  std::map<std::string, Tensor> whole;
  std::vector<float> rows;
  RootOptions ro;
  ro.timeout = timeout;
  uint64_t next = tag;
  for (const StateShard& s : shards) {
    const Param& p = *params.at(s.param);
    const Shape& shape = p.value.shape();
    const auto count = static_cast<size_t>(shardRows(params, s).value.numel());
    for (const std::string& slot : slots) {
      const std::string key = p.name + "." + slot;
      rows.assign(count, 0.0f);
      if (s.owner == group.rank())
        if (auto at = held.find(key); at != held.end()) {
          TANDEM_CHECK_MSG(at->second.numel() == static_cast<int64_t>(rows.size()), InvalidArgument,
                           "optimizer state '" << key << "' holds " << at->second.numel()
                                               << " values for its shard's " << rows.size());
          at->second.backend().download(at->second, rows.data());
        }
      ro.root = s.owner;
      ro.tag = next++;
      group.broadcast(rows, ro);
      if (!root) continue;
      auto [into, fresh] = whole.try_emplace(key);
      if (fresh) into->second = be.zeros(shape);
      const Tensor part = shardOf(into->second, params, s);
      be.upload(part, rows.data());
    }
  }
  std::vector<std::pair<std::string, Tensor>> out(whole.begin(), whole.end());
  return out;
}

std::vector<std::pair<std::string, Tensor>> stateOfShards(
    const std::vector<std::pair<std::string, Tensor>>& whole, const Model& model,
    const std::vector<StateShard>& shards, int rank) {
  const std::vector<Param*>& params = model.params();
  std::vector<std::pair<std::string, Tensor>> out;
  for (const StateShard& s : shards) {
    if (s.owner != rank) continue;
    const std::string& name = params.at(s.param)->name;
    for (const auto& [key, t] : whole) {
      if (!isSlotOf(key, name)) continue;  // another parameter's
      TANDEM_CHECK_MSG(t.shape() == params[s.param]->value.shape(), InvalidArgument,
                       "optimizer state '" << key << "' is not shaped as its parameter");
      const Tensor rows = shardOf(t, params, s);
      Tensor copy = t.backend().empty(rows.shape(), rows.dtype());
      t.backend().copy(rows, copy);
      out.emplace_back(key, copy);
    }
  }
  return out;
}

}  // namespace tandem
