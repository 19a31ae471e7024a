// tandem stage: one stage worker process, started by `tandem run` (the runtime's process
// launcher). It reads the run's key from its standard input, connects back to the
// coordinator, says which worker it is, and runs the assignment it is given
// (targets/runtime/stage_worker.h). Any error is reported to the coordinator before the
// process exits 1.
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <iostream>
#include <iterator>
#include <memory>

#include "core/error.h"
#include "targets/runtime/handshake.h"
#include "targets/runtime/node_info.h"
#include "targets/runtime/stage_worker.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

namespace {

struct StageArgs {
  std::string control;
  int slot = 0;
};

void runStage(const StageArgs& a) {
  // Dies with `tandem run`: no stage outlives the run that started it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string line;
  std::getline(std::cin, line);
  const runtime::ClusterKey key = runtime::parseClusterKey(line, "the key on standard input");
  runtime::HandshakeOptions o;
  o.build = runtime::buildName();
  std::unique_ptr<runtime::Channel> c = runtime::connectChannel(parseEndpoint(a.control), key, o);
  c->send(runtime::WorkerHello{a.slot, static_cast<int64_t>(getpid())});
  runtime::runStageWorker(*c);
  c->close();
}

}  // namespace

void addStage(CLI::App& app) {
  auto a = std::make_shared<StageArgs>();
  CLI::App* c = app.add_subcommand("stage", "Run one pipeline stage (started by `tandem run`)");
  c->group("");  // internal: not listed in --help
  c->add_option("--control", a->control, "The coordinator's HOST:PORT")->required();
  c->add_option("--slot", a->slot, "Which of the coordinator's workers this is")->required();
  c->callback([a] { runStage(*a); });
}

}  // namespace tandem::cli
