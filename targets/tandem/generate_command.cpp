// tandem generate: text from a language model with the key/value cache — a saved model in
// this process (core/generate.h), or a pipeline job's stages on their nodes' daemons
// (core/pipeline/stage_decoder.h through the runtime), several prompts in flight. The
// prompt's bytes are the tokens; time to first token, tokens/s and the inter-token
// latency are reported (for a job, as this process sees them: across the nodes).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "backends/registry.h"
#include "core/error.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/train/tensor_generate.h"
#include "hf/text_codec.h"
#include "runtime/job/job.h"
#include "runtime/job/job_run.h"
#include "runtime/job/model_source.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/interrupt.h"
#include "transport/local_group.h"

namespace tandem::cli {
namespace {

struct GenerateArgs {
  std::string file, prompt, device = "cpu";
  int64_t tokens = 64;
  SamplingOptions sampling;
  int threads = 1;
  bool serve = false, no_cache = false;
  // A job file's: its nodes, its key, the weights to serve, sequences in flight.
  std::string cluster, key, weights;
  int in_flight = 8;
  // A model file's: tensor ranks on this process's threads, each on --device.
  int tensor = 1;
  std::vector<double> shares;
};

// The q-quantile of `v` by the nearest rank; 0 for none.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(i, 1)) - 1];
}

struct Timing {
  double first_ms, tokens_per_s, p50_ms, p99_ms;
};

Timing timing(const Generation& g) {
  double decode_s = 0;
  for (double s : g.intervals_s) decode_s += s;
  return {g.first_token_s * 1e3,
          g.intervals_s.empty() ? 0.0 : static_cast<double>(g.intervals_s.size()) / decode_s,
          quantile(g.intervals_s, 0.5) * 1e3, quantile(g.intervals_s, 0.99) * 1e3};
}

// Prints a token as it comes, the prompt before the first (once the request was accepted).
class Streamer {
 public:
  Streamer(const std::string& prompt, const hf::TextCodec& codec)
      : prompt_(prompt), codec_(codec) {}
  void operator()(int32_t token) {
    if (first_) std::fputs(prompt_.c_str(), stdout);
    first_ = false;
    const std::string text = codec_.tokenText(token);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }

