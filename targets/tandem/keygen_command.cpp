// tandem keygen: a CurveZMQ key pair for encrypted, authenticated links.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "targets/tandem/commands.h"
#include "transport/zmq_link.h"

namespace tandem::cli {

void addKeygen(CLI::App& app) {
  auto prefix = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("keygen", "Make a CurveZMQ key pair (PREFIX.key, PREFIX.pub)");
  c->add_option("--out", *prefix, "Path prefix of the two key files")->required();
  c->callback([prefix] {
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
