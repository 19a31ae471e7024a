// tandem keygen: a cluster key (--cluster: what every daemon and coordinator of a cluster
// shares, targets/runtime/cluster_key.h), or a CurveZMQ key pair for encrypted links.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "targets/runtime/cluster_key.h"
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
    {
      std::ofstream out(secret, std::ios::trunc);
      if (!out) throw IoError("cannot write '" + secret + "'");
      out << keys.secret_key << "\n";
    }
    chmod(secret.c_str(), 0600);  // the secret stays the owner's
    std::ofstream out(pub, std::ios::trunc);
    if (!out) throw IoError("cannot write '" + pub + "'");
    out << keys.public_key << "\n";
    std::printf("wrote %s (secret, mode 0600) and %s (public)\n", secret.c_str(), pub.c_str());
  });
}

}  // namespace tandem::cli
