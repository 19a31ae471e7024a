// TensorStage: one pipeline stage split over the ranks of a tensor group in one process
// (core/layers/tensor_split.h). Each rank holds the stage's layers split by its share, its
// own optimizer and StageTrainer, and runs on its own thread and backend; the split layers'
// all-reduces keep the ranks in step. Rank 0 alone talks to the neighbouring stages:
// what it receives it broadcasts to the other ranks (each rank's RankLink), and of what
// the ranks send — the stage's output and its input gradient, whole and the same on every
// rank after the all-reduces — rank 0's goes out. The neighbours see an ordinary stage.
//
// Every rank runs the same schedule over the same microbatches, so the ranks' receives
// and collectives come in the same order on each, which is what matches their tags.
// Ranks on unlike devices (a CPU and an OpenCL device) end each training step with rank
// 0's replicated parameters broadcast to the others, as TensorParallelTrainer's do.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/comm/group.h"
#include "core/pipeline/stage_decoder.h"
#include "core/pipeline/stage_trainer.h"
#include "core/train/job_thread.h"

namespace tandem {

// Where a tensor-split stage's broadcasts and barriers are tagged from (RankLink's
// next_tag), apart from the split layers' all-reduces (counted from 0) and a trainer's
// resync (2^41 on).
inline constexpr uint64_t kTensorStageTags = uint64_t{1} << 43;

// Rank r's side of one of a tensor-split stage's links. Rank 0's wraps the stage's link:
// it receives, then broadcasts the tensor (its shape first) to the group; the others'
// take it from the broadcast. Sends go out on rank 0's link and are dropped elsewhere
// (every rank holds the same tensor). `next_tag` numbers the broadcasts, shared by a
// rank's links; `timeout` bounds each. f32 and i32 tensors (i32 bit for bit: a decoder's
// messages carry activations bit-cast into int32).
class RankLink final : public Link {
 public:
  RankLink(Link* link, Group& group, uint64_t& next_tag, std::chrono::milliseconds timeout,
           std::string peer);
  void send(const MessageTag& tag, const Tensor& t) override;
  Tensor recv(const MessageTag& tag, Backend& backend) override;
  const std::string& peer() const override { return peer_; }

 private:
  Link* link_;  // rank 0's; null elsewhere
  Group& group_;
  uint64_t& next_tag_;
  std::chrono::milliseconds timeout_;
  std::string peer_;
};

// One rank's parts: a model of the stage's layers made rank group->rank() of the tensor
// group (Model::splitForTensor) and built, and its optimizer.
struct TensorRank {
  Model* model = nullptr;
  Optimizer* optimizer = nullptr;  // null: evaluating or serving only
  Group* group = nullptr;
};

class TensorStage {
 public:
  using Rank = TensorRank;  // ranks[r].group is rank r
  // `prev` and `next` as StageTrainer's (null at the ends); options.replicas must be
  // null (a tensor-split stage is not replicated). Collectives wait options.collective_timeout.
  TensorStage(std::vector<Rank> parts, StageRange range, Link* prev, Link* next,
              const PipelineOptions& options);
  ~TensorStage();

  int ranks() const { return static_cast<int>(ranks_.size()); }
  // StageTrainer's, every rank at once. `progress` runs on rank 0 after each step while
  // the other ranks wait for it, so it may read every rank's model (a checkpoint's merge).
  EpochReport trainEpoch(const Dataset* data, int64_t samples, int64_t epoch,
                         const std::function<void(const StepReport&)>& progress,
                         int64_t first_step = 0);
  // Rank 0's result; stream.answer is called on rank 0 only.
  EvalResult evaluate(const Dataset* data, int64_t samples, int64_t batch,
                      const EvalStream& stream = {});
  void resumeAt(int64_t steps);
  int64_t stepsTaken() const { return trainers_.front()->stepsTaken(); }
  // Whether each step ends with rank 0's replicated parameters sent to the others (the
  // ranks' devices are not all alike; TensorParallelTrainer::resyncs).
  bool resyncs() const { return resync_; }
  StageExecutor& executor(int rank = 0) {
    return trainers_.at(static_cast<size_t>(rank))->executor();
  }

 private:
  std::vector<Rank> ranks_;
  // Per rank: its broadcast tags (shared by its two links) and its trainer; every rank's
  // links.
  std::vector<uint64_t> tags_;
  std::vector<std::unique_ptr<RankLink>> links_;
  std::vector<std::unique_ptr<StageTrainer>> trainers_;
  std::chrono::milliseconds timeout_;
  bool resync_ = false;
  std::vector<std::unique_ptr<JobThread>> threads_;  // ranks 1.. (rank 0: the caller's)
};

// A generation's stage after the first split over tensor ranks: a StageDecoder per rank
// (ranks[r].model, built and split) over its RankLinks — prev, next and the last stage's
// feedback link, rank 0's the given ones — each on its own thread, `each(rank, decoder)`
// run on every rank at once (its serve or run; rank 0's on the caller's thread); returns
// when all have, raising the first error. A stage after the first only answers its
// messages, in order, so the ranks stay in step on rank 0's broadcasts; each keeps the
// key/value cache of its own heads. (The first stage takes requests by the clock.)
void onTensorDecoders(const std::vector<TensorRank>& ranks, StageRange range, Link* prev,
                      Link* next, Link* feedback, const DecoderOptions& options,
                      std::chrono::milliseconds timeout,
                      const std::function<void(int, StageDecoder&)>& each);

}  // namespace tandem
