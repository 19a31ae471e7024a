// tandem keygen: a cluster key (--cluster: what every daemon and coordinator of a cluster
// shares, runtime/control/cluster_key.h), or a CurveZMQ key pair for encrypted links.
#include <cstdio>
#include <memory>
#include <span>

#include "core/error.h"
#include "runtime/control/cluster_key.h"
#include "runtime/control/files.h"
#include "targets/tandem/commands.h"
#include "transport/zmq_link.h"

namespace tandem::cli {

void addKeygen(CLI::App& app) {
  auto prefix = std::make_shared<std::string>();
  auto cluster = std::make_shared<bool>(false);
  CLI::App* c = app.add_subcommand(
      "keygen",
      "Make a cluster key (--cluster: PREFIX.key) or a CurveZMQ key pair (PREFIX.key, "
      "PREFIX.pub)");
  c->add_option("--out", *prefix, "Path prefix of the key file(s)")->required();
  c->add_flag("--cluster", *cluster,
              "A cluster key: every daemon and coordinator of the cluster is given this file");
  c->callback([prefix, cluster] {
    if (*cluster) {
      const std::string path = *prefix + ".key";
      runtime::writeClusterKey(runtime::generateClusterKey(), path);
      std::printf(
          "wrote %s (cluster key, mode 0600): give it to every node's tandemd (--key) "
          "and name it in the cluster file (key: %s)\n",
          path.c_str(), path.c_str());
      return;
    }
    const transport::CurveKeyPair keys = transport::generateCurveKeyPair();
    const std::string secret = *prefix + ".key", pub = *prefix + ".pub";
    const auto bytes = [](const std::string& text) {
      return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    };
    // The secret is the owner's alone whatever the umask (its mode set and checked).
    const std::string secret_text = keys.secret_key + "\n", public_text = keys.public_key + "\n";
    runtime::writeFileAtomically(secret, bytes(secret_text), 0600,
                                 runtime::FileReaders::kOwnerOnly);
    runtime::writeFileAtomically(pub, bytes(public_text), 0644);
    std::printf("wrote %s (secret, mode 0600) and %s (public)\n", secret.c_str(), pub.c_str());
  });
}

}  // namespace tandem::cli
