// pswitchctl: the command-line client of pswitchd.
//
//   pswitchctl --server HOST:PORT register --name N [--model ZOO | --archive A.pswitch.pt]
//              [--weights W] [--batch B] [--plan plan.json|auto] [--trainers alice,bob]
//   pswitchctl --server HOST:PORT infer --name N --input X.safetensors --output Y.safetensors
//              [--priority P] [--deadline-ms D] [--online-slo-ms MS]
//   pswitchctl --server HOST:PORT train --name N --iterations K [--batch B] [--seed S]
//              [--priority P] [--optimizer sgd|adam] [--lr LR] [--momentum M] [--deadline-ms D]
//              [--as COPY]
//   pswitchctl --server HOST:PORT status [TASK] | models | cancel TASK | unload --name N
//   pswitchctl --server HOST:PORT bubble-cycle --gpu G --cycle cycle.json
//   pswitchctl --server HOST:PORT fill submit|estimate --kind training|inference|synthetic
//              [--model M] [--dataset D.safetensors --output O.safetensors] [--batch B]
//              [--steps K] --step-us US --memory-bytes BYTES [--deadline-ms D]
//              [--synthetic-step-us US]
//   pswitchctl --server HOST:PORT fill status JOB | fill cancel JOB | fill stats
//
// `fill estimate` prints the GPU and predicted completion the job would get, submitting nothing.
//
// --server "unix:/path" is pswitchd's Unix socket. The default (127.0.0.1:7300) and any loopback
// address with port 7300 use pswitchd's default Unix socket ($PSWITCH_UNIX_SOCKET, else
// /run/pswitch/pswitchd.sock, then $XDG_RUNTIME_DIR/pswitch/pswitchd.sock) when one accepts the
// connection, else TCP (--tcp: always TCP). Over
// the Unix socket the files register names (--weights, --archive, --plan) are opened by
// pswitchctl itself, relative to its working directory and with its user's rights, and passed to
// pswitchd as open files; infer's tensors travel through a shared transfer area. Over TCP those
// files are paths on the server (--allow-client-paths). A fill job's --dataset and --output are
// opened and created by pswitchctl and passed the same way over the Unix socket; over TCP they
// are named under pswitchd's --data-root.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "httplib.h"
#include "models/safetensors.h"
#include "proto/dtype.h"
#include "tools/cli.h"

ABSL_FLAG(std::string, server, "127.0.0.1:7300",
          "pswitchd address: HOST:PORT, or unix:/path (a loopback address with port 7300 uses "
          "pswitchd's default Unix socket when it answers)");
ABSL_FLAG(bool, tcp, false, "always TCP, never the Unix socket");
ABSL_FLAG(std::string, name, "", "registered model name");
ABSL_FLAG(std::string, model, "",
          "register: zoo architecture (e.g. resnet152); omit to load --name from pswitchd's "
          "model repository");
ABSL_FLAG(std::string, weights, "",
          "register: safetensors weights (Unix socket: opened here and passed; TCP: a path on "
          "the server)");
ABSL_FLAG(std::string, archive, "",
          "register: your own model, a pswitch.export archive (Unix socket: opened here and "
          "passed; TCP: an absolute path on the server)");
ABSL_FLAG(uint32_t, batch, 0,
          "register: batch size (default 1); train: samples per iteration (default the model's "
          "registered batch); fill submit: rows per step (default 1)");
ABSL_FLAG(std::string, plan, "auto",
          "register: grouping plan JSON (passed like --weights), or auto");
ABSL_FLAG(std::string, input, "",
          "infer: input safetensors ('input', optional "
          "'attention_mask', 'token_type_ids')");
ABSL_FLAG(std::string, output, "",
          "infer: local file for the 'output' tensor; fill submit (inference): a new file, "
          "created here over the Unix socket, else named relative to pswitchd's --data-root");
