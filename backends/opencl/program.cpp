#include "backends/opencl/program.h"

#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

namespace tandem::opencl {

std::string_view embeddedSource(std::string_view name) {
  std::string known;
  for (const KernelSource& s : embeddedSources()) {
    if (s.name == name) return s.text;
    known.append(known.empty() ? "" : ", ").append(s.name);
  }
  std::ostringstream os;
  os << "no embedded OpenCL source '" << name << "' (there are: " << known << ")";
  throw InvalidArgument(os.str());
}

std::string programSource(std::string_view name) {
  return std::string(embeddedSource("common")).append("\n").append(embeddedSource(name));
}

ProgramCache::ProgramCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

std::filesystem::path ProgramCache::defaultDir() {
  if (const char* d = std::getenv("TANDEM_CACHE_DIR"); d && *d)
    return std::filesystem::path(d) / "opencl";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return std::filesystem::path(d) / "tandem" / "opencl";
  if (const char* d = std::getenv("HOME"); d && *d)
    return std::filesystem::path(d) / ".cache" / "tandem" / "opencl";
  return {};
}

namespace {

std::string cacheKey(const ClDevice& d, std::string_view name, std::string_view source,
                     const std::string& options) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add = [&](std::string_view s) {
    const uint64_t n = s.size();  // lengths keep ("ab","c") apart from ("a","bc")
    XXH3_64bits_update(st, &n, sizeof n);
    XXH3_64bits_update(st, s.data(), s.size());
  };
  for (std::string_view part :
       {std::string_view("tandem-opencl-cache-1"), std::string_view(d.platform_name),
        std::string_view(d.name), std::string_view(d.vendor), std::string_view(d.version),
        std::string_view(d.driver), std::string_view(options), source})
    add(part);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(name).append("-").append(hex).append(".bin");
}

std::vector<unsigned char> readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Best effort: a cache that cannot be written costs the next start a compile, nothing
// else. Written under a temporary name and renamed, so readers never see half a file.
void writeFile(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return;
  const std::filesystem::path tmp = path.string() + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

// Builds `program`; on a compile error, DeviceError with the build log.
void buildOrExplain(cl::Program& program, const ClDevice& device, std::string_view name,
                    const std::string& options) {
  try {
    program.build({device.device}, options.c_str());
  } catch (const cl::Error& e) {
    std::string log;
    try {
      log = program.getBuildInfo<CL_PROGRAM_BUILD_LOG>(device.device);
    } catch (const cl::Error&) {
      log = "(the driver gave no build log)";
    }
    std::ostringstream os;
    os << "building OpenCL program '" << name << "' for " << device.label() << " (" << device.name
       << ") failed: " << errorName(e.err()) << "; build log:\n"
       << log;
    throw DeviceError(os.str());
  }
}

}  // namespace

cl::Program ProgramCache::build(const cl::Context& context, const ClDevice& device,
                                std::string_view name, std::string_view source,
                                const std::string& options, BuildReport* report) const {
  const auto t0 = std::chrono::steady_clock::now();
  BuildReport r;
  if (!dir_.empty()) r.cache_file = dir_ / cacheKey(device, name, source, options);
  cl::Program program;
  if (!r.cache_file.empty()) {
    std::vector<unsigned char> binary = readFile(r.cache_file);
    if (!binary.empty()) {
      try {
        program = cl::Program(context, {device.device}, cl::Program::Binaries{binary});
        program.build({device.device}, options.c_str());
        r.from_cache = true;
      } catch (const cl::Error&) {
        program = cl::Program();  // stale or corrupt: compile from source below
      }
    }
  }
  if (!r.from_cache) {
    program = clCall("creating an OpenCL program",
                     [&] { return cl::Program(context, std::string(source)); });
    buildOrExplain(program, device, name, options);
    if (!r.cache_file.empty()) {
      const auto binaries = clCall("reading a program binary",
                                   [&] { return program.getInfo<CL_PROGRAM_BINARIES>(); });
      if (binaries.size() == 1 && !binaries[0].empty()) writeFile(r.cache_file, binaries[0]);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (report) *report = std::move(r);
  return program;
}

}  // namespace tandem::opencl
