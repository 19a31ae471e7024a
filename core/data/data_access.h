// Which files a job's data may be read from. A node's daemon sets this for its workers:
// the data a job names (`data: text:PATH`, `data_dir`) comes from the coordinator, a
// network peer, and the node decides what it reads (docs/runtime.md, Security).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

inline constexpr int64_t kDefaultMaxDataFileBytes = int64_t{1} << 30;

struct DataAccess {
  // Folders whose files may be read, at any depth, judged on the path with every symbolic
  // link resolved ("/" admits any); empty: any file this process may open. A folder that
  // does not exist admits nothing.
  std::vector<std::string> roots;
  int64_t max_file_bytes = kDefaultMaxDataFileBytes;  // each file read, and a folder's sum
};

// The canonical path of `path` if `access` lets it be read: a regular file (not a device,
// FIFO or folder) under a root, of at most max_file_bytes. With roots, every refusal is
// one InvalidArgument naming the rule and the path as given — never whether the file
// exists, its kind or its size; without, IoError for a file that is not there and
// InvalidArgument naming what is wrong otherwise. `what` names it ("text data").
std::string checkDataFile(const DataAccess& access, const std::string& path, std::string_view what);
// The canonical path of folder `path` if it lies under a root (any folder without roots);
// refused like checkDataFile.
std::string checkDataFolder(const DataAccess& access, const std::string& path,
                            std::string_view what);
// A file checkDataFile returned, read whole, at most max_file_bytes (one that grew past
// the limit since is refused).
std::string readDataFile(const DataAccess& access, const std::string& checked,
                         std::string_view what);

}  // namespace tandem
