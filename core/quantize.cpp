#include "core/quantize.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tandem {

QuantizedRows quantizeRows(std::span<const float> w, int64_t rows, int64_t cols, int64_t group,
                           const std::string& what) {
  TANDEM_CHECK_MSG(rows >= 0 && cols > 0 && static_cast<int64_t>(w.size()) == rows * cols,
                   InvalidArgument,
                   what << ": " << w.size() << " weights are not [" << rows << ", " << cols << "]");
  TANDEM_CHECK_MSG(
      group > 0 && cols % group == 0, InvalidArgument,
      what << ": an int8 group of " << group << " does not divide its " << cols << " inputs");
  QuantizedRows q{rows, cols, group, std::vector<int8_t>(w.size()), {}};
  q.scales.resize(static_cast<size_t>(rows * (cols / group)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols / group; ++g) {
      const size_t at = static_cast<size_t>(r * cols + g * group);
      float largest = 0;
      for (int64_t i = 0; i < group; ++i) {
        const float v = w[at + static_cast<size_t>(i)];
        TANDEM_CHECK_MSG(std::isfinite(v), InvalidArgument,
                         what << ": weight [" << r << ", " << g * group + i << "] is " << v
                              << ", which int8 cannot hold");
        largest = std::max(largest, std::fabs(v));
      }
      const float scale = largest / 127.0f;
      q.scales[static_cast<size_t>(r * (cols / group) + g)] = scale;
      for (int64_t i = 0; i < group; ++i) {
        const size_t k = at + static_cast<size_t>(i);
        const float v = scale > 0 ? std::nearbyint(w[k] / scale) : 0.0f;
        q.values[k] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
    }
  }
  return q;
}

std::vector<float> dequantizeRows(const QuantizedRows& q) {
  std::vector<float> out(q.values.size());
  const int64_t groups = q.cols / q.group;
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const auto k = static_cast<size_t>(r * q.cols + c);
      out[k] =
          static_cast<float>(q.values[k]) * q.scales[static_cast<size_t>(r * groups + c / q.group)];
    }
  return out;
}

}  // namespace tandem
