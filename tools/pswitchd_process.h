// A pswitchd child process for benchmarks and end-to-end tests: started with the given flags,
// its stderr captured to a log file, its TCP port read from its start-up log.
#ifndef PSWITCH_TOOLS_PSWITCHD_PROCESS_H_
#define PSWITCH_TOOLS_PSWITCHD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace pswitch::tools {

// Not thread-safe. Destruction sends SIGTERM and reaps the daemon (which reaps its workers).
class PswitchdProcess {
 public:
  // Starts `binary` with `args` (add --listen=127.0.0.1:0 to get a free port) and waits up to
  // 60 s until it serves. port() is 0 when it did not come up; log() says why. The daemon gets
  // SIGTERM when the constructing thread ends (PR_SET_PDEATHSIG): construct it on the thread
  // that outlives it (main).
  PswitchdProcess(const std::string& binary, const std::vector<std::string>& args,
                  const std::string& log_path);
  ~PswitchdProcess();
  PswitchdProcess(const PswitchdProcess&) = delete;
  PswitchdProcess& operator=(const PswitchdProcess&) = delete;

  int port() const { return port_; }
  int http_port() const { return http_port_; }  // 0: no HTTP port
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string log() const;
  // Sends SIGTERM and waits for the daemon to exit; returns its waitpid status (-1 when it was
  // not running). The destructor then has nothing left to do.
  int Terminate();

 private:
  const std::string log_path_;
  pid_t pid_ = -1;
  int port_ = 0;
  int http_port_ = 0;
};

}  // namespace pswitch::tools

#endif  // PSWITCH_TOOLS_PSWITCHD_PROCESS_H_
