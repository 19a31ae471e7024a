#include "transport/socket_group.h"

#include "core/comm/collectives.h"
#include "core/error.h"
#include "transport/socket_mesh.h"
#include "transport/socket_pairs.h"

namespace tandem::transport {

std::unique_ptr<Pairs> makeSocketPairs(const SocketGroupOptions& o, const Exchange& exchange) {
  TANDEM_CHECK_MSG(o.size >= 1 && o.rank >= 0 && o.rank < o.size, InvalidArgument,
                   "group: rank " << o.rank << " of " << o.size);
  TANDEM_CHECK_MSG(o.transport == "tcp" || o.transport == "ipc", InvalidArgument,
                   "group: transport '" << o.transport << "' (expected tcp or ipc)");
  TANDEM_CHECK_MSG(o.connect_timeout.count() > 0, InvalidArgument,
                   "group: the connect timeout must be positive");
  TANDEM_CHECK_MSG(!o.spin || o.spin->count() >= 0, InvalidArgument,
                   "group: spin " << o.spin.value_or(std::chrono::microseconds(0)).count()
                                  << " us is negative");
  TANDEM_CHECK_MSG(o.socket_buffer_bytes >= 0, InvalidArgument,
                   "group: socket_buffer_bytes " << o.socket_buffer_bytes << " is negative");
  TANDEM_CHECK_MSG(o.codec != Codec::kI8, InvalidArgument,
                   "group: int8 chunks are not supported (fp32, fp16 or bf16)");
  return std::make_unique<SocketPairs>(o, connectMesh(o, exchange));
}

std::unique_ptr<Group> makeSocketGroup(const SocketGroupOptions& options,
                                       const Exchange& exchange) {
  return makePairGroup(makeSocketPairs(options, exchange));
}

SocketGroupChoices socketGroupChoices(const Pairs& pairs) {
  const auto* p = dynamic_cast<const SocketPairs*>(&pairs);
  TANDEM_CHECK_MSG(p != nullptr, InvalidArgument, "socketGroupChoices: not a socket group");
  return p->choices();
}

SocketGroupChoices socketGroupChoices(const Group& group) {
  const Pairs* pairs = pairsOf(group);
  TANDEM_CHECK_MSG(pairs != nullptr, InvalidArgument, "socketGroupChoices: not a socket group");
  return socketGroupChoices(*pairs);
}

}  // namespace tandem::transport
