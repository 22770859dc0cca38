// Test-only: temporary file paths that are removed when the test process exits, so model
// files written by tests (tiny GGUFs of a few hundred KB each) do not pile up in /tmp.
//
// TempFilePath("fwd_base") -> "<temp dir>/specnode_<pid>_fwd_base.gguf" (unique per process;
// the same stem gives the same path). The file need not exist; whatever is at the path at
// exit is removed. Thread-safe.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <set>
#include <string>

namespace specnode::testing_support {

class TempFiles {
 public:
  static TempFiles& Get() {
    static TempFiles files;  // destroyed at exit: removes every registered path
    return files;
  }
  std::string Path(const std::string& stem, const std::string& ext) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("specnode_" + std::to_string(getpid()) + "_" + stem + ext))
                                 .string();
    std::lock_guard lock(mu_);
    paths_.insert(path);
    return path;
  }
  ~TempFiles() {
    std::error_code ec;
    for (const std::string& p : paths_) std::filesystem::remove(p, ec);
  }

 private:
  std::mutex mu_;
  std::set<std::string> paths_;
};

inline std::string TempFilePath(const std::string& stem, const std::string& ext = ".gguf") {
  return TempFiles::Get().Path(stem, ext);
}

}  // namespace specnode::testing_support
