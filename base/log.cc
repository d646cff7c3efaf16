#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace pswitch::base {
namespace {

absl::Mutex sink_mu;
std::shared_ptr<LogSink>& CurrentSink() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sink_mu) {
  static auto* sink = new std::shared_ptr<LogSink>(std::make_shared<FdLogSink>());
  return *sink;
}
std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

std::shared_ptr<LogSink> Sink() {
  absl::MutexLock lock(&sink_mu);
  return CurrentSink();
}

bool PlainToken(absl::string_view value) {
  if (value.empty()) return false;
  for (char c : value) {
    if (c <= ' ' || c == '"' || c == '=' || c == '\\' || c == 0x7f) return false;
  }
  return true;
}

// The line's event field, for MemoryLogSink's queries.
bool LineHas(absl::string_view line, absl::string_view event,
             const std::vector<std::string>& fields) {
  bool event_seen = false;
  for (absl::string_view token : absl::StrSplit(line, ' ')) {
    if (token == absl::StrCat("event=", event)) event_seen = true;
  }
  if (!event_seen) return false;
  for (const std::string& field : fields) {
    if (!absl::StrContains(line, absl::StrCat(" ", field))) return false;
  }
  return true;
}

}  // namespace

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

void FdLogSink::Write(LogLevel, absl::string_view line) {
  std::string whole = absl::StrCat(line, "\n");
  // One write for the whole line; a short write (a pipe under pressure) continues where it was.
  size_t done = 0;
  while (done < whole.size()) {
    ssize_t n = ::write(fd_, whole.data() + done, whole.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere left to report a failing log
    done += static_cast<size_t>(n);
  }
}

void MemoryLogSink::Write(LogLevel, absl::string_view line) {
  absl::MutexLock lock(&mu_);
  lines_.emplace_back(line);
}

std::vector<std::string> MemoryLogSink::Lines() const {
  absl::MutexLock lock(&mu_);
  return lines_;
}

std::vector<std::string> MemoryLogSink::Events(absl::string_view event,
                                               const std::vector<std::string>& fields) const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const std::string& line : lines_) {
    if (LineHas(line, event, fields)) out.push_back(line);
  }
  return out;
}

bool MemoryLogSink::AwaitEvent(absl::string_view event, const std::vector<std::string>& fields,
                               absl::Duration timeout) const {
  auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const std::string& line : lines_) {
      if (LineHas(line, event, fields)) return true;
    }
    return false;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
}

std::shared_ptr<LogSink> SetLogSink(std::shared_ptr<LogSink> sink) {
  absl::MutexLock lock(&sink_mu);
  std::shared_ptr<LogSink> old = std::move(CurrentSink());
  CurrentSink() = sink != nullptr ? std::move(sink) : std::make_shared<FdLogSink>();
  return old;
}

void SetMinLogLevel(LogLevel level) { min_level.store(static_cast<int>(level)); }

std::string LogfmtValue(absl::string_view value) {
  if (PlainToken(value)) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < ' ' || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

Log::Log(LogLevel level, absl::string_view event)
    : level_(level), enabled_(static_cast<int>(level) >= min_level.load()) {
  if (!enabled_) return;
  line_ = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " level=", LogLevelName(level), " event=", LogfmtValue(event));
}

Log::Log(Log&& other) noexcept
    : level_(other.level_), enabled_(other.enabled_), line_(std::move(other.line_)) {
  other.enabled_ = false;
}

Log::~Log() {
  if (enabled_) Sink()->Write(level_, line_);
}

Log& Log::Raw(absl::string_view key, absl::string_view value) {
  if (enabled_) absl::StrAppend(&line_, " ", key, "=", value);
  return *this;
}

Log& Log::Field(absl::string_view key, absl::string_view value) {
  return enabled_ ? Raw(key, LogfmtValue(value)) : *this;
}

Log& Log::Field(absl::string_view key, double value, int precision) {
  return enabled_ ? Raw(key, absl::StrFormat("%.*f", precision, value)) : *this;
}

Log& Log::FieldMs(absl::string_view key, absl::Duration value) {
  return Field(key, absl::ToDoubleMilliseconds(value), 3);
}

Log& Log::Field(absl::string_view key, const absl::Status& status) {
  return Field(key, status.ToString());
}

}  // namespace pswitch::base
