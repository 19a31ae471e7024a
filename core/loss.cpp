#include "core/loss.h"

#include "core/error.h"

namespace tandem {

double softmaxCrossEntropy(Backend& backend, const Tensor& logits, const Tensor& labels,
                           float grad_scale, const Tensor& grad) {
  const Shape& s = logits.shape();
  TANDEM_CHECK_MSG(s.rank() >= 2 && s[s.rank() - 1] > 0, InvalidArgument,
                   "cross-entropy needs logits [N, C] or [N, T, C], got " << s);
  const int64_t classes = s[s.rank() - 1], rows = logits.numel() / classes;
  TANDEM_CHECK_MSG(labels.numel() == rows, InvalidArgument,
                   "cross-entropy: " << labels.shape() << " labels for logits " << s);
  Tensor losses = backend.empty({rows});
  backend.softmaxCrossEntropy(logits.reshape({rows, classes}), labels.reshape({rows}), grad_scale,
                              losses, grad.defined() ? grad.reshape({rows, classes}) : grad);
  double sum = 0;
  for (float l : toHost(losses)) sum += l;
  return sum;
}

double mseLoss(Backend& backend, const Tensor& pred, const Tensor& target, float grad_scale,
               const Tensor& grad) {
  TANDEM_CHECK_MSG(pred.shape() == target.shape(), InvalidArgument,
                   "mse: prediction " << pred.shape() << " vs target " << target.shape());
  Tensor diff = grad.defined() ? grad : backend.empty(pred.shape());
  backend.copy(pred, diff);
  backend.axpby(-1.0f, target, 1.0f, diff);
  const double sum = backend.dot(diff, diff);
  if (grad.defined()) backend.axpby(0.0f, diff, 2.0f * grad_scale, diff);
  return sum;
}

int64_t countCorrect(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                     int64_t classes) {
  TANDEM_CHECK_MSG(
      classes > 0 && logits.size() == labels.size() * static_cast<size_t>(classes), InvalidArgument,
      logits.size() << " logits for " << labels.size() << " labels of " << classes << " classes");
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const float* row = logits.data() + i * static_cast<size_t>(classes);
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (row[c] > row[best]) best = c;
    correct += best == labels[i];
  }
  return correct;
}

}  // namespace tandem