ABSL_FLAG(int, priority, 0, "task priority (priority policy)");
ABSL_FLAG(double, online_slo_ms, 0,
          "infer: online fill work, served in a main job's bubble within this latency objective "
          "(refused with the reason, or run anyway, as pswitchd's --online-fill-overflow says, "
          "if no bubble can); 0 = a plain request");
ABSL_FLAG(uint64_t, deadline_ms, 0,
          "infer, train, fill submit/estimate: deadline from submission (edf / deadline policy); 0 = none (pswitchd's --max-task-time-s)");
ABSL_FLAG(uint32_t, iterations, 0, "train: iterations");
ABSL_FLAG(uint64_t, seed, 0, "train: data and dropout seed");
ABSL_FLAG(std::string, optimizer, "sgd", "train: sgd or adam");
ABSL_FLAG(double, lr, 0.01, "train: learning rate");
ABSL_FLAG(double, momentum, 0.9, "train: SGD momentum (0 = plain SGD)");
ABSL_FLAG(std::string, as, "",
          "train: register a copy of --name under this new name, yours alone, and train the copy "
          "(needed unless you are an admin or one of the model's trainers)");
ABSL_FLAG(std::string, dtype, "",
          "register: a zoo model's precision, float16 or bfloat16 (half the bytes, inference "
          "only); empty: float32");
ABSL_FLAG(bool, pin_resident, false,
          "register: once the model's weights are resident on a GPU, never evict them there");
ABSL_FLAG(std::vector<std::string>, trainers, {},
          "register: token names who may train the model in place and unload it besides admins");
ABSL_FLAG(std::string, token, "",
          "bearer token for a pswitchd with --auth-tokens (default: $PSWITCH_TOKEN, which keeps "
          "it out of the process list)");
ABSL_FLAG(int, timeout_s, 600, "give up waiting after this many seconds");
ABSL_FLAG(uint32_t, gpu, 0, "bubble-cycle: the GPU (pipeline stage)");
ABSL_FLAG(std::string, cycle, "", "bubble-cycle: the cycle JSON file");
ABSL_FLAG(std::string, kind, "", "fill submit: training, inference or synthetic (required)");
ABSL_FLAG(std::string, dataset, "",
          "fill submit (inference): safetensors with 'input' rows, opened here over the Unix "
          "socket, else named relative to pswitchd's --data-root");
ABSL_FLAG(uint32_t, steps, 0, "fill submit: training iterations / synthetic steps");
ABSL_FLAG(uint64_t, step_us, 0,
          "fill submit: profiled step duration (profile-model); synthetic: default "
          "--synthetic-step-us");
ABSL_FLAG(uint64_t, memory_bytes, 0, "fill submit: the job's memory cap");
ABSL_FLAG(uint64_t, synthetic_step_us, 0, "fill submit (synthetic): each step's device time");
ABSL_FLAG(std::string, http, "127.0.0.1:8300", "trace: pswitchd's HTTP port (HOST:PORT)");
ABSL_FLAG(int, seconds, 10, "trace: the last this many seconds (1 to 600)");
ABSL_FLAG(std::string, out, "", "trace: the file to create (Chrome trace JSON; opens in Perfetto)");

namespace pswitch {
namespace {

using models::DType;

// Safetensors' dtypes and the wire's share their names (proto/dtype.h).
absl::StatusOr<proto::DType> ToWire(DType dtype) {
  const proto::DTypeInfo* info = proto::DTypeByName(models::DTypeName(dtype));
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", models::DTypeName(dtype), " is not accepted as a task input"));
  }
  return info->wire;
}

absl::StatusOr<DType> FromWire(proto::DType dtype) {
  const proto::DTypeInfo* info = proto::FindDType(dtype);
  if (info == nullptr) return absl::InvalidArgumentError("unknown output dtype");
  return models::ParseDType(info->name);
}

absl::StatusOr<std::vector<proto::HostTensor>> ReadInputs(const std::string& path) {
  auto file = models::SafetensorsFile::Read(path);
  if (!file.ok()) return file.status();
  std::vector<proto::HostTensor> inputs;
  for (const models::SafetensorsTensor& t : file->tensors()) {
    auto dtype = ToWire(t.dtype);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", t.name, "': ", dtype.status().message()));
    }
    inputs.push_back(
        proto::HostTensor{t.name, *dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.bytes)});
  }
  return inputs;
}

