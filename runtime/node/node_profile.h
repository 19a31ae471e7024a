// Profiling a model on a node's devices for the partitioner (`partition: auto` without a
// profile file): the coordinator sends each node's daemon a `profile task` naming its
// devices; the daemon measures each layer forward and backward (core/profile/profile.h)
// and answers with a tandem-profile document, one per batch the task asks (a plan pricing
// several microbatch counts asks them all at once: the sustained window, the optimizers'
// update and the message CPU, which do not depend on the batch, are measured once for all
// of them, so the plans it compares share those measurements). Results are cached in the node's
// cache folder by a hash of everything the measurement depends on — the model spec's text, the
// batch, warm-up and repeats, the device's backend, threads and load, and the build — so a
// second plan of the same model on the same node measures nothing.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/profile/profile.h"
#include "partitioner/cluster.h"
#include "runtime/control/channel.h"
#include "runtime/control/messages.h"

namespace tandem::runtime {

// The bytes a training pass of `model` at `batch` holds at least: parameters with their
// gradients and optimizer state, every layer's output and its gradient, and the stash.
int64_t trainingBytes(const Model& model, int64_t batch);

// The longest a device's layer timing should take when a task lets it measure at a smaller
// batch (ProfileTask::least_batch): seconds, estimated before measuring.
inline constexpr double kProfileBudgetSeconds = 1.5;

// The batch a device is measured at for a task asking `batch` down to `least` (0, or not
// below `batch`: `batch` itself): the largest of batch, batch / 2, ... (not below `least`)
// whose layer timing — `passes` training passes, each taking `least_pass_s` (measured at
// `least`) grown in proportion to the batch — fits in `budget_s`, and that `fits`
// (memory). A fast device (a GPU, launch-bound at small batches) is so measured at the
// microbatch the job runs; a slow one at a smaller batch, scaled from there.
int64_t profileBatch(int64_t batch, int64_t least, double least_pass_s, int passes, double budget_s,
                     const std::function<bool(int64_t)>& fits);

// The daemon's side: measures `task` here, each device from the cache in `cache_dir`
// (empty: no cache) when present and valid, else measured and stored. Each device gets at
// most this node's CPUs as threads and as copies of the model training beside it (the
// load), at the batch profileBatch picks. InvalidArgument for a model this node cannot
// hold (every copy the task builds, parameters and activations at the least batch, over
// half the free memory) or a device it lacks.
ProfileResult profileHere(const ProfileTask& task, const std::string& cache_dir);

// The two ends of a link within this node, each driven by its own thread (one thread
// drives a link): `far` on a new thread, `near` on this one. Returns once both are done;
// rethrows near's error, else far's.
void bothEnds(const std::function<void()>& far, const std::function<void()>& near);

// A tensor group's all-reduce in this process (Profile::group_allreduce): two ranks on
// the in-process group, threads as a tensor-split stage's ranks are, each summing its
// buffer of 4 KiB, 64 KiB and 1 MiB with the other's; the median wall time per
// all-reduce, rank 0's, over 30 rounds that both ranks enter together (a barrier of their
// own before each), after 5 of warm-up.
std::vector<GroupAllreduce> measureGroupAllreduce();

// What node `node` of `cluster` measures of `model_spec` at `batch`: each of its devices
// (one entry per backend and thread count) that `measure` accepts, each alone on the
// node (load 0): what stages co-located on its cores cost each other is the step
// simulation's to price, from their busy share (partitioner/simulate.h), where a profile
// taken with the neighbours training all the time beside it priced them busy always.
ProfileTask nodeProfileTask(const partitioner::ClusterNode& node, const std::string& model_spec,
                            int64_t batch,
                            const std::function<bool(const partitioner::ClusterDevice&)>& measure);

// The coordinator's side: sends every node its task (one channel each, in order), then
// gathers the answers, each parsed and checked to hold one device per task device with
// the model's layers, at the batch asked. Error naming the node (`names`) that failed or
// did not answer within `timeout`. `cached` (optional) gets the devices each node had
// cached; `more` (optional) each node's profiles at its task's more_batches, in order (a
// daemon too old to measure them in one task is asked once per batch).
std::vector<Profile> profileOnNodes(const std::vector<Channel*>& channels,
                                    const std::vector<std::string>& names,
                                    const std::vector<ProfileTask>& tasks,
                                    std::chrono::seconds timeout,
                                    std::vector<int>* cached = nullptr,
                                    std::vector<std::vector<Profile>>* more = nullptr);

}  // namespace tandem::runtime
