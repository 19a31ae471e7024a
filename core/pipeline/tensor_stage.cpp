#include "core/pipeline/tensor_stage.h"

#include <cstring>

#include "core/error.h"
#include "core/layers/tensor_split.h"
#include "core/spin.h"
#include "core/train/tensor_parallel.h"

namespace tandem {

namespace {

// What the header of a received tensor holds: its dtype, rank and up to kMaxDims dims.
constexpr size_t kMaxDims = 8;
constexpr float kExact = 16777216.0f;  // 2^24: integers up to it are exact in f32

// Rank r's side of `link` (null where the stage has none), kept in `keep`: rank 0's wraps
// it, the others' take what rank 0 broadcasts.
Link* rankSide(Link* link, size_t r, Group& group, uint64_t& next_tag,
               std::chrono::milliseconds timeout, std::vector<std::unique_ptr<RankLink>>& keep) {
  if (!link) return nullptr;
  keep.push_back(
      std::make_unique<RankLink>(r == 0 ? link : nullptr, group, next_tag, timeout, link->peer()));
  return keep.back().get();
}

}  // namespace

RankLink::RankLink(Link* link, Group& group, uint64_t& next_tag, std::chrono::milliseconds timeout,
                   std::string peer)
    : link_(link), group_(group), next_tag_(next_tag), timeout_(timeout), peer_(std::move(peer)) {}

void RankLink::send(const MessageTag& tag, const Tensor& t) {
  if (link_) link_->send(tag, t);
}

Tensor RankLink::recv(const MessageTag& tag, Backend& backend) {
  RootOptions o;
  o.timeout = timeout_;
  o.tag = next_tag_++;
  std::vector<float> header(2 + kMaxDims, 0.0f);
  Tensor t;
  if (link_) {
    t = link_->recv(tag, backend);
    TANDEM_CHECK_MSG(t.dtype() == DType::kF32 || t.dtype() == DType::kI32, Unsupported,
                     "a tensor-split stage received a "
                         << dtypeName(t.dtype()) << " " << messageKindName(tag.kind) << " from "
                         << link_->peer() << "; it takes f32 or i32");
    TANDEM_CHECK_MSG(static_cast<size_t>(t.shape().rank()) <= kMaxDims, Unsupported,
                     "a tensor-split stage received a "
                         << t.shape() << " " << messageKindName(tag.kind) << "; it takes at most "
                         << kMaxDims << " dimensions");
    header[0] = static_cast<float>(t.dtype());
    header[1] = static_cast<float>(t.shape().rank());
    for (int64_t d = 0; d < t.shape().rank(); ++d) {
      TANDEM_CHECK_MSG(t.shape()[d] < static_cast<int64_t>(kExact), Unsupported,
                       "a tensor-split stage received a " << t.shape() << " "
                                                          << messageKindName(tag.kind)
                                                          << ": a dimension past 2^24");
      header[static_cast<size_t>(2 + d)] = static_cast<float>(t.shape()[d]);
    }
  }
  broadcast(group_, header, o);
  std::vector<int64_t> dims;
  for (size_t d = 0; d < static_cast<size_t>(header[1]); ++d)
    dims.push_back(static_cast<int64_t>(header[2 + d]));
  const Shape shape{std::span<const int64_t>(dims)};
  const auto dtype = static_cast<DType>(static_cast<uint8_t>(header[0]));
  o.tag = next_tag_++;
  if (dtype == DType::kF32) {
    if (!link_) t = backend.empty(shape, DType::kF32);
    broadcastTensor(backend, t, group_, o);
    return t;
  }
  // i32 (labels, token ids, a decoder's headers and bit-cast activations): bit for bit
  // through the f32 broadcast, which copies and never computes.
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  if (link_) {
    const std::vector<int32_t> ints = toHostI32(t);
    std::memcpy(values.data(), ints.data(), ints.size() * sizeof(int32_t));
  }
  broadcast(group_, values, o);
  if (link_) return t;
  std::vector<int32_t> ints(values.size());
  std::memcpy(ints.data(), values.data(), ints.size() * sizeof(int32_t));
  return toDeviceI32(backend, shape, ints);
}

TensorStage::TensorStage(std::vector<Rank> parts, StageRange range, Link* prev, Link* next,
                         const PipelineOptions& options)
    : ranks_(std::move(parts)),
      tags_(ranks_.size(), kTensorStageTags),
      timeout_(options.collective_timeout) {
  TANDEM_CHECK_MSG(!ranks_.empty(), InvalidArgument, "a tensor-split stage needs a rank");
  TANDEM_CHECK_MSG(options.replicas == nullptr || options.replicas->size() == 1, Unsupported,
                   "stage " << range.stage << ": a tensor-split stage cannot have replicas");
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const Rank& rank = ranks_[r];
    TANDEM_CHECK_MSG(rank.model && rank.group && rank.group->rank() == static_cast<int>(r) &&
                         rank.group->size() == ranks(),
                     InvalidArgument,
                     "stage " << range.stage << ": tensor rank " << r << " lacks its model or is "
                              << "not rank " << r << " of a group of " << ranks());
    Link* p = rankSide(prev, r, *rank.group, tags_[r], timeout_, links_);
    Link* n = rankSide(next, r, *rank.group, tags_[r], timeout_, links_);
    trainers_.push_back(
        std::make_unique<StageTrainer>(*rank.model, range, p, n, rank.optimizer, options));
    if (r > 0) threads_.push_back(std::make_unique<JobThread>(waitBeforeSleeping(ranks())));
    resync_ =
        resync_ || rank.model->backend().info().name != ranks_.front().model->backend().info().name;
  }
}

