// A Backend over another one that records which ops it runs, on which dtypes (the OpUse
// convention of core/backend_ops.h), and can be told to lack some: supports() says no to
// those and calling one throws Unsupported, as a backend without the kernel would. Tests
// use it to check what layers declare they run, and how the profile, the partitioner and
// the importer treat a device that lacks an op. beforeOp() lets a test slow it down.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <type_traits>
#include <vector>

#include "core/backend.h"
#include "core/error.h"

namespace tandem::testing {

class ForwardingBackend final : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner, std::set<OpUse> lacks = {})
      : inner_(inner), lacks_(std::move(lacks)) {}

  // Ops run since the last clear(), while recording.
  const std::set<OpUse>& used() const { return used_; }
  void clear() { used_.clear(); }
  void record(bool on) { recording_ = on; }
  // Called before each op with the op and the element count of its first tensor argument
  // (0 without one): a slower device, in proportion to the data an op works on.
  void beforeOp(std::function<void(Op, int64_t)> f) { before_ = std::move(f); }

  DeviceInfo info() const override { return inner_.info(); }
  std::shared_ptr<Storage> allocate(size_t bytes) override { return inner_.allocate(bytes); }
  MemoryUse memoryUse() const override { return inner_.memoryUse(); }
  const void* hostData(const Tensor& t) const override { return inner_.hostData(t); }
  std::shared_ptr<Storage> adoptHost(void* data, size_t bytes,
                                     std::function<void()> release) override {
    return inner_.adoptHost(data, bytes, std::move(release));
  }
  bool supports(Op op, DType dtype) const override {
    return !lacks_.count({op, dtype}) && inner_.supports(op, dtype);
  }

#define TANDEM_FORWARD_OP(Name, Ret, name, Params, Args) \
  Ret name Params override {                             \
    seen(Op::k##Name, tensorsOf Args);                   \
    return inner_.name Args;                             \
  }
  TANDEM_BACKEND_OPS(TANDEM_FORWARD_OP)
#undef TANDEM_FORWARD_OP

 private:
  // An op's tensor arguments, in order.
  template <typename... A>
  static std::vector<const Tensor*> tensorsOf(const A&... args) {
    std::vector<const Tensor*> out;
    [[maybe_unused]] auto one = [&](const auto& a) {
      if constexpr (std::is_same_v<std::decay_t<decltype(a)>, Tensor>) out.push_back(&a);
    };
    (one(args), ...);
    return out;
  }
  void seen(Op op, const std::vector<const Tensor*>& tensors) {
    OpUse use{op, tensors.empty() ? DType::kF32 : tensors.front()->dtype()};
    if (op == Op::kConvert && use.dtype == DType::kF32 && tensors.size() > 1)
      use.dtype = tensors[1]->dtype();
    if (lacks_.count(use)) throw Unsupported("this backend lacks " + opUseName(use));
    if (recording_) used_.insert(use);
    if (before_) before_(op, tensors.empty() ? 0 : tensors.front()->numel());
  }

  Backend& inner_;
  std::set<OpUse> lacks_;
  std::set<OpUse> used_;
  bool recording_ = true;
  std::function<void(Op, int64_t)> before_;
};

}  // namespace tandem::testing
