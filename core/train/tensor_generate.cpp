#include "core/train/tensor_generate.h"

#include "core/error.h"
#include "core/layers/tensor_split.h"
#include "core/spin.h"

namespace tandem {
namespace {

// The tokens' broadcasts' tag, apart from the split layers' all-reduces (counted from 0).
constexpr uint64_t kTokenTag = uint64_t{1} << 40;

}  // namespace

TensorParallelGenerator::TensorParallelGenerator(const Model& whole,
                                                 const std::vector<Backend*>& backends,
                                                 const std::vector<Group*>& groups,
                                                 std::vector<double> shares)
    : shares_(std::move(shares)), groups_(groups) {
  const size_t ranks = backends.size();
  TANDEM_CHECK_MSG(ranks >= 1 && groups.size() == ranks, InvalidArgument,
                   "tensor generation: " << backends.size() << " backends for " << groups.size()
                                         << " group ranks");
  if (shares_.empty()) shares_.assign(ranks, 1.0);
  TANDEM_CHECK_MSG(shares_.size() == ranks, InvalidArgument,
                   "tensor generation: " << shares_.size() << " shares for " << ranks << " ranks");
  const ModelSpec spec = whole.spec();
  for (size_t r = 0; r < ranks; ++r) {
    TANDEM_CHECK_MSG(groups[r]->rank() == static_cast<int>(r), InvalidArgument,
                     "tensor generation: group " << r << " is rank " << groups[r]->rank());
    models_.push_back(std::make_unique<Model>(spec));
    roles_ = models_.back()->splitForTensor(0, Model::kEnd, *groups[r], shares_);
    models_.back()->build(*backends[r], 0);  // every value is overwritten next
    copyIntoPart(whole, *models_.back());
    if (r > 0)
      threads_.push_back(std::make_unique<JobThread>(waitBeforeSleeping(static_cast<int>(ranks))));
  }
}

TensorParallelGenerator::~TensorParallelGenerator() = default;

Generation TensorParallelGenerator::generate(const std::vector<int32_t>& prompt, int64_t count,
                                             const SamplingOptions& o, bool cache,
                                             const std::function<void(int32_t)>& on_token,
                                             const std::vector<int32_t>& end_tokens) {
  // Rank 0's choice, on every rank (exact as a float: ids below 2^24).
  auto agree = [this](int rank) {
    return [this, rank](int32_t chosen) {
      float token = static_cast<float>(chosen);
      RootOptions ro;
      ro.tag = kTokenTag;
      broadcast(*groups_[static_cast<size_t>(rank)], {&token, 1}, ro);
      return static_cast<int32_t>(token);
    };
  };
  Generation out;
  runOnEvery(threads_, [&](int r) {
    if (r == 0) {
      out = tandem::generate(model(0), prompt, count, o, cache, on_token, agree(0), end_tokens);
    } else {
      tandem::generate(model(r), prompt, count, o, cache, {}, agree(r), end_tokens);
    }
  });
  return out;
}

}  // namespace tandem
