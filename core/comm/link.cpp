#include "core/comm/link.h"

#include <utility>

#include "core/error.h"

namespace tandem {

ReplicaLinks::ReplicaLinks(std::vector<Link*> links) : links_(std::move(links)) {
  TANDEM_CHECK_MSG(!links_.empty(), InvalidArgument, "replica links: no link");
  for (const Link* l : links_) {
    TANDEM_CHECK_MSG(l != nullptr, InvalidArgument, "replica links: a null link");
    if (!peers_.empty()) peers_ += ", ";
    peers_ += l->peer();
  }
}

}  // namespace tandem
