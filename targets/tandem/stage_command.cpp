// tandem stage: one stage worker process, started by `tandem run` (the runtime's process
// launcher). It reads the run's key from its standard input, connects back to the
// coordinator, says which worker it is, and runs the assignment it is given
// (runtime/worker/stage_worker.h). Any error is reported to the coordinator before the
// process exits 1.
#include <memory>

#include "runtime/worker/stage_worker.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

namespace {

struct StageArgs {
  std::string control;
  int slot = 0;
};

}  // namespace

void addStage(CLI::App& app) {
  auto a = std::make_shared<StageArgs>();
  CLI::App* c = app.add_subcommand("stage", "Run one pipeline stage (started by `tandem run`)");
  c->group("");  // internal: not listed in --help
  c->add_option("--control", a->control, "The coordinator's HOST:PORT")->required();
  c->add_option("--slot", a->slot, "Which of the coordinator's workers this is")->required();
  c->callback([a] { runtime::runWorkerProcess(a->control, a->slot); });
}

}  // namespace tandem::cli
