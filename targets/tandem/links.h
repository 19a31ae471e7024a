// Link measurement between the nodes of a cluster (`tandem profile --links`), with the
// real transport: each node's tandemd opens links where that node's stages would (its
// `host`) and, told over the control protocol (`link task`, docs/runtime.md), measures
// against another node (core/profile/link_probe.h) over a ZmqLink. A node with an
// `address` is asked through its daemon; a node without one on this machine gets a
// tandemd on loopback started for the survey.
#pragma once

#include <chrono>
#include <string>

#include "core/profile/link_probe.h"
#include "core/profile/profile.h"
#include "partitioner/cluster.h"

namespace tandem::cli {

struct LinkSurveyOptions {
  LinkProbeOptions probe;
  std::string key;                   // the cluster key file (default: the cluster file's)
  std::chrono::seconds timeout{30};  // for each node's answer
};

// Every ordered pair of distinct nodes, and within each node (two links of one daemon),
// measured one after another. Error naming the node that failed or did not answer.
LinkSet surveyLinks(const partitioner::Cluster& cluster, const LinkSurveyOptions& options);

// The matrix as a table: bandwidth and latency per ordered pair of nodes.
void printLinks(const LinkSet& links);

}  // namespace tandem::cli
