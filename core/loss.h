// Losses, composed from backend ops. Each returns the *sum* of per-sample losses (summed
// on the host in sample order, so it is deterministic) and, when `grad` is defined,
// writes d(sum * grad_scale)/d(input) into it: grad_scale = 1/N gives the mean's gradient,
// 1/(total samples) lets microbatches accumulate to a whole batch's mean.
#pragma once

#include "core/backend.h"

namespace tandem {

// logits [N, C], labels i32 [N]; or a language model's logits [N, T, C] with a label per
// token, labels [N, T], each token a row (the sum is then over tokens).
double softmaxCrossEntropy(Backend& backend, const Tensor& logits, const Tensor& labels,
                           float grad_scale, const Tensor& grad);

// Squared error summed over all elements of pred and target (same shape).
double mseLoss(Backend& backend, const Tensor& pred, const Tensor& target, float grad_scale,
               const Tensor& grad);

// Number of rows whose largest logit is at the label (first maximum wins).
int64_t countCorrect(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                     int64_t classes);

}  // namespace tandem
