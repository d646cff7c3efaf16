// One structured logger for every pswitch process: logfmt lines, each with a timestamp, a level
// and an event, then key=value fields:
//
//   ts=2026-11-23T06:09:08.918Z level=info event=task_switch task=3 model=resnet50 copy_ms=1.204
//
// A line is formatted whole and handed to the sink in one call, which writes it with one write(2)
// (no interleaving with other threads or processes sharing the file) and flushes it. The sink is
// injectable, as LevelDB's Env logger is: tests capture events in memory instead of grepping a
// file. No library code writes to stderr directly.
//
//   base::Log(base::LogLevel::kInfo, "task_switch").Field("task", id).Field("copy_ms", ms, 3);
#ifndef PSWITCH_BASE_LOG_H_
#define PSWITCH_BASE_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pswitch::base {

enum class LogLevel { kDebug, kInfo, kWarn, kError };
absl::string_view LogLevelName(LogLevel level);

// Receives whole lines (without the newline). Must be thread-safe.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void Write(LogLevel level, absl::string_view line) = 0;
};

// Writes each line to a file descriptor with one write(2) (default: stderr).
class FdLogSink : public LogSink {
 public:
  explicit FdLogSink(int fd = 2) : fd_(fd) {}
  void Write(LogLevel level, absl::string_view line) override;

 private:
  const int fd_;
};

// Keeps every line in memory (tests): lines and events can be read and awaited.
class MemoryLogSink : public LogSink {
 public:
  void Write(LogLevel level, absl::string_view line) override;
  std::vector<std::string> Lines() const;
  // Lines whose event is `event` (and that contain every one of `fields`, e.g. "gpu=1").
  std::vector<std::string> Events(absl::string_view event,
                                  const std::vector<std::string>& fields = {}) const;
  // Waits (bounded) until such a line exists; false at the deadline.
  bool AwaitEvent(absl::string_view event, const std::vector<std::string>& fields,
                  absl::Duration timeout) const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// The process's sink (an FdLogSink on stderr until replaced). Replacing it returns the old one.
std::shared_ptr<LogSink> SetLogSink(std::shared_ptr<LogSink> sink);
// Lines below `level` are dropped (default kInfo).
void SetMinLogLevel(LogLevel level);

// Formats a value as logfmt does: bare when it is a plain token, else double-quoted with \" and
// \\ and control characters escaped.
std::string LogfmtValue(absl::string_view value);

// One line, emitted when the builder goes out of scope.
class Log {
 public:
  Log(LogLevel level, absl::string_view event);
  ~Log();
  Log(const Log&) = delete;
  Log& operator=(const Log&) = delete;
  // A moved-from builder emits nothing (so helpers can return a line with context fields).
  Log(Log&& other) noexcept;
  Log& operator=(Log&&) = delete;

  Log& Field(absl::string_view key, absl::string_view value);
  Log& Field(absl::string_view key, const std::string& value) {
    return Field(key, absl::string_view(value));
  }
  Log& Field(absl::string_view key, const char* value) {
    return Field(key, absl::string_view(value));
  }
  Log& Field(absl::string_view key, bool value) { return Raw(key, value ? "1" : "0"); }
  template <typename Int, typename = std::enable_if_t<std::is_integral_v<Int>>>
  Log& Field(absl::string_view key, Int value) {
    return Raw(key, std::to_string(value));
  }
  // Fixed-point with `precision` decimals.
  Log& Field(absl::string_view key, double value, int precision = 3);
  // Milliseconds with 3 decimals, the unit every duration in the logs uses.
  Log& FieldMs(absl::string_view key, absl::Duration value);
  // The status's code and message, quoted.
  Log& Field(absl::string_view key, const absl::Status& status);

 private:
  Log& Raw(absl::string_view key, absl::string_view value);

  const LogLevel level_;
  bool enabled_;
  std::string line_;
};

}  // namespace pswitch::base

#endif  // PSWITCH_BASE_LOG_H_
