#include "tools/pswitchd_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <thread>

namespace pswitch::tools {

PswitchdProcess::PswitchdProcess(const std::string& binary, const std::vector<std::string>& args,
                                 const std::string& log_path)
    : log_path_(log_path) {
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    // A benchmark stopped by a signal (Ctrl-C) takes its daemon with it, rather than leaving it
    // and its workers running; the check covers a parent that died before the prctl.
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) _exit(125);
    if (std::freopen(log_path_.c_str(), "w", stderr) == nullptr) _exit(126);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  // The start-up log is the daemon's only readiness signal; poll it (bounded).
  const std::regex port_re("event=started .* port=([0-9]+)");
  for (int i = 0; i < 6000 && port_ == 0 && pid_ > 0; ++i) {
    std::string text = log();
    std::smatch m;
    if (text.find("event=serving") != std::string::npos && std::regex_search(text, m, port_re)) {
      port_ = std::stoi(m[1]);
      const std::regex http_re("event=started .* http_port=([0-9]+)");
      if (std::regex_search(text, m, http_re)) http_port_ = std::stoi(m[1]);
      break;
    }
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

PswitchdProcess::~PswitchdProcess() { Terminate(); }

int PswitchdProcess::Terminate() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = -1;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return status;
}

std::string PswitchdProcess::log() const {
  std::ifstream in(log_path_);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace pswitch::tools
