// A real pswitchd for end-to-end tests: host backend (flags may name another), a free port, its
// own memdaemon socket and log in a temporary directory.
#ifndef PSWITCH_TESTS_TEST_DAEMON_H_
#define PSWITCH_TESTS_TEST_DAEMON_H_

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "base/files.h"
#include "tests/gpu_probe.h"
#include "tools/pswitchd_process.h"
#include "worker/backends.h"

namespace pswitch::e2e {

// Why pswitchd cannot serve on `backend` here, or "" when it can.
inline std::string BackendSkipReason(gpu::Backend backend) {
  if (absl::Status workers = worker::CheckWorkerBackend(backend); !workers.ok()) {
    return std::string(workers.message());
  }
  return DeviceSkipReason(backend);
}

class TestDaemon {
 public:
  // `flags` come after the common ones (backend, port, socket, its directory as the data root),
  // so they may override them.
  explicit TestDaemon(std::vector<std::string> flags)
      : dir_(std::filesystem::temp_directory_path() /
             ("pswitch-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(++count_))),
        created_(std::filesystem::create_directories(dir_)),
        process_(PSWITCHD_PATH, Flags(dir_, std::move(flags)), (dir_ / "pswitchd.log").string()) {}
  ~TestDaemon() { (void)base::RemoveTree(dir_); }
  std::string address() const { return process_.address(); }
  pid_t pid() const { return process_.pid(); }
  int port() const { return process_.port(); }
  int http_port() const { return process_.http_port(); }
  std::string log() const { return process_.log(); }
  // Waits (bounded) until the daemon has logged `n` workers ready: each is attached to the
  // memdaemon and has loaded the catalog, so its sockets are all open. (The daemon serves as
  // soon as one worker is ready; the standbys may still be starting.)
  bool AwaitWorkersReady(size_t n) const {
    for (int i = 0; i < 6000; ++i) {
      const std::string text = log();
      size_t count = 0;
      for (size_t at = text.find("event=worker_ready"); at != std::string::npos;
           at = text.find("event=worker_ready", at + 1)) {
        ++count;
      }
      if (count >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  int Terminate() { return process_.Terminate(); }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  static std::vector<std::string> Flags(const std::filesystem::path& dir,
                                        std::vector<std::string> extra) {
    std::vector<std::string> flags = {"--backend=host", "--listen=127.0.0.1:0",
                                      "--http-listen=127.0.0.1:0",
                                      "--socket=" + (dir / "m.sock").string(),
                                      "--data-root=" + dir.string()};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }
  static inline int count_ = 0;
  std::filesystem::path dir_;
  bool created_;  // sequences the directory's creation before process_ starts
  tools::PswitchdProcess process_;
};

}  // namespace pswitch::e2e

#endif  // PSWITCH_TESTS_TEST_DAEMON_H_
