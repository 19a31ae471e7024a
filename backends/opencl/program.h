// OpenCL programs: our kernel sources, embedded in the binary at build time
// (kernels/*.cl), built once per device and context, with an on-disk cache of program
// binaries so a second start on the same device does not compile again.
//
// Cache key: a hash of the platform, device, vendor, device and driver versions, the
// build options and the source, so a driver update or an edited kernel misses. A
// cache file that the driver rejects is rebuilt from source and replaced.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "backends/opencl/devices.h"

namespace tandem::opencl {

struct KernelSource {
  std::string_view name;  // the .cl file's name without extension
  std::string_view text;
};

// Every kernels/*.cl file, by name.
std::span<const KernelSource> embeddedSources();
// The embedded source called `name`; InvalidArgument naming the ones there are.
std::string_view embeddedSource(std::string_view name);
// What a program of kernel file `name` compiles: common.cl (shared types and pragmas),
// then the file.
std::string programSource(std::string_view name);

struct BuildReport {
  bool from_cache = false;
  double seconds = 0;                // creating and building the program
  std::filesystem::path cache_file;  // empty when the disk cache is off
};

class ProgramCache {
 public:
  // `dir` empty: no disk cache (every build compiles).
  explicit ProgramCache(std::filesystem::path dir = defaultDir());

  // $TANDEM_CACHE_DIR/opencl, else $XDG_CACHE_HOME/tandem/opencl, else
  // $HOME/.cache/tandem/opencl; empty (no cache) when none is set.
  static std::filesystem::path defaultDir();
  const std::filesystem::path& dir() const { return dir_; }

  // Builds `source` for `device` in `context`. A compile error raises DeviceError with
  // the program's name, the device and the compiler's build log.
  cl::Program build(const cl::Context& context, const ClDevice& device, std::string_view name,
                    std::string_view source, const std::string& options = "",
                    BuildReport* report = nullptr) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace tandem::opencl
