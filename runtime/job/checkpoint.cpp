#include "runtime/job/checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "runtime/control/files.h"
#include "runtime/control/job_settings.h"

namespace tandem::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSchema = "tandem-checkpoint";

std::string stepName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%012lld", static_cast<long long>(step));
  return name;
}

// The steps of the manifests in `dir`, newest first.
std::vector<int64_t> manifestSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != 22 || !name.starts_with("step-") || !name.ends_with(".json")) continue;
    const std::string digits = name.substr(5, 12);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    steps.push_back(std::stoll(digits));
  }
  if (ec) throw IoError("cannot read the checkpoint folder '" + dir + "': " + ec.message());
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

json jobJson(const CheckpointJob& j) {
  return {{"model_spec_hash", j.model_spec_hash},
          {"batch", j.batch},
          {"microbatches", j.microbatches},
          {"train_limit", j.train_limit},
          {"seed", j.seed},
          {"data", j.data},
          {"optimizer", j.optimizer}};
}

void checkShares(const CheckpointShares& r) {
  if (r.nodes.size() != r.shares.size())
    throw InvalidArgument("the replicas' shares name " + std::to_string(r.nodes.size()) +
                          " nodes for " + std::to_string(r.shares.size()) + " shares");
  if (r.shares.size() == 1 || r.shares.size() > kMaxReplicaShares)
    throw InvalidArgument("the replicas' shares are " + std::to_string(r.shares.size()) +
                          " (2 to " + std::to_string(kMaxReplicaShares) + ")");
  for (size_t i = 0; i < r.shares.size(); ++i) {
    if (r.nodes[i].empty())
      throw InvalidArgument("replica " + std::to_string(i) + "'s node name is empty");
    if (!(r.shares[i] > 0 && r.shares[i] <= 1e9))
      throw InvalidArgument("replica " + std::to_string(i) + "'s share is not in (0, 1e9]");
  }
}

// The checkpoint of `step` in `dir`, checked; FormatError saying what is wrong.
Checkpoint readCheckpoint(const std::string& dir, int64_t step) {
  const std::string manifest_path = (fs::path(dir) / (stepName(step) + ".json")).string();
  json m;
  try {
    m = json::parse(readFile(manifest_path, "checkpoint manifest"));
  } catch (const json::exception& e) {
    throw FormatError("its manifest is not JSON (" + std::string(e.what()) + ")");
  }
  Checkpoint c;
  std::string hash;
  int64_t bytes = 0;
  try {
    if (m.at("schema").get<std::string>() != kSchema || m.at("version").get<int>() != 1)
      throw FormatError("its manifest is not a tandem-checkpoint of version 1");
    c.step = m.at("step").get<int64_t>();
    hash = m.at("model_hash").get<std::string>();
    bytes = m.at("model_bytes").get<int64_t>();
    const json& j = m.at("job");
    c.job = {j.at("model_spec_hash").get<std::string>(),
             j.at("batch").get<int64_t>(),
             j.at("microbatches").get<int64_t>(),
             j.at("train_limit").get<int64_t>(),
             j.at("seed").get<uint64_t>(),
             j.at("data").get<std::string>(),
             j.at("optimizer").get<std::string>()};
    if (m.contains("replicas")) {
      const json& r = m.at("replicas");
      c.replicas = {r.at("nodes").get<std::vector<std::string>>(),
                    r.at("shares").get<std::vector<double>>()};
    }
  } catch (const json::exception& e) {
    throw FormatError("its manifest lacks a field or has one of the wrong type (" +
                      std::string(e.what()) + ")");
  }
  if (c.step != step) throw FormatError("its manifest names step " + std::to_string(c.step));
  try {
    checkShares(c.replicas);
  } catch (const InvalidArgument& e) {
    throw FormatError("its manifest's replicas: " + std::string(e.what()));
  }
  c.model_path = (fs::path(dir) / (stepName(step) + ".tdm")).string();
  const std::string text = readFile(c.model_path, "checkpoint model file");
  c.model.assign(text.begin(), text.end());
  if (static_cast<int64_t>(c.model.size()) != bytes)
    throw FormatError(c.model_path + " holds " + std::to_string(c.model.size()) +
                      " bytes where its manifest says " + std::to_string(bytes));
  if (contentHash(c.model) != hash)
    throw FormatError(c.model_path + " does not hash as its manifest says (corrupted)");
  return c;
}

}  // namespace

