// tandem schedule: print a pipeline schedule's action lists and its timeline diagram.
#include <cstdio>
#include <memory>

#include "core/pipeline/schedule.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

void addSchedule(CLI::App& app) {
  struct Args {
    std::string kind = "1f1b";
    int stages = 4;
    int64_t microbatches = 8;
    int chunks = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "schedule", "Print a pipeline schedule: each stage's actions and a timeline diagram");
  c->add_option("--kind", a->kind, "gpipe, 1f1b, zb-h1, interleaved or forward")
      ->capture_default_str();
  c->add_option("-p,--stages", a->stages, "Pipeline stages")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  c->add_option("-m,--microbatches", a->microbatches, "Microbatches per step")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  c->add_option("-v,--chunks", a->chunks, "Model chunks per stage (interleaved)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  c->callback([a] {
    const std::string text =
        renderSchedule(parseSchedule(a->kind), a->stages, a->microbatches, a->chunks);
    std::fputs(text.c_str(), stdout);
  });
}

}  // namespace tandem::cli
