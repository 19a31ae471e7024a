// tandem serve: the OpenAI-compatible HTTP API (serve/) over a language model in this
// process, or over a job's stages on their nodes' daemons. Listening beyond loopback asks for API
// keys (--api-key-file) unless
// --insecure-no-auth says otherwise; SIGINT/SIGTERM stop it.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backends/registry.h"
#include "core/endpoint.h"
#include "core/error.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/pipeline/stage_decoder.h"
#include "hf/text_codec.h"
#include "runtime/daemon/daemon.h"
#include "runtime/job/job.h"
#include "runtime/job/job_run.h"
#include "runtime/job/model_source.h"
#include "serve/api.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/interrupt.h"

namespace tandem::cli {
namespace {

struct ServeArgs {
  std::string file, listen = "127.0.0.1:8080", key_file, name, device = "cpu";
  bool insecure_no_auth = false;
  int threads = 1, in_flight = 8, max_queue = 32;
  size_t max_body = 1 << 20;
  double request_timeout_s = 30, deadline_s = 0;
  std::string cluster, key, weights;  // a job file's
};

using std::chrono::milliseconds;

// What is served: the pipeline the engine runs, the model's shape and its file's time.
struct Served {
  serve::PipelineServe pipeline;
  TextShape shape;
  hf::TextCodec codec;  // the model's tokenizer, or bytes
  int64_t created = 0;
  // What each stage reports of its work, for /metrics (set before the pipeline runs).
  std::unique_ptr<serve::StageLoads> loads = std::make_unique<serve::StageLoads>();
  // A model in this process:
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  // A job's stages:
  std::unique_ptr<runtime::PromptQueue> prompts;
  std::unique_ptr<runtime::JobRun> run;
};

// The whole model as one stage in this process: its sequences in flight decode as one
// batch.
void modelPipeline(const ServeArgs& a, Served& s) {
  const ModelFile file = runtime::readModelOrOnnx(a.file);
  s.backend = makeBackend(a.device, BackendOptions{a.threads});
  s.model = loadModel(file, *s.backend);
  s.shape = textShape(*s.model);
  s.codec = hf::TextCodec::forModel(file, s.shape.vocab);
  Model& m = *s.model;
  const int in_flight = a.in_flight;
  serve::StageLoads& loads = *s.loads;
  s.pipeline = [&m, &loads, in_flight](const RequestSource& source, const TokenSink& sink,
                                       const CancelCheck& cancelled) {
    DecoderOptions o;
    o.max_in_flight = in_flight;
    o.report = [&loads](const DecoderStats& st) { loads.report(0, st.busy_s, st.elapsed_s); };
    StageDecoder stage(m, StageRange{0, 1, 0, m.size()}, nullptr, nullptr, nullptr, o);
    stage.serve(source, sink, cancelled);
  };
}

// A job's stages on their nodes' daemons (as `tandem generate JOB.yaml` runs them):
// requests go to the run's stage 0 as they come, its tokens to the sink. A sequence
// whose client has gone is cancelled on the stages as its next token comes (the run's
// stage 0 ends it and every stage frees its caches); the tokens still on their way are
// dropped here.
void jobPipeline(const ServeArgs& a, Served& s) {
  runtime::JobSpec job = runtime::loadJobSpec(a.file);
  if (!a.weights.empty()) {
    job.weights = a.weights;
  } else if (job.weights.empty() && !runtime::bringsWeights(job.model)) {
    TANDEM_CHECK_MSG(!job.save.empty() && std::filesystem::exists(job.save), InvalidArgument,
                     job.source << " names no trained weights to serve: give it 'weights:' "
                                << "(or train it with 'save:' first), or --weights");
    job.weights = job.save;
  }
  struct stat st {};
  if (::stat(job.weights.c_str(), &st) == 0) s.created = static_cast<int64_t>(st.st_mtime);
  s.prompts = std::make_unique<runtime::PromptQueue>();
  runtime::JobRunOptions jo;
  jo.cluster = a.cluster;
  jo.key = a.key;
  jo.tandemd = tandemdProgram();
  jo.mode = runtime::RunMode::kGenerate;
  jo.prompts = s.prompts.get();
  jo.in_flight = a.in_flight;
  s.run = std::make_unique<runtime::JobRun>(std::move(job), jo);  // checked and placed here
  s.shape = textShape(Model(parseModelSpec(s.run->modelSpec(), s.run->job().model)));
  s.codec = runtime::textCodecOf(s.run->job().model, s.run->job().weights, s.shape.vocab);
  runtime::JobRun& run = *s.run;
  runtime::PromptQueue& prompts = *s.prompts;
  serve::StageLoads& loads = *s.loads;
  s.pipeline = [&run, &prompts, &loads](const RequestSource& source, const TokenSink& sink,
                                        const CancelCheck& cancelled) {
    std::mutex mu;
    std::map<int64_t, int64_t> counts;  // new tokens, by request id
    std::atomic<bool> stop{false};
    std::thread feeder([&] {
      while (!stop) {
        RequestPoll p = source(milliseconds(100));
        if (p.request) {
          const GenerationRequest& r = *p.request;
          {
            std::lock_guard lock(mu);
            counts[r.id] = r.count;
          }
          prompts.push({r.id, r.prompt, r.count, r.sampling.temperature, r.sampling.top_k,
                        r.sampling.seed, r.sampling.top_p});
        } else if (p.ended) {
          break;
        }
      }
      prompts.close();
    });
    static const std::vector<float> kNoLogits;
    runtime::RunCallbacks cb;
    cb.stage_busy = [&loads](int stage, const runtime::StageBusy& b) {
      loads.report(stage, b.busy_s, b.elapsed_s);
    };
    cb.token = [&](const runtime::Token& t) {
      int64_t count = 0;
      {
        std::lock_guard lock(mu);
        const auto it = counts.find(t.id);
        if (it == counts.end()) return;  // cancelled: a token that was on its way
        count = it->second;
        if (t.index + 1 == count) counts.erase(it);
      }
      if (t.index > 0 && cancelled(t.id)) {
        if (t.index + 1 == count) return;  // its last: nothing to cancel
        {
          std::lock_guard lock(mu);
          counts.erase(t.id);
        }
        prompts.cancel(t.id);
        return;
      }
      sink(ChosenToken{t.id, t.index, count, t.token, kNoLogits});
    };
    try {
      run.run(cb, &g_interrupt);
    } catch (...) {
      stop = true;
      feeder.join();
      throw;
    }
    stop = true;
    feeder.join();
  };
}

void runServe(const ServeArgs& a) {
  const std::string ext = std::filesystem::path(a.file).extension().string();
  const bool job = ext == ".yaml" || ext == ".yml";
  TANDEM_CHECK_MSG(
      job || (a.cluster.empty() && a.key.empty() && a.weights.empty()), InvalidArgument,
      "--cluster, --key and --weights are for a job file (JOB.yaml), not '" << a.file << "'");
  const Endpoint at = parseEndpoint(a.listen, true);
  std::vector<std::string> keys;
  if (!a.key_file.empty()) keys = serve::readApiKeys(a.key_file);
  TANDEM_CHECK_MSG(
      !keys.empty() || a.insecure_no_auth || runtime::isLoopbackHost(at.host), InvalidArgument,
      "--listen " << a.listen
                  << " is not loopback: give --api-key-file (a key per line, mode 600), "
                  << "or --insecure-no-auth to serve anyone who can reach it");
  const InterruptGuard interrupt_guard;
  Served served;
  if (job) {
    jobPipeline(a, served);
  } else {
    modelPipeline(a, served);
    struct stat st {};
    if (::stat(a.file.c_str(), &st) == 0) served.created = static_cast<int64_t>(st.st_mtime);
  }
  serve::ApiOptions options;
  options.model = {a.name.empty() ? served.shape.model : a.name, served.shape.context};
  options.vocab = served.shape.vocab;
  options.codec = served.codec;
  options.keys = keys;
  options.created = served.created;
  options.stages = served.loads.get();
  auto engine = std::make_unique<serve::Engine>(
      served.pipeline,
      serve::EngineOptions{a.in_flight, a.max_queue,
                           milliseconds(static_cast<int64_t>(a.deadline_s * 1e3))});
  serve::Api api(*engine, options);
  serve::HttpLimits limits;
  limits.max_body = a.max_body;
  limits.request_timeout = milliseconds(static_cast<int64_t>(a.request_timeout_s * 1e3));
  serve::HttpServer server(
      at.host, at.port, limits,
      [&api](serve::Request& req, serve::Connection& c) { return api.handle(req, c); });
  std::thread watcher([&server] {
    while (g_interrupt.load() == 0) std::this_thread::sleep_for(milliseconds(100));
    server.stop();
  });
  // The address a client uses (and tests read): after the port is bound.
  std::printf("serving '%s' (context %lld tokens%s) on http://%s:%u/v1 (%s)\n",
              options.model.name.c_str(), static_cast<long long>(served.shape.context),
              job ? (", " + std::to_string(served.run->stages().size()) + " stages").c_str() : "",
              at.host.c_str(), server.port(), keys.empty() ? "no API key asked" : "API keys asked");
  std::fflush(stdout);
  server.run();
  engine.reset();  // every sequence ends while the server's I/O context still exists
  watcher.join();
  spdlog::info("stopped");
}

}  // namespace

void addServe(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* c = app.add_subcommand(
      "serve",
      "Serve a language model over HTTP: the OpenAI completions and chat API, streaming, "
      "API keys, limits, metrics");
  c->add_option("model", a->file,
                "Model file (.tdm), ONNX model (.onnx) or Hugging Face folder of a language "
                "model, or a job file (.yaml) whose stages serve its `weights` (else its `save`)")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--listen", a->listen, "HOST:PORT to listen on (port 0: any free one)");
  c->add_option("--api-key-file", a->key_file,
                "Accepted API keys, one per line (mode 600); asked as 'Authorization: Bearer'")
      ->check(CLI::ExistingFile);
  c->add_flag("--insecure-no-auth", a->insecure_no_auth,
              "Listen beyond loopback without API keys (anyone who reaches it may use it)");
  c->add_option("--name", a->name, "The model's name in the API (default: the model's own)");
  c->add_option("--in-flight", a->in_flight, "Sequences decoding at once")
      ->check(CLI::Range(1, 1024));
  c->add_option("--max-queue", a->max_queue,
                "Requests waiting beyond those in flight; more are answered 429")
      ->check(CLI::Range(0, 65536));
  c->add_option("--max-body", a->max_body, "Largest request body, bytes (413 beyond)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 30));
  c->add_option("--request-timeout", a->request_timeout_s,
                "Seconds a client may take to send a whole request (408 beyond)")
      ->check(CLI::Range(0.1, 3600.0));
  c->add_option("--deadline", a->deadline_s,
                "Seconds a request may take from its arrival to its last token; past it the "
                "answer ends there, finish_reason 'length' (0: none)")
      ->check(CLI::Range(0.0, 86400.0));
  c->add_option("--device", a->device, "Device to run on");
  c->add_option("--threads", a->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->add_option("--cluster", a->cluster,
                "A job: run its stages on this cluster's node daemons (nodes with an `address`)");
  c->add_option("--key", a->key, "A job: the cluster key file (default: the cluster file's)");
  c->add_option("--weights", a->weights, "A job: serve this model file's parameters")
      ->check(CLI::ExistingFile);
  c->callback([a] { runServe(*a); });
}

}  // namespace tandem::cli