absl::StatusOr<client::TaskResult> InferFramed(client::Client& client, const std::string& name,
                                               const client::InferOptions& options) {
  auto inputs = ReadInputs(absl::GetFlag(FLAGS_input));
  if (!inputs.ok()) return inputs.status();
  return client.Infer(name, std::move(*inputs), options);
}

// The Unix socket: the file's tensors are copied once, straight into the transfer area, and the
// outputs once out of it (into the result, for the output file).
absl::StatusOr<client::TaskResult> InferInArea(client::Client& client, const std::string& name,
                                               const client::InferOptions& options) {
  const std::string path = absl::GetFlag(FLAGS_input);
  auto file = models::SafetensorsFile::Read(path);
  if (!file.ok()) return file.status();
  std::vector<client::AreaTensor> inputs;
  for (const models::SafetensorsTensor& t : file->tensors()) {
    auto dtype = ToWire(t.dtype);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": '", t.name, "': ", dtype.status().message()));
    }
    auto placed = client.Tensor(t.shape, *dtype, t.name);
    if (!placed.ok()) return placed.status();
    if (placed->length() != t.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": '", t.name, "' holds ", t.bytes,
                                                     " bytes for its shape's ", placed->length()));
    }
    std::memcpy(placed->data(), t.data, t.bytes);
    inputs.push_back(std::move(*placed));
  }
  auto result = client.InferArea(name, std::move(inputs), options);
  if (!result.ok()) return result.status();
  client::TaskResult copied;
  copied.task_id = result->task_id;
  copied.latency = result->latency;
  copied.switch_time = result->switch_time;
  for (const client::AreaTensor& t : result->outputs) copied.outputs.push_back(t.ToHost());
  return copied;
}

absl::Status WriteOutputs(const std::string& path, const std::vector<proto::HostTensor>& outputs) {
  std::vector<models::SafetensorsEntry> entries;
  for (const proto::HostTensor& t : outputs) {
    auto dtype = FromWire(t.dtype);
    if (!dtype.ok()) return dtype.status();
    entries.push_back({t.name, *dtype, t.shape, t.data.data(), t.data.size()});
  }
  return models::WriteSafetensors(path, entries);
}

absl::Status Require(bool ok, absl::string_view what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat("missing ", what));
}

absl::StatusOr<uint64_t> TaskArg(const std::vector<std::string>& args) {
  uint64_t id = 0;
  if (args.size() != 2 || !absl::SimpleAtoi(args[1], &id)) {
    return absl::InvalidArgumentError(absl::StrCat(args[0], " needs one numeric TASK id"));
  }
  return id;
}

void PrintTask(const client::TaskStatus& s) {
  std::printf("task %llu model=%s state=%s iterations_done=%u preemptions=%u clean_us=%lld%s\n",
              static_cast<unsigned long long>(s.task_id), s.model.c_str(),
              std::string(client::TaskStateName(s.state)).c_str(), s.iterations_done,
              s.preemptions, static_cast<long long>(absl::ToInt64Microseconds(s.clean_time)),
              s.error.ok() ? "" : (" error=\"" + s.error.ToString() + "\"").c_str());
}