TensorStage::~TensorStage() = default;

EpochReport TensorStage::trainEpoch(const Dataset* data, int64_t samples, int64_t epoch,
                                    const std::function<void(const StepReport&)>& progress,
                                    int64_t first_step) {
  EpochReport report;
  runOnEvery(threads_, [&](int r) {
    const auto rank = static_cast<size_t>(r);
    CollectiveOptions o;
    o.timeout = timeout_;
    const Rank& part = ranks_[rank];
    auto each_step = [&, r, rank](const StepReport& s) {
      if (resync_) {  // unlike devices: rank 0's replicated parameters for all
        RootOptions ro;
        ro.timeout = timeout_;
        ro.tag = tags_[rank];
        tags_[rank] += part.model->params().size() + 1;
        broadcastReplicated(*part.model, *part.group, ro);
      }
      if (!progress) return;
      // Every rank waits while rank 0 reports a step: none has begun the next one.
      o.tag = tags_[rank]++;
      barrier(*part.group, o);
      if (r == 0) progress(s);
      o.tag = tags_[rank]++;
      barrier(*part.group, o);
    };
    const EpochReport mine =
        trainers_[rank]->trainEpoch(data, samples, epoch, each_step, first_step);
    if (r == 0) report = mine;
  });
  return report;
}

EvalResult TensorStage::evaluate(const Dataset* data, int64_t samples, int64_t batch,
                                 const EvalStream& stream) {
  EvalResult result;
  runOnEvery(threads_, [&](int r) {
    EvalStream mine = stream;
    if (r > 0) mine.answer = nullptr;
    const EvalResult ev = trainers_[static_cast<size_t>(r)]->evaluate(data, samples, batch, mine);
    if (r == 0) result = ev;
  });
  return result;
}

void TensorStage::resumeAt(int64_t steps) {
  for (auto& t : trainers_) t->resumeAt(steps);
}

void onTensorDecoders(const std::vector<TensorRank>& ranks, StageRange range, Link* prev,
                      Link* next, Link* feedback, const DecoderOptions& options,
                      std::chrono::milliseconds timeout,
                      const std::function<void(int, StageDecoder&)>& each) {
  TANDEM_CHECK_MSG(!range.first(), Unsupported,
                   "stage 0 of a generation cannot be tensor-split: it takes its requests and "
                   "sends keep-alives by the clock, which its ranks would not see alike");
  const size_t n = ranks.size();
  std::vector<uint64_t> tags(n, kTensorStageTags);
  std::vector<std::unique_ptr<RankLink>> links;
  std::vector<std::unique_ptr<StageDecoder>> decoders;
  std::vector<std::unique_ptr<JobThread>> threads;
  for (size_t r = 0; r < n; ++r) {
    Link* p = rankSide(prev, r, *ranks[r].group, tags[r], timeout, links);
    Link* q = rankSide(next, r, *ranks[r].group, tags[r], timeout, links);
    Link* f = rankSide(feedback, r, *ranks[r].group, tags[r], timeout, links);
    DecoderOptions o = options;
    if (r > 0) o.report = {};  // the stage's stats: rank 0's
    decoders.push_back(std::make_unique<StageDecoder>(*ranks[r].model, range, p, q, f, o));
    if (r > 0)
      threads.push_back(std::make_unique<JobThread>(waitBeforeSleeping(static_cast<int>(n))));
  }
  runOnEvery(threads, [&](int r) { each(r, *decoders[static_cast<size_t>(r)]); });
}

}  // namespace tandem