 private:
  const std::string& prompt_;
  const hf::TextCodec& codec_;
  bool first_ = true;
};

// The line after a generated text: `how` says where ("", " (no cache)", " across 2
// stages").
void printSummary(size_t prompt_tokens, const Generation& g, const std::string& how) {
  const Timing t = timing(g);
  std::printf(
      "\n---\n%zu prompt tokens, %zu new%s: time to first token %.2f ms, %.1f tokens/s, "
      "inter-token p50 %.2f ms, p99 %.2f ms\n",
      prompt_tokens, g.tokens.size(), how.c_str(), t.first_ms, t.tokens_per_s, t.p50_ms, t.p99_ms);
}

// The JSON line answering one served prompt.
std::string answerLine(const std::string& prompt, const Generation& g, const hf::TextCodec& codec) {
  const Timing t = timing(g);
  nlohmann::json out{{"prompt", prompt}};
  out["text"] = codec.decode(g.tokens);
  out["first_token_ms"] = t.first_ms;
  out["tokens_per_s"] = t.tokens_per_s;
  out["inter_token_p50_ms"] = t.p50_ms;
  out["inter_token_p99_ms"] = t.p99_ms;
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// What --serve says at the end, on stderr: the prompts answered, their tokens, tokens/s
// over the time from the first prompt's start to the last token, and the time to first
// token p50/p99; `where` says where they ran ("", " across 2 stages").
struct ServeTotals {
  int64_t served = 0, tokens = 0;
  double seconds = 0;
  std::vector<double> first_ms;
  void add(const Generation& g) {
    ++served;
    tokens += static_cast<int64_t>(g.tokens.size());
    first_ms.push_back(g.first_token_s * 1e3);
  }
  void print(const std::string& where) const {
    std::fprintf(stderr,
                 "served %lld prompts%s: %lld tokens, %.1f tokens/s overall, time to first "
                 "token p50 %.2f ms, p99 %.2f ms\n",
                 static_cast<long long>(served), where.c_str(), static_cast<long long>(tokens),
                 seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0, quantile(first_ms, 0.5),
                 quantile(first_ms, 0.99));
  }
};

std::string errorLine(const std::string& prompt, const std::string& error) {
  return nlohmann::json{{"prompt", prompt}, {"error", error}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool isJobFile(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

// A job's stages serving prompts. Each request's times are taken here, from when its
// prompt could go to stage 0 (pushed, and the stages wired) to each of its tokens.
class JobGeneration {
 public:
  JobGeneration(const GenerateArgs& a) : a_(a) {
    runtime::JobSpec job = runtime::loadJobSpec(a.file);
    if (!a.weights.empty()) {
      job.weights = a.weights;
    } else if (job.weights.empty() && !runtime::bringsWeights(job.model)) {
      TANDEM_CHECK_MSG(!job.save.empty() && std::filesystem::exists(job.save), InvalidArgument,
                       job.source << " names no trained weights to generate with: give it "
                                  << "'weights:' (or train it with 'save:' first), or --weights");
      job.weights = job.save;
    }
    runtime::JobRunOptions jo;
    jo.cluster = a.cluster;
    jo.key = a.key;
    jo.tandemd = tandemdProgram();
    jo.mode = runtime::RunMode::kGenerate;
    jo.prompts = &prompts_;
    // One prompt (--prompt) is one sequence in flight, which is what its plan is priced for.
    jo.in_flight = a.serve ? a.in_flight : 1;
    // Everything is checked and placed here, before any worker starts.
    run_ = std::make_unique<runtime::JobRun>(std::move(job), jo);
    shape_ = textShape(Model(parseModelSpec(run_->modelSpec(), run_->job().model)));
    codec_ = runtime::textCodecOf(run_->job().model, run_->job().weights, shape_.vocab);
  }

  // Queues a prompt (from any thread); InvalidArgument when it does not fit the model.
  // Returns its tokens' count.
  size_t push(const std::string& text) {
    const std::vector<int32_t> tokens = codec_.encode(text);
    checkRequest(shape_, tokens, a_.tokens);
    std::lock_guard lock(mu_);
    const auto id = static_cast<int64_t>(requests_.size());
    requests_.push_back({text, Clock::now(), {}, {}});
    prompts_.push({id, tokens, a_.tokens, a_.sampling.temperature, a_.sampling.top_k,
                   a_.sampling.seed, a_.sampling.top_p});
    return tokens.size();
  }
  void close() { prompts_.close(); }

  // Runs the job until every prompt is answered: `done` hears each request as its last
  // token comes, `token` each token.
  void run(const std::function<void(const std::string&, const Generation&)>& done,
           const std::function<void(int64_t, int32_t)>& token) {
    runtime::RunCallbacks cb;
    cb.started = [&](int slot, int64_t pid) {
      const runtime::Assign& as = run_->assignments()[static_cast<size_t>(slot)];
      spdlog::info("{}: layers [{}, {}) on {} ({} threads), pid {}",
                   run_->workerNames()[static_cast<size_t>(slot)], as.slice.layers.begin,
                   as.slice.layers.end, as.slice.device, as.slice.threads, pid);
    };
    const auto t0 = Clock::now();
    cb.wired = [&] {
      std::lock_guard lock(mu_);
      wired_ = Clock::now();
      spdlog::info("{} stages started and wired in {:.2f} s", run_->stages().size(),
                   std::chrono::duration<double>(*wired_ - t0).count());
    };
    cb.token = [&](const runtime::Token& t) {
      const auto now = Clock::now();
      std::unique_lock lock(mu_);
      Request& r = requests_.at(static_cast<size_t>(t.id));
      if (r.ended) return;  // (tokens of a sequence cancelled at its end token, on their way)
      if (t.index == 0) {
        r.g.first_token_s =
            std::chrono::duration<double>(now - std::max(r.pushed, *wired_)).count();
      } else {
        r.g.intervals_s.push_back(std::chrono::duration<double>(now - r.last).count());
      }
      r.last = now;
      r.g.tokens.push_back(t.token);
      ++generated_;
      first_ = std::min(first_, std::max(r.pushed, *wired_));
      last_ = now;
      // The model's end-of-text token ends the text, as in one process: the stages drop it.
      const bool at_end = codec_.ends(t.token);
      r.ended = at_end || static_cast<int64_t>(r.g.tokens.size()) == a_.tokens;
      lock.unlock();
      if (at_end && static_cast<int64_t>(r.g.tokens.size()) < a_.tokens) prompts_.cancel(t.id);
      if (token) token(t.id, t.token);
      if (r.ended && done) done(r.prompt, r.g);
    };
    run_->run(cb, &g_interrupt);
  }

  const runtime::JobRun& job() const { return *run_; }
  const hf::TextCodec& codec() const { return codec_; }
  // From the first prompt's start (given, and the stages wired) to the last token.
  double seconds() const {
    return generated_ > 0 ? std::chrono::duration<double>(last_ - first_).count() : 0.0;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Request {
    std::string prompt;
    Clock::time_point pushed, last{};
    Generation g;
    bool ended = false;  // every token came, or the end-of-text token
  };
  const GenerateArgs& a_;
  runtime::PromptQueue prompts_;
  std::unique_ptr<runtime::JobRun> run_;
  TextShape shape_;
  hf::TextCodec codec_;
  std::mutex mu_;
  std::deque<Request> requests_;  // by id (a deque: references stay put as it grows)
  std::optional<Clock::time_point> wired_;
  Clock::time_point first_ = Clock::time_point::max(), last_{};
  int64_t generated_ = 0;
};

void generateWithJob(const GenerateArgs& a) {
  const InterruptGuard interrupt_guard;
  auto job = std::make_shared<JobGeneration>(a);
  const size_t stages = job->job().stages().size();
  if (!a.serve) {
    const size_t prompt_tokens = job->push(a.prompt);
    job->close();
    Generation got;
    Streamer stream(a.prompt, job->codec());
    job->run([&](const std::string&, const Generation& g) { got = g; },
             [&](int64_t, int32_t t) { stream(t); });
    printSummary(prompt_tokens, got, " across " + std::to_string(stages) + " stages");
    return;
  }
  // Prompts are read on a thread of their own while the stages serve those before; each
  // answer is a JSON line as its last token comes (so not always in the order asked).
  auto out = std::make_shared<std::mutex>();
  auto print = [out](const std::string& line) {
    std::lock_guard lock(*out);
    std::puts(line.c_str());
    std::fflush(stdout);
  };
  std::thread reader([job, print] {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line.empty()) continue;
      try {
        job->push(line);
      } catch (const InvalidArgument& e) {  // this prompt only: the next may be fine
        print(errorLine(line, e.what()));
      }
    }
    job->close();
  });
  ServeTotals totals;
  try {
    job->run(
        [&](const std::string& prompt, const Generation& g) {
          print(answerLine(prompt, g, job->codec()));
          totals.add(g);
        },
        {});
  } catch (...) {
    reader.detach();  // (blocked on stdin; it holds what it uses)
    throw;
  }
  reader.join();
  totals.seconds = job->seconds();
  totals.print(" across " + std::to_string(stages) + " stages");
}

void runGenerate(const GenerateArgs& a) {
  TANDEM_CHECK_MSG(a.tokens > 0, InvalidArgument, "--tokens must be positive, got " << a.tokens);
  TANDEM_CHECK_MSG(a.serve || !a.prompt.empty(), InvalidArgument,
                   "give --prompt TEXT, or --serve to read prompts from stdin");
  if (isJobFile(a.file)) {
    TANDEM_CHECK_MSG(!a.no_cache, InvalidArgument,
                     "--no-cache is for a model file; a job's stages always keep their cache");
    TANDEM_CHECK_MSG(a.tensor == 1 && a.shares.empty(), InvalidArgument,
                     "--tensor and --shares are for a model file; a job splits a stage in its "
                     "partition: {layers: [b, e], tensor: N}");
    generateWithJob(a);
    return;
  }
  TANDEM_CHECK_MSG(
      a.cluster.empty() && a.key.empty() && a.weights.empty(), InvalidArgument,
      "--cluster, --key and --weights are for a job file (JOB.yaml), not '" << a.file << "'");
  TANDEM_CHECK_MSG(
      a.shares.empty() || static_cast<int>(a.shares.size()) == a.tensor, InvalidArgument,
      "--shares gives " << a.shares.size() << " shares for " << a.tensor << " tensor ranks");
  const ModelFile file = runtime::readModelOrOnnx(a.file);
  // One device, or (--tensor) the ranks' devices beside the whole model on the host.
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < a.tensor; ++r)
    backends.push_back(makeBackend(a.device, BackendOptions{a.threads}));
  std::unique_ptr<Backend> host = a.tensor > 1 ? makeBackend("cpu") : nullptr;
  auto model = loadModel(file, host ? *host : *backends[0]);
  const hf::TextCodec codec = hf::TextCodec::forModel(file, textShape(*model).vocab);
  std::vector<std::unique_ptr<Group>> groups;
  std::unique_ptr<TensorParallelGenerator> ranks;
  if (a.tensor > 1) {
    groups = transport::makeLocalGroup(a.tensor);
    std::vector<Backend*> be;
    std::vector<Group*> g;
    for (int r = 0; r < a.tensor; ++r) {
      be.push_back(backends[static_cast<size_t>(r)].get());
      g.push_back(groups[static_cast<size_t>(r)].get());
    }
    ranks = std::make_unique<TensorParallelGenerator>(*model, be, g, a.shares);
    spdlog::info("tensor split over {} ranks on {} (shares {:.3g}): {}", a.tensor, a.device,
                 fmt::join(ranks->shares(), " : "),
                 describe(Sequence(model->spec().layers), ranks->roles()));
  }
  auto run = [&](const std::vector<int32_t>& prompt, const std::function<void(int32_t)>& on) {
    const std::vector<int32_t>& ends = codec.endTokens();  // a Hugging Face model's end of text
    return ranks ? ranks->generate(prompt, a.tokens, a.sampling, !a.no_cache, on, ends)
                 : generate(*model, prompt, a.tokens, a.sampling, !a.no_cache, on, {}, ends);
  };
  const std::string how = std::string(a.no_cache ? " (no cache)" : "") +
                          (ranks ? " over " + std::to_string(a.tensor) + " tensor ranks" : "");
  if (!a.serve) {
    Streamer stream(a.prompt, codec);
    const std::vector<int32_t> prompt = codec.encode(a.prompt);
    const Generation g = run(prompt, [&](int32_t t) { stream(t); });
    printSummary(prompt.size(), g, how);
    return;
  }
  // One JSON object per prompt line: the text and its timing.
  std::string line;
  ServeTotals totals;
  std::optional<std::chrono::steady_clock::time_point> t0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::string out;
    if (!t0) t0 = std::chrono::steady_clock::now();
    try {
      const Generation g = run(codec.encode(line), {});
      out = answerLine(line, g, codec);
      totals.add(g);
      totals.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - *t0).count();
    } catch (const InvalidArgument& e) {  // this request only: the next may be fine
      out = errorLine(line, e.what());
    }
    std::puts(out.c_str());
    std::fflush(stdout);
  }
  totals.print(how);
}

}  // namespace