void PrintFill(const client::FillJobStatus& s) {
  if (s.job_id == 0) {  // an estimate
    std::printf("fill estimate gpu=%u steps=%llu predicted_completion_ms=%.1f meets_deadline=%s\n",
                s.gpu, static_cast<unsigned long long>(s.steps_total),
                absl::ToDoubleMilliseconds(s.predicted_remaining), s.meets_deadline ? "yes" : "no");
    return;
  }
  std::printf("fill job %llu state=%s gpu=%u steps=%llu/%llu bubbles=%u",
              static_cast<unsigned long long>(s.job_id),
              std::string(client::FillStateName(s.state)).c_str(), s.gpu,
              static_cast<unsigned long long>(s.steps_done),
              static_cast<unsigned long long>(s.steps_total), s.bubbles);
  if (s.state != client::FillState::kStopped) {
    std::printf(" predicted_remaining_ms=%.1f meets_deadline=%s",
                absl::ToDoubleMilliseconds(s.predicted_remaining), s.meets_deadline ? "yes" : "no");
  }
  if (!s.error.ok()) std::printf(" error=\"%s\"", s.error.ToString().c_str());
  std::printf("\n");
}

absl::StatusOr<client::FillJobOptions> FillJobFromFlags() {
  client::FillJobOptions o;
  const std::string kind = absl::GetFlag(FLAGS_kind);
  if (kind == "synthetic") {
    o.kind = client::FillKind::kSynthetic;
  } else if (kind == "training") {
    o.kind = client::FillKind::kTraining;
  } else if (kind == "inference") {
    o.kind = client::FillKind::kInference;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--kind must be training, inference or synthetic, got '", kind, "'"));
  }
  o.model = absl::GetFlag(FLAGS_model);
  o.dataset_path = absl::GetFlag(FLAGS_dataset);
  o.output_path = absl::GetFlag(FLAGS_output);
  o.batch = std::max<uint32_t>(absl::GetFlag(FLAGS_batch), 1);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.step = absl::Microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_step_us)));
  o.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  o.deadline = absl::Milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_deadline_ms)));
  o.synthetic_step =
      absl::Microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_synthetic_step_us)));
  return o;
}

absl::Status Fill(client::Client& client, const std::vector<std::string>& args) {
  const std::string sub = args.size() > 1 ? args[1] : "";
  if (sub == "submit" || sub == "estimate") {
    if (args.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("fill ", sub, " takes flags only"));
    }
    auto job = FillJobFromFlags();
    if (!job.ok()) return job.status();
    auto status = sub == "submit" ? client.SubmitFill(*job) : client.EstimateFill(*job);
    if (!status.ok()) return status.status();
    PrintFill(*status);
    return absl::OkStatus();
  }
  if (sub == "status" || sub == "cancel") {
    uint64_t id = 0;
    if (args.size() != 3 || !absl::SimpleAtoi(args[2], &id)) {
      return absl::InvalidArgumentError(absl::StrCat("fill ", sub, " needs one numeric JOB id"));
    }
    if (sub == "cancel") {
      if (absl::Status cancelled = client.CancelFill(id); !cancelled.ok()) return cancelled;
      std::printf("fill job %llu cancelled\n", static_cast<unsigned long long>(id));
      return absl::OkStatus();
    }
    auto status = client.FillStatus(id);
    if (!status.ok()) return status.status();
    PrintFill(*status);
    return absl::OkStatus();
  }
  if (sub == "stats") {
    auto s = client.FillStats();
    if (!s.ok()) return s.status();
    std::printf(
        "bubbles=%llu bubble_ms=%.1f fill_step_ms=%.1f used=%.1f%% steps=%llu pause_p50_ms=%.3f "
        "pause_p99_ms=%.3f killed=%llu runs=%llu bell_wakes=%llu\n",
        static_cast<unsigned long long>(s->bubbles), absl::ToDoubleMilliseconds(s->bubble_time),
        absl::ToDoubleMilliseconds(s->fill_step_time),
        s->bubble_time > absl::ZeroDuration()
            ? 100 * absl::FDivDuration(s->fill_step_time, s->bubble_time)
            : 0.0,
        static_cast<unsigned long long>(s->steps), absl::ToDoubleMilliseconds(s->pause_p50),
        absl::ToDoubleMilliseconds(s->pause_p99), static_cast<unsigned long long>(s->killed),
        static_cast<unsigned long long>(s->runs), static_cast<unsigned long long>(s->bell_wakes));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("fill needs submit, estimate, status JOB, cancel JOB or stats");
}

