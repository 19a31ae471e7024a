// tandem inspect: per-layer shapes and costs of a model spec or model file;
// tandem devices: the devices this build can use.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "runtime/job/model_source.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

namespace {

bool isModelFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  in.read(head, 8);
  return in.gcount() == 8 && std::string(head + 4, 4) == "TDM1";
}

std::string human(double v) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s" : "%.0f%s", v, units[u]);
  return buf;
}

void printTable(const Model& m, int64_t batch) {
  std::printf("model '%s': input %s, output %s, batch %lld\n", m.name().c_str(),
              m.inputShape().str().c_str(), m.outputShape().str().c_str(),
              static_cast<long long>(batch));
  std::printf("%5s  %-14s %-16s %12s %12s %12s %12s\n", "layer", "type", "output", "params",
              "FLOPs", "out bytes", "stash bytes");
  int64_t params = 0, flops = 0, stash = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    const Layer& l = m.layer(i);
    params += l.paramCount();
    flops += l.flops() * batch;
    stash += l.stashBytes() * batch;
    std::printf("%5zu  %-14s %-16s %12s %12s %12s %12s\n", i, l.type().c_str(),
                l.outputShape().str().c_str(), human(static_cast<double>(l.paramCount())).c_str(),
                human(static_cast<double>(l.flops() * batch)).c_str(),
                human(static_cast<double>(l.outputBytes() * batch)).c_str(),
                human(static_cast<double>(l.stashBytes() * batch)).c_str());
  }
  std::printf("%5s  %-14s %-16s %12s %12s %12s %12s\n", "total", "", "",
              human(static_cast<double>(params)).c_str(), human(static_cast<double>(flops)).c_str(),
              "", human(static_cast<double>(stash)).c_str());
  const int64_t bytes = m.paramBytes();
  // (Bytes other than 4 a parameter: int8 weights with their scales, or batch norms'
  // running statistics, which are held but not trained.)
  std::printf("parameters: %lld (%s bytes%s); forward FLOPs per sample: %lld\n",
              static_cast<long long>(params), human(static_cast<double>(bytes)).c_str(),
              bytes == params * 4 ? " f32" : " on the device",
              static_cast<long long>(batch ? flops / batch : 0));
}

}  // namespace

void addInspect(CLI::App& app) {
  struct Args {
    std::string path;
    int64_t batch = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("inspect", "Show a model's layers, shapes and costs");
  c->add_option("model", a->path, "Model spec (.yaml), model file (.tdm) or ONNX model (.onnx)")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--batch", a->batch, "Scale FLOPs and activation bytes to this batch")
      ->check(positiveNumber());
  c->callback([a] {
    if (isModelFile(a->path)) {
      const ModelFile f = readModelFile(a->path);
      printTable(Model(f.spec), a->batch);
      if (f.optimizer)
        std::printf("optimizer: %s after %lld steps\n", f.optimizer->options.kind.c_str(),
                    static_cast<long long>(f.optimizer->steps));
    } else {
      printTable(Model(runtime::readModelSource(a->path).spec), a->batch);
    }
  });
}

void addDevices(CLI::App& app) {
  CLI::App* c = app.add_subcommand("devices", "List the devices this build can use");
  c->callback([] {
    std::printf("%-9s %-6s %5s %9s %9s %-4s  %-27s %-28s %s\n", "device", "kind", "units", "memory",
                "max alloc", "fp16", "platform", "name", "vendor");
    auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
    for (const DeviceInfo& d : listDevices()) {
      std::printf("%-9s %-6s %5d %7.1f G %7.1f G %-4s  %-27s %-28s %s\n", d.name.c_str(),
                  d.kind.c_str(), d.compute_units, gib(d.memory_bytes), gib(d.max_allocation_bytes),
                  d.fp16 ? "yes" : "no", d.platform.c_str(), d.model.c_str(),
                  d.vendor.empty() ? "-" : d.vendor.c_str());
    }
    if (opencl::listClDevices().empty())
      std::printf("(no OpenCL devices: %s)\n", opencl::noDevicesReason().c_str());
  });
}

}  // namespace tandem::cli
