// Tensor-parallel generation on one node: a language model's attention and MLP split over
// the ranks of an in-process group (core/layers/tensor_split.h: heads and hidden features in
// proportion to `shares`), each rank a thread driving its own backend and keeping the
// key/value cache of its own heads. Every rank decodes the same tokens in step: their
// all-reduces meet at each split layer, and each token rank 0 chooses is broadcast to the
// others to feed back (ranks on unlike devices compute the logits after an all-reduce with
// their own kernels, so their own choices could differ at a near tie). Rank 0 runs on the
// caller's thread and reports the tokens.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/comm/group.h"
#include "core/generate.h"
#include "core/model.h"
#include "core/train/job_thread.h"
#include "core/train/tensor_parallel.h"

namespace tandem {

class TensorParallelGenerator {
 public:
  // One rank per backend and group (groups[r] is rank r), `whole`'s weights split over
  // them (empty shares: equal).
  TensorParallelGenerator(const Model& whole, const std::vector<Backend*>& backends,
                          const std::vector<Group*>& groups, std::vector<double> shares);
  ~TensorParallelGenerator();

  int ranks() const { return static_cast<int>(models_.size()); }
  Model& model(int rank) { return *models_.at(static_cast<size_t>(rank)); }
  const std::vector<TensorRole>& roles() const { return roles_; }
  const std::vector<double>& shares() const { return shares_; }

  // generate() on every rank at once; rank 0's tokens (on_token hears them as chosen). Every
  // rank decodes the agreed tokens, so all stop at the same end token.
  Generation generate(const std::vector<int32_t>& prompt, int64_t count, const SamplingOptions& o,
                      bool cache = true, const std::function<void(int32_t)>& on_token = {},
                      const std::vector<int32_t>& end_tokens = {});

 private:
  std::vector<double> shares_;
  std::vector<Group*> groups_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<TensorRole> roles_;
  std::vector<std::unique_ptr<JobThread>> threads_;  // ranks 1.. (rank 0: the caller's)
};

}  // namespace tandem