// `pswitchctl trace --seconds N --out FILE`: GET /v1/trace from the HTTP port, saved to a new
// file (an existing one is never replaced).
absl::Status Trace() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("trace needs --out FILE");
  const std::string address = absl::GetFlag(FLAGS_http);
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad --http '", address, "' (HOST:PORT)"));
  }
  httplib::Client http(address.substr(0, colon), port);
  http.set_read_timeout(absl::GetFlag(FLAGS_timeout_s), 0);
  httplib::Headers headers;
  const std::string token = tools::ClientToken(absl::GetFlag(FLAGS_token));
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  auto r = http.Get(absl::StrCat("/v1/trace?seconds=", absl::GetFlag(FLAGS_seconds)), headers);
  if (!r) {
    return absl::UnavailableError(absl::StrCat("GET /v1/trace from ", address, ": ",
                                               httplib::to_string(r.error())));
  }
  if (r->status != 200) {
    return absl::UnknownError(absl::StrCat("GET /v1/trace: HTTP ", r->status, ": ", r->body));
  }
  const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", out, ": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (written < r->body.size()) {
    const ssize_t n = write(fd, r->body.data() + written, r->body.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      unlink(out.c_str());
      return absl::InternalError(absl::StrCat("writing ", out, ": ", std::strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return absl::InternalError(absl::StrCat("closing ", out));
  std::printf("trace of the last %d s saved to %s (%zu bytes); open it in https://ui.perfetto.dev\n",
              absl::GetFlag(FLAGS_seconds), out.c_str(), r->body.size());
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  if (args.empty()) {
    return absl::InvalidArgumentError(
        "no command (register, infer, train, status, models, cancel, unload, bubble-cycle, fill, trace; "
        "see "
        "--help)");
  }
  const std::string& command = args[0];
  if (command == "trace") return Trace();
  client::ClientOptions options;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  options.token = tools::ClientToken(absl::GetFlag(FLAGS_token));
  if (absl::GetFlag(FLAGS_tcp)) options.transport = client::Transport::kTcp;
  auto c = client::Client::Connect(absl::GetFlag(FLAGS_server), options);
  if (!c.ok()) return c.status();
  client::Client& client = **c;
  const std::string name = absl::GetFlag(FLAGS_name);
  if (command == "register") {
    if (auto s =
            Require(!name.empty(), "--name (alone: the model of that name in pswitchd's "
                                   "--model-repository; with --model: that architecture)");
        !s.ok()) {
      return s;
    }
    // Progress on stderr as each phase ends: one line rewritten in place on a terminal, a line
    // per phase otherwise (logs, pipes).
    const bool tty = ::isatty(STDERR_FILENO) == 1;
    // "inspect 1.30 s", in the progress line and the summary alike.
    auto phase_text = [](const std::string& phase, absl::Duration took) {
      return absl::StrFormat("%s %.2f s", phase, absl::ToDoubleSeconds(took));
    };
    std::string so_far;
    client::RegisterOptions options{name,
                                    absl::GetFlag(FLAGS_model),
                                    absl::GetFlag(FLAGS_weights),
                                    std::max<uint32_t>(absl::GetFlag(FLAGS_batch), 1),
                                    absl::GetFlag(FLAGS_plan),
                                    absl::GetFlag(FLAGS_archive),
                                    absl::GetFlag(FLAGS_trainers)};
    options.dtype = absl::GetFlag(FLAGS_dtype);
    options.pin_resident = absl::GetFlag(FLAGS_pin_resident);
    options.on_phase = [&](const std::string& phase, absl::Duration took) {
      const std::string one = phase_text(phase, took);
      absl::StrAppend(&so_far, so_far.empty() ? "" : ", ", one);
      if (tty) {
        // \033[K: clear what a longer running-phase line left at its end.
        std::fprintf(stderr, "\rregistering %s: %s\033[K", name.c_str(), so_far.c_str());
      } else {
        std::fprintf(stderr, "registering %s: %s\n", name.c_str(), one.c_str());
      }
      std::fflush(stderr);
    };
    // How far a long phase has come ("inspect: profiling: run 2 of 4"), after the phases done.
    options.on_phase_progress = [&](const std::string& phase, absl::Duration,
                                    const std::string& detail) {
      if (tty) {
        std::fprintf(stderr, "\rregistering %s: %s%s%s: %s\033[K", name.c_str(), so_far.c_str(),
                     so_far.empty() ? "" : ", ", phase.c_str(), detail.c_str());
      } else {
        std::fprintf(stderr, "registering %s: %s: %s\n", name.c_str(), phase.c_str(),
                     detail.c_str());
      }
      std::fflush(stderr);
    };
    auto registered = client.Register(options);
    if (tty && !so_far.empty()) std::fprintf(stderr, "\n");
    if (!registered.ok()) return registered.status();
    std::printf("registered %s: %u layers in %u groups, %llu bytes\n", registered->name.c_str(),
                registered->layers, registered->groups,
                static_cast<unsigned long long>(registered->param_bytes));
    // Where the time went: read, inspect, profile, plan, pin, load.
    std::string phases;
    absl::Duration total;
    for (const auto& [phase, took] : registered->phases) {
      absl::StrAppend(&phases, phases.empty() ? "" : ", ", phase_text(phase, took));
      total += took;
    }
    if (!phases.empty()) {
      std::printf("  in %.2f s: %s\n", absl::ToDoubleSeconds(total), phases.c_str());
    }
    return absl::OkStatus();
  }
  if (command == "infer") {
    if (auto s = Require(!name.empty() && !absl::GetFlag(FLAGS_input).empty() &&
                             !absl::GetFlag(FLAGS_output).empty(),
                         "--name, --input and --output");
        !s.ok()) {
      return s;
    }
    client::InferOptions infer;
    infer.priority = absl::GetFlag(FLAGS_priority);
    infer.deadline = absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms));
    if (!(absl::GetFlag(FLAGS_online_slo_ms) >= 0)) {
      return absl::InvalidArgumentError("--online-slo-ms must be >= 0");
    }
    infer.online_slo = absl::Milliseconds(absl::GetFlag(FLAGS_online_slo_ms));
    auto result =
        client.local() ? InferInArea(client, name, infer) : InferFramed(client, name, infer);
    if (!result.ok()) return result.status();
    if (auto s = WriteOutputs(absl::GetFlag(FLAGS_output), result->outputs); !s.ok()) return s;
    std::printf("task %llu: latency %.3f ms (switch %.3f ms), output written to %s\n",
                static_cast<unsigned long long>(result->task_id),
                absl::ToDoubleMilliseconds(result->latency),
                absl::ToDoubleMilliseconds(result->switch_time),
                absl::GetFlag(FLAGS_output).c_str());
    return absl::OkStatus();
  }
  if (command == "train") {
    if (auto s = Require(!name.empty() && absl::GetFlag(FLAGS_iterations) > 0,
                         "--name and --iterations");
        !s.ok()) {
      return s;
    }
    const std::string optimizer = absl::GetFlag(FLAGS_optimizer);
    if (optimizer != "sgd" && optimizer != "adam") {
      return absl::InvalidArgumentError(
          absl::StrCat("--optimizer must be sgd or adam, got '", optimizer, "'"));
    }
    client::TrainOptions options;
    options.iterations = absl::GetFlag(FLAGS_iterations);
    options.batch = absl::GetFlag(FLAGS_batch);
    options.seed = absl::GetFlag(FLAGS_seed);
    options.priority = absl::GetFlag(FLAGS_priority);
    options.optimizer = optimizer == "adam" ? client::Optimizer::kAdam : client::Optimizer::kSgd;
    options.learning_rate = absl::GetFlag(FLAGS_lr);
    options.momentum = absl::GetFlag(FLAGS_momentum);
    options.deadline = absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms));
    options.as_model = absl::GetFlag(FLAGS_as);
    auto result = client.Train(name, options);
    if (!result.ok()) return result.status();
    std::printf("task %llu: %u iterations in %.3f ms\n",
                static_cast<unsigned long long>(result->task_id), absl::GetFlag(FLAGS_iterations),
                absl::ToDoubleMilliseconds(result->latency));
    return absl::OkStatus();
  }
  if (command == "status") {
    if (args.size() == 1) {  // no TASK: the most recent tasks, newest first
      auto tasks = client.ListTasks();
      if (!tasks.ok()) return tasks.status();
      if (tasks->empty()) std::printf("no tasks\n");
      for (const client::TaskStatus& t : *tasks) PrintTask(t);
      return absl::OkStatus();
    }
    auto id = TaskArg(args);
    if (!id.ok()) return id.status();
    auto status = client.Status(*id);
    if (!status.ok()) return status.status();
    PrintTask(*status);
    return absl::OkStatus();
  }
  if (command == "models") {
    auto models = client.ListModels();
    if (!models.ok()) return models.status();
    for (const client::ModelInfo& m : *models) {
      std::string resident = m.resident_gpus.empty() ? "not resident" : "resident on gpu";
      for (size_t i = 0; i < m.resident_gpus.size(); ++i) {
        absl::StrAppend(&resident, i == 0 ? " " : ",", m.resident_gpus[i]);
      }
      std::printf("%s\t%s\t%llu bytes\t%s\n", m.name.c_str(), m.zoo_model.c_str(),
                  static_cast<unsigned long long>(m.param_bytes), resident.c_str());
    }
    return absl::OkStatus();
  }
  if (command == "cancel") {
    auto id = TaskArg(args);
    if (!id.ok()) return id.status();
    if (auto s = client.Cancel(*id); !s.ok()) return s;
    std::printf("cancel requested for task %llu\n", static_cast<unsigned long long>(*id));
    return absl::OkStatus();
  }
  if (command == "unload") {
    if (auto s = Require(!name.empty(), "--name (the registered model to unload)"); !s.ok()) {
      return s;
    }
    if (auto s = client.Unload(name); !s.ok()) return s;
    std::printf("model %s unloaded\n", name.c_str());
    return absl::OkStatus();
  }
  if (command == "bubble-cycle") {
    std::ifstream in(absl::GetFlag(FLAGS_cycle));
    if (!in)
      return absl::NotFoundError(
          absl::StrCat("cannot read --cycle '", absl::GetFlag(FLAGS_cycle), "'"));
    std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (auto s = client.RegisterBubbleCycle(absl::GetFlag(FLAGS_gpu), json); !s.ok()) return s;
    std::printf("bubble cycle registered for gpu %u\n", absl::GetFlag(FLAGS_gpu));
    return absl::OkStatus();
  }
  if (command == "fill") return Fill(client, args);
  return absl::InvalidArgumentError(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  std::vector<std::string> args = pswitch::tools::ParseToolFlags(
      argc, argv,
      "pswitchctl [--server HOST:PORT|unix:/path] [--tcp] "
      "register|infer|train|status|models|cancel|unload|bubble-cycle|"
      "fill|"
      "trace "
      "...",
      /*allow_positional=*/true);
  absl::Status status = pswitch::Run(args);
  if (!status.ok()) {
    std::fprintf(stderr, "pswitchctl: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