CheckpointJob checkpointJob(const JobSpec& job, const std::string& model_spec) {
  const std::vector<uint8_t> spec(model_spec.begin(), model_spec.end());
  const OptimizerOptions& o = job.train.optimizer;
  char optimizer[384];
  std::snprintf(optimizer, sizeof optimizer,
                "%s lr %g momentum %g nesterov %d weight_decay %g beta1 %g beta2 %g eps %g "
                "lr_schedule %s warmup_steps %lld decay_steps %lld decay_factor %g min_lr %g",
                o.kind.c_str(), o.lr, o.momentum, o.nesterov ? 1 : 0, o.weight_decay, o.beta1,
                o.beta2, o.eps, o.lr_schedule.c_str(), static_cast<long long>(o.warmup_steps),
                static_cast<long long>(o.decay_steps), o.decay_factor, o.min_lr);
  return {contentHash(spec),
          job.train.batch,
          job.train.microbatches,
          job.data.train_limit,
          job.train.seed,
          job.data.name,
          optimizer};
}

void writeCheckpoint(const std::string& dir, int64_t step, const std::vector<uint8_t>& model,
                     const CheckpointJob& job, int keep, const CheckpointShares& replicas) {
  checkShares(replicas);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot make the checkpoint folder '" + dir + "': " + ec.message());
  const fs::path base = fs::path(dir) / stepName(step);
  writeFileAtomically(base.string() + ".tdm", model, 0666);
  json m = {{"schema", kSchema},
            {"version", 1},
            {"step", step},
            {"model_file", base.filename().string() + ".tdm"},
            {"model_hash", contentHash(model)},
            {"model_bytes", static_cast<int64_t>(model.size())},
            {"job", jobJson(job)}};
  // (Doubles are written with the digits that read back as the same double.)
  if (!replicas.shares.empty())
    m["replicas"] = {{"nodes", replicas.nodes}, {"shares", replicas.shares}};
  const std::string text = m.dump(2) + "\n";
  writeFileAtomically(base.string() + ".json",
                      std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), 0666);
  const std::vector<int64_t> steps = manifestSteps(dir);
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i) {
    const fs::path old = fs::path(dir) / stepName(steps[i]);
    fs::remove(old.string() + ".json", ec);  // the manifest first: never a manifest alone
    fs::remove(old.string() + ".tdm", ec);
  }
}

std::optional<Checkpoint> newestCheckpoint(const std::string& dir) {
  if (!fs::is_directory(dir)) throw IoError("no checkpoint folder '" + dir + "'");
  for (int64_t step : manifestSteps(dir)) {
    try {
      return readCheckpoint(dir, step);
    } catch (const Error& e) {
      spdlog::warn("checkpoint at step {} in {} is damaged, passed over: {}", step, dir, e.what());
    }
  }
  return std::nullopt;
}

void checkResumable(const Checkpoint& checkpoint, const CheckpointJob& job,
                    const std::string& job_source) {
  const CheckpointJob& was = checkpoint.job;
  auto differ = [&](const char* what, const std::string& then, const std::string& now) {
    throw InvalidArgument(job_source + ": the checkpoint at step " +
                          std::to_string(checkpoint.step) + " (" + checkpoint.model_path +
                          ") was taken with " + what + " " + then + ", the job has " + now +
                          ": a resumed run would not continue that run");
  };
  if (was.model_spec_hash != job.model_spec_hash)
    differ("another model spec", was.model_spec_hash.substr(0, 12) + "...",
           job.model_spec_hash.substr(0, 12) + "...");
  if (was.batch != job.batch) differ("batch", std::to_string(was.batch), std::to_string(job.batch));
  if (was.microbatches != job.microbatches)
    differ("microbatches", std::to_string(was.microbatches), std::to_string(job.microbatches));
  if (was.train_limit != job.train_limit)
    differ("train_limit", std::to_string(was.train_limit), std::to_string(job.train_limit));
  if (was.seed != job.seed) differ("seed", std::to_string(was.seed), std::to_string(job.seed));
  if (was.data != job.data) differ("data", was.data, job.data);
  if (was.optimizer != job.optimizer) differ("optimizer", was.optimizer, job.optimizer);
}

}  // namespace tandem::runtime
