// Gradient buckets (core/train/gradient_buckets.h): every parameter's gradient summed
// across replicas, each bucket leaving as soon as its layers are reported done — on a
// communication thread while the caller goes on, or on the caller's thread — and errors
// reaching the caller.
#include "core/train/gradient_buckets.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "tests/test_util.h"
#include "transport/local_group.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::expectNoErrors;
using testing::onThreads;

// A Group that notes which allreduce tags have begun, then sums through `inner`.
class WatchedGroup final : public Group {
 public:
  explicit WatchedGroup(Group& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void allreduce(std::span<float> data, const AllreduceOptions& o) override {
    {
      std::lock_guard lock(mutex_);
      begun_.insert(o.tag);
    }
    cv_.notify_all();
    inner_.allreduce(data, o);
  }
  void reduceScatter(std::span<float> d, const AllreduceOptions& o) override {
    inner_.reduceScatter(d, o);
  }
  void allGather(std::span<float> d, const CollectiveOptions& o) override {
    inner_.allGather(d, o);
  }
  void broadcast(std::span<float> d, const RootOptions& o) override { inner_.broadcast(d, o); }
  void reduce(std::span<float> d, const ReduceOptions& o) override { inner_.reduce(d, o); }
  void gather(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    inner_.gather(in, out, o);
  }
  void scatter(std::span<const float> in, std::span<float> out, const RootOptions& o) override {
    inner_.scatter(in, out, o);
  }
  void barrier(const CollectiveOptions& o) override { inner_.barrier(o); }

  bool begun(uint64_t tag) {
    std::lock_guard lock(mutex_);
    return begun_.count(tag) != 0;
  }
  // Waits (at most 20 s) for the allreduce of `tag` to begin.
  bool waitFor(uint64_t tag) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, 20s, [&] { return begun_.count(tag) != 0; });
  }

 private:
  Group& inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::set<uint64_t> begun_;
};

// Every gradient of rank r's model set to r + 1 + (its index within the model) / 1000.
void fillGradients(Model& m, int r) {
  size_t i = 0;
  for (Param* p : m.params()) {
    std::vector<float> g(static_cast<size_t>(p->grad.numel()));
    for (float& x : g) x = static_cast<float>(r + 1) + static_cast<float>(i++) / 1000.0f;
    m.backend().upload(p->grad, g.data());
  }
}

// After the sum over ranks 0 and 1: 3 + 2 * index / 1000.
void expectSummed(Model& m) {
  size_t i = 0;
  for (Param* p : m.params()) {
    for (float x : toHost(p->grad)) {
      const float want =
          1.0f + static_cast<float>(i) / 1000.0f + 2.0f + static_cast<float>(i) / 1000.0f;
      ASSERT_FLOAT_EQ(x, want) << p->name << ", gradient " << i;
      ++i;
    }
  }
}

// The buckets' first allreduce begins while layers are still to be reported: on the
// communication thread before the caller reports the rest (waited for), or inside the
// caller's own layerDone.
TEST(GradientBucketsTest, ABucketIsSummedAsSoonAsItsLayersAreDone) {
  for (const bool thread : {true, false}) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(thread ? "communication thread" : "caller's thread") +
                   (in_place ? ", in place" : ", copied"));
      auto local = transport::makeLocalGroup(2);
      expectNoErrors(onThreads(2, [&](int r) {
        cpu::CpuBackend be(cpu::CpuOptions{1});
        Model m(parseModelSpec(testing::kTinyNet));
        m.build(be, 1);
        WatchedGroup group(*local[static_cast<size_t>(r)]);
        BucketOptions o;
        o.bucket_bytes = 4;  // a bucket per layer with parameters
        o.comm_thread = thread;
        o.in_place = in_place;
        GradientBuckets buckets(m, 0, m.size(), group, o);
        // One per layer with parameters: conv, two linears, layernorm (in place: one per
        // parameter, two each).
        EXPECT_EQ(buckets.size(), in_place ? 8u : 4u);
        for (int step = 0; step < 2; ++step) {
          fillGradients(m, r);
          const uint64_t tag = 100 * static_cast<uint64_t>(step);
          buckets.start(tag);
          buckets.layerDone(m.size() - 1);  // the last linear's bucket(s) are ready
          if (thread) {
            EXPECT_TRUE(group.waitFor(tag)) << "no allreduce began before finish";
          } else {
            EXPECT_TRUE(group.begun(tag)) << "layerDone did not sum the ready bucket";
          }
          EXPECT_FALSE(group.begun(tag + buckets.size() - 1))
              << "the first layer's bucket left early";
          for (size_t l = m.size() - 1; l-- > 0;) buckets.layerDone(l);
          buckets.finish();
          expectSummed(m);
        }
      }));
    }
  }
}

// A replica with nothing to report (no samples this step) still sends every bucket at
// finish, in order, so the others are not left waiting.
TEST(GradientBucketsTest, UnreportedLayersAreSentAtFinish) {
  auto local = transport::makeLocalGroup(2);
  expectNoErrors(onThreads(2, [&](int r) {
    cpu::CpuBackend be(cpu::CpuOptions{1});
    Model m(parseModelSpec(testing::kTinyNet));
    m.build(be, 1);
    BucketOptions o;
    o.bucket_bytes = 64;
    o.comm_thread = true;
    GradientBuckets buckets(m, 0, m.size(), *local[static_cast<size_t>(r)], o);
    fillGradients(m, r);
    buckets.start(0);
    if (r == 0)
      for (size_t l = m.size(); l-- > 0;) buckets.layerDone(l);
    buckets.finish();
    expectSummed(m);
  }));
}

// A stage's buckets cover its own layers only.
TEST(GradientBucketsTest, AStageSumsItsOwnLayers) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, 1, 5, 9);  // the linear, gelu, layernorm, linear
  auto local = transport::makeLocalGroup(1);
  GradientBuckets buckets(m, 5, 9, *local[0], BucketOptions{4, 1000ms, false, false, {}});
  EXPECT_EQ(buckets.size(), 3u);
  testing::expectThrowWith<InvalidArgument>(
      [&] { GradientBuckets(m, 5, 10, *local[0], BucketOptions{}); },
      {"layers [5, 10) of a model with 9"});
  testing::expectThrowWith<InvalidArgument>([&] { buckets.finish(); }, {"finish outside a step"});
}

// A peer that never sums: finish raises the collective's Timeout; a step given up
// (abandon) releases the communication thread, which waits without a deadline for the
// buckets to come (a hang here is the failure).
TEST(GradientBucketsTest, ErrorsReachTheCallerAndAbandonReleasesTheThread) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(testing::kTinyNet));
  m.build(be, 1);
  auto local = transport::makeLocalGroup(2);  // rank 1 never comes
  BucketOptions o;
  o.timeout = 200ms;
  o.comm_thread = true;
  GradientBuckets buckets(m, 0, m.size(), *local[0], o);
  buckets.start(0);
  testing::expectThrowWith<Timeout>([&] { buckets.finish(); }, {"rank 1"});
  auto alone = transport::makeLocalGroup(2);
  GradientBuckets waiting(m, 0, m.size(), *alone[0], o);
  waiting.start(0);
  waiting.abandon();  // nothing handed over: the thread, waiting for bucket 0, returns
  auto one = transport::makeLocalGroup(1);
  GradientBuckets solo(m, 0, m.size(), *one[0], o);
  fillGradients(m, 0);
  solo.start(0);
  solo.finish();  // a group of one: the sums are the gradients themselves
  EXPECT_FLOAT_EQ(toHost(m.params()[0]->grad)[0], 1.0f);
}

}  // namespace
}  // namespace tandem