void addGenerate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand(
      "generate",
      "Generate text with a language model (byte tokens, key/value cache): a saved model "
      "here, or a job's stages on their nodes");
  c->add_option("model", a->file,
                "Model file (.tdm), ONNX model (.onnx) or Hugging Face folder of a language "
                "model, or a job file (.yaml) whose stages generate from its `weights` (else "
                "its `save`)")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--prompt", a->prompt, "Text to continue");
  c->add_option("--tokens", a->tokens, "New tokens (bytes) to generate");
  c->add_option("--temperature", a->sampling.temperature,
                "0: greedy (the default); above 0: sample, sharper below 1");
  c->add_option("--top-k", a->sampling.top_k, "Sample among the k most likely tokens only");
  c->add_option("--top-p", a->sampling.top_p,
                "Sample among the most likely tokens holding this share of the probability "
                "(in (0, 1]; 1: all)")
      ->check(CLI::Range(0.0f, 1.0f));
  c->add_option("--seed", a->sampling.seed, "Seed for sampling");
  c->add_option("--device", a->device, "Device to run on");
  c->add_option("--threads", a->threads, "CPU threads (of each tensor rank)")
      ->check(CLI::Range(1, 1024));
  c->add_option("--tensor", a->tensor,
                "A model file: tensor-parallel ranks (threads sharing memory, each on --device), "
                "attention split by heads and MLPs by hidden features")
      ->check(CLI::Range(1, 64));
  c->add_option("--shares", a->shares,
                "A model file with --tensor: comma-separated relative shares of the heads and "
                "hidden features per rank (default equal)")
      ->delimiter(',');
  c->add_flag("--serve", a->serve,
              "Read prompts from stdin, one per line; answer each with a line of JSON");
  c->add_flag("--no-cache", a->no_cache,
              "Recompute the whole prefix for every token (the cache's reference)");
  c->add_option("--cluster", a->cluster,
                "A job: run its stages on this cluster's node daemons (nodes with an `address`)");
  c->add_option("--key", a->key, "A job: the cluster key file (default: the cluster file's)");
  c->add_option("--weights", a->weights, "A job: generate from this model file's parameters")
      ->check(CLI::ExistingFile);
  c->add_option("--in-flight", a->in_flight, "A job: sequences its first stage keeps going at once")
      ->check(CLI::Range(1, 1024));
  c->callback([a] { runGenerate(*a); });
}

}  // namespace tandem::cli
