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

}  // namespace

void composedConv2d(Backend& b, std::string_view device, const Tensor& x, const Tensor& w,
                    const Tensor& bias, const Window2d& g, const Tensor& y) {
  const ConvDims d = checkConv(x, w, bias, y, g, device, "conv2d");
  const int64_t ohw = pixels(g);
  const Tensor w2 = w.reshape({d.oc, d.k});
  const int64_t c = convColumnChunk(g, d.oc, d.n);
  Tensor col = b.empty({d.k, c * ohw});
  Tensor tmp = c > 1 ? b.empty({d.oc, c * ohw}) : Tensor();
  for (int64_t n0 = 0; n0 < d.n; n0 += c) {
    const int64_t cn = std::min(c, d.n - n0);
    const Tensor colv = col.head({d.k, cn * ohw});
    b.im2col(x.slice(n0, cn), g, colv);
    if (cn == 1) {
      b.gemm(false, false, 1.0f, w2, colv, 0.0f, y.slice(n0, 1).reshape({d.oc, ohw}));
    } else {
      const Tensor t = tmp.head({d.oc, cn * ohw});
      b.gemm(false, false, 1.0f, w2, colv, 0.0f, t);
      b.transpose01(t.reshape({d.oc, cn, ohw}), y.slice(n0, cn).reshape({cn, d.oc, ohw}));
    }
  }
  if (bias.defined()) b.addBias(y, bias);
}

void composedConv2dBackwardData(Backend& b, std::string_view device, const Tensor& dy,
                                const Tensor& w, const Window2d& g, const Tensor& dx) {
  const ConvDims d = checkConv(dx, w, Tensor(), dy, g, device, "conv2dBackwardData");
  const int64_t ohw = pixels(g);
  const Tensor w2 = w.reshape({d.oc, d.k});
  const int64_t c = convColumnChunk(g, d.oc, d.n);
  Tensor col = b.empty({d.k, c * ohw});
  Tensor tmp = c > 1 ? b.empty({d.oc, c * ohw}) : Tensor();
  for (int64_t n0 = 0; n0 < d.n; n0 += c) {
    const int64_t cn = std::min(c, d.n - n0);
    const Tensor dyt = channelMajor(b, dy, n0, cn, tmp);
    const Tensor colv = col.head({d.k, cn * ohw});
    b.gemm(true, false, 1.0f, w2, dyt, 0.0f, colv);
    b.col2im(colv, g, dx.slice(n0, cn));
  }
}

void composedConv2dBackwardWeight(Backend& b, std::string_view device, const Tensor& x,
                                  const Tensor& dy, const Window2d& g, const Tensor& dw,
                                  const Tensor& db) {
  const ConvDims d = checkConv(x, dw, db, dy, g, device, "conv2dBackwardWeight");
  const int64_t ohw = pixels(g);
  const Tensor dw2 = dw.reshape({d.oc, d.k});
  if (db.defined()) b.biasGrad(dy, db.reshape({d.oc}));
  const int64_t c = convColumnChunk(g, d.oc, d.n);
  Tensor col = b.empty({d.k, c * ohw});
  Tensor tmp = c > 1 ? b.empty({d.oc, c * ohw}) : Tensor();
  for (int64_t n0 = 0; n0 < d.n; n0 += c) {
    const int64_t cn = std::min(c, d.n - n0);
    const Tensor dyt = channelMajor(b, dy, n0, cn, tmp);
    const Tensor colv = col.head({d.k, cn * ohw});
    b.im2col(x.slice(n0, cn), g, colv);
    b.gemm(false, true, 1.0f, dyt, colv, 1.0f, dw2);
  }
}

}  // namespace tandem::backends
