#include "backends/composed_conv.h"

#include <algorithm>
#include <string_view>

#include "backends/op_checks.h"

namespace tandem::backends {

namespace {

int64_t pixels(const Window2d& g) { return g.outHeight() * g.outWidth(); }

// Samples [n0, n0 + cn) of t [n, C, OH, OW] as a channel-major [C, cn * OH*OW] matrix: t's
// own memory for one sample, else `tmp`, filled by transpose01.
Tensor channelMajor(Backend& b, const Tensor& t, int64_t n0, int64_t cn, const Tensor& tmp) {
  const int64_t c = t.shape()[1], hw = t.shape()[2] * t.shape()[3];
  if (cn == 1) return t.slice(n0, 1).reshape({c, hw});
  const Tensor out = tmp.head({c, cn * hw});
  b.transpose01(t.slice(n0, cn).reshape({cn, c, hw}), out.reshape({c, cn, hw}));
  return out;
}

// What each composed op sets up: the checked dims, the pixels per sample, the chunk of
// samples and its buffers: the column matrix, and for several samples a channel-major one,
// unless the weight gradient (`weight_grad`) runs batched per sample (`group` > 0).
struct Chunks {
  ConvDims d;
  int64_t ohw = 0, c = 0, group = 0;
  Tensor col, tmp;
  Chunks(Backend& b, const ConvDims& dims, const Window2d& g, bool weight_grad = false)
      : d(dims), ohw(pixels(g)), c(convColumnChunk(g, dims.oc, dims.n)) {
    if (weight_grad) group = convWeightGradGroup(g, d.oc, c);
    col = b.empty({d.k, c * ohw});
    if (c > 1 && group == 0) tmp = b.empty({d.oc, c * ohw});
  }
};

}  // namespace

void composedConv2d(Backend& b, std::string_view device, const Tensor& x, const Tensor& w,
                    const Tensor& bias, const Window2d& g, const Tensor& y) {
  const Chunks chunks(b, checkConv(x, w, bias, y, g, device, "conv2d"), g);
  const ConvDims& d = chunks.d;
  const int64_t ohw = chunks.ohw, c = chunks.c;
  const Tensor w2 = w.reshape({d.oc, d.k});
  for (int64_t n0 = 0; n0 < d.n; n0 += c) {
    const int64_t cn = std::min(c, d.n - n0);
    const Tensor colv = chunks.col.head({d.k, cn * ohw});
    b.im2col(x.slice(n0, cn), g, colv);
    if (cn == 1) {
      b.gemm(false, false, 1.0f, w2, colv, 0.0f, y.slice(n0, 1).reshape({d.oc, ohw}));
    } else {
      const Tensor t = chunks.tmp.head({d.oc, cn * ohw});
      b.gemm(false, false, 1.0f, w2, colv, 0.0f, t);
      b.transpose01(t.reshape({d.oc, cn, ohw}), y.slice(n0, cn).reshape({cn, d.oc, ohw}));
    }
  }
  if (bias.defined()) b.addBias(y, bias);
}

void composedConv2dBackwardData(Backend& b, std::string_view device, const Tensor& dy,
                                const Tensor& w, const Window2d& g, const Tensor& dx) {
  const Chunks chunks(b, checkConv(dx, w, Tensor(), dy, g, device, "conv2dBackwardData"), g);
  const ConvDims& d = chunks.d;
  const int64_t ohw = chunks.ohw, c = chunks.c;
  const Tensor w2 = w.reshape({d.oc, d.k});
  for (int64_t n0 = 0; n0 < d.n; n0 += c) {
    const int64_t cn = std::min(c, d.n - n0);
    const Tensor dyt = channelMajor(b, dy, n0, cn, chunks.tmp);
    const Tensor colv = chunks.col.head({d.k, cn * ohw});
    b.gemm(true, false, 1.0f, w2, dyt, 0.0f, colv);
    b.col2im(colv, g, dx.slice(n0, cn));
  }
}

void composedConv2dBackwardWeight(Backend& b, std::string_view device, const Tensor& x,
                                  const Tensor& dy, const Window2d& g, const Tensor& dw,
                                  const Tensor& db) {
  const Chunks chunks(b, checkConv(x, dw, db, dy, g, device, "conv2dBackwardWeight"), g, true);
  const ConvDims& d = chunks.d;
  const int64_t ohw = chunks.ohw, c = chunks.c, group = chunks.group;
  if (db.defined()) b.biasGrad(dy, db.reshape({d.oc}));
  // Batched: each sample's columns [K, OH*OW] in a row, and the group's partial gradients.
  Tensor per_sample, partial;
  if (group > 0) {
    per_sample = b.empty({c, d.k, ohw});
    partial = b.empty({group, d.oc * d.k});
  }
  for (int64_t n0 = 0; n0 < d.n; n0 += c) {
    const int64_t cn = std::min(c, d.n - n0);
    const Tensor colv = chunks.col.head({d.k, cn * ohw});
    b.im2col(x.slice(n0, cn), g, colv);
    if (group == 0) {
      const Tensor dyt = channelMajor(b, dy, n0, cn, chunks.tmp);
      b.gemm(false, true, 1.0f, dyt, colv, 1.0f, dw.reshape({d.oc, d.k}));
      continue;
    }
    const Tensor cols = per_sample.head({cn, d.k, ohw});
    b.transpose01(colv.reshape({d.k, cn, ohw}), cols);
    for (int64_t j = 0; j < cn; j += group) {
      const int64_t m = std::min(group, cn - j);
      const Tensor p = partial.head({m, d.oc * d.k});
      b.gemmBatched(false, true, 1.0f, dy.slice(n0 + j, m).reshape({m, d.oc, ohw}),
                    cols.slice(j, m), 0.0f, p.reshape({m, d.oc, d.k}));
      b.biasGrad(p, dw.reshape({d.oc * d.k}));
    }
  }
}

}  // namespace tandem::backends
