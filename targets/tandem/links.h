// Link measurement between the nodes of a cluster (`tandem profile --links`), with the
// real transport: one `tandem link-agent` process per node binds where that node's
// stages would (its `host`) and, told by the coordinator over the control channel,
// measures against another agent (core/profile/link_probe.h) over a ZmqLink. Agents of
// nodes on this machine are started here; for another host the coordinator prints the
// command to start there and waits for it.
//
//   agent -> coordinator:  hello {node, control}   opened {node, pair, endpoint}
//                          measured {node, pair, bandwidth, latency_s, round_trip}
//                          served {node, pair}     error {node, message}
//   coordinator -> agent:  open {pair}   serve {pair, peer}   measure {pair, peer, probe}
//                          local {pair, probe}   quit
#pragma once

#include <chrono>
#include <string>

#include "core/profile/link_probe.h"
#include "core/profile/profile.h"
#include "partitioner/cluster.h"

namespace tandem::cli {

struct LinkSurveyOptions {
  LinkProbeOptions probe;
  std::string listen = "tcp://127.0.0.1:*";  // the coordinator's control endpoint
  std::chrono::seconds timeout{30};          // for each agent's answer and each link call
};

// Every ordered pair of distinct nodes, and within each node (two links of one agent),
// measured one after another. Error naming the node that failed or did not answer.
LinkSet surveyLinks(const partitioner::Cluster& cluster, const LinkSurveyOptions& options);

// The matrix as a table: bandwidth and latency per ordered pair of nodes.
void printLinks(const LinkSet& links);

}  // namespace tandem::cli
