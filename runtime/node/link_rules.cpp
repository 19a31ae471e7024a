#include "runtime/node/link_rules.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <boost/asio/ip/address.hpp>

#include "core/error.h"

namespace tandem::runtime {

void checkBindHost(const std::string& host) {
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']')
    bare = bare.substr(1, bare.size() - 2);
  boost::system::error_code ec;
  const boost::asio::ip::address a = boost::asio::ip::make_address(bare, ec);
  // inet_aton also reads the short forms ("0", "0.0") that name 0.0.0.0 to the resolver.
  in_addr v4{};
  const bool any = (!ec && a.is_unspecified()) ||
                   (inet_aton(bare.c_str(), &v4) != 0 && v4.s_addr == htonl(INADDR_ANY));
  TANDEM_CHECK_MSG(!any && !bare.empty(), InvalidArgument,
                   "links bind to one address of the node, not '"
                       << host
                       << "' (every interface): give the node's address (a cluster "
                          "file's 'host')");
}

namespace {

// Socket paths are at most 107 bytes (sockaddr_un); a folder leaves room for the names.
constexpr size_t kMaxSocketDirBytes = 80;

// Whether `dir` is a worker's socket folder: tandem-*, a directory (not a link) owned by
// this user with mode 0700.
bool isSocketDir(const std::string& dir) {
  const std::string base = std::filesystem::path(dir).filename().string();
  struct stat st {};
  return dir.size() <= kMaxSocketDirBytes && dir.front() == '/' && base.rfind("tandem-", 0) == 0 &&
         ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
         (st.st_mode & 0777) == 0700;
}

}  // namespace

void checkPeerEndpoint(const std::string& endpoint, const std::string& transport) {
  if (transport == "ipc") {
    const std::string prefix = "ipc://";
    const size_t slash = endpoint.rfind('/');
    const bool ok = endpoint.rfind(prefix, 0) == 0 && slash != std::string::npos &&
                    slash > prefix.size() && slash + 1 < endpoint.size() &&
                    endpoint.find("/..", prefix.size()) == std::string::npos &&
                    isSocketDir(endpoint.substr(prefix.size(), slash - prefix.size()));
    TANDEM_CHECK_MSG(ok, InvalidArgument,
                     "an ipc link connects only to sockets in a worker's own folder "
                     "(ipc://.../tandem-XXXXXX/NAME, mode 0700, this user's), not '"
                         << endpoint << "'");
    return;
  }
  const std::string prefix = "tcp://";
  TANDEM_CHECK_MSG(endpoint.rfind(prefix, 0) == 0 && endpoint.size() > prefix.size(),
                   InvalidArgument,
                   "a " << transport << " link connects to '" << prefix
                        << "...' endpoints only, not '" << endpoint << "'");
}

PrivateSocketDir::PrivateSocketDir() {
  std::string base = "/tmp";
  if (const char* run = std::getenv("XDG_RUNTIME_DIR");
      run && run[0] == '/' && std::strlen(run) + 16 <= kMaxSocketDirBytes)
    base = run;
  for (const std::string& under : {base, std::string("/tmp")}) {
    std::string templ = under + "/tandem-XXXXXX";
    if (::mkdtemp(templ.data())) {
      path_ = templ;
      return;
    }
  }
  throw IoError(std::string("cannot make a folder for the worker's sockets under /tmp: ") +
                std::strerror(errno));
}

PrivateSocketDir::~PrivateSocketDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace tandem::runtime
