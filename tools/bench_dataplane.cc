// bench-dataplane: how fast a request's own tensors reach the worker and come back, path by path,
// against a memcpy of the same bytes in the same run (docs/dataplane.md). One pswitchd, one
// resident model with almost no compute (corner_probe: one pixel per image), inputs of 0.6, 4.8,
// 8.6 and 34 MB, every path interleaved request by request (in a new order each round):
//
//   unix-area    the C++ client over the Unix socket, inputs produced in its transfer area
//                (Client::Tensor), outputs read where the worker wrote them
//   unix-copy    the same through the HostTensor API: one client-side copy into the area
//   http-shm     Triton system shared memory over HTTP (a /dev/shm segment registered by name)
//   http-binary  KServe's binary extension over HTTP
//   tcp-framed   the C++ client over TCP, tensors inside the FlatBuffers frame (the baseline:
//                the path every request took before issue 26; ClientOptions::tcp_framing kInline)
//   tcp-payload  the C++ client over TCP, tensors as a raw payload after the frame (one writev
//                from the caller's buffer, received into a staging region; outputs back the same
//                way)
//
//   bench-dataplane [--requests 30] [--backend host] [--sizes 0.6,4.8,8.6,34]
//
// Prints, per size and path, the client latency p50/p99, the effective GB/s (input bytes / p50),
// and the ratio to memcpy's p50 + 0.2 ms (the target for the shared-memory paths: <= 1.5), and
// the framed path's p50 as the baseline. Two more baselines in the same run: a memcpy of the same
// bytes, and a bare loopback TCP connection moving them (tcp-loopback: the kernel's own ceiling
// for the TCP paths on this machine).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "client/client.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/cli.h"
#include "tools/pswitchd_process.h"

ABSL_FLAG(int, requests, 30, "measured requests per path and size");
ABSL_FLAG(std::string, backend, "host", "pswitchd's backend");
ABSL_FLAG(std::string, sizes, "0.6,4.8,8.6,34",
          "input sizes in MB (each rounded to a [N, 3, H, W] float32 image batch)");
ABSL_FLAG(std::string, paths, "",
          "comma-separated paths to measure (empty: all); tcp-framed computes the reference "
          "answers either way");
ABSL_FLAG(bool, keep_dir, false, "keep the scratch directory (pswitchd's log) and print it");
ABSL_FLAG(std::string, archive, PSWITCH_TEST_DATA_DIR "/archives/corner_probe.pswitch.pt",
          "the model: a pswitch.export archive taking [N, 3, H, W] float32");

namespace pswitch {
namespace {

using nlohmann::json;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench-dataplane: %s\n", status.ToString().c_str());
  return 1;
}

// The image batch closest to `mb` megabytes: ResNet's 224 x 224 up to 8 images, Inception's
// 299 x 299 beyond (0.6 MB = 1 x 224², 4.8 = 8 x 224², 8.6 = 8 x 299², 34 = 32 x 299²).
std::vector<int64_t> ShapeFor(double mb) {
  const double bytes = mb * 1e6;
  const int64_t side = bytes > 5e6 ? 299 : 224;
  const double per_image = 3.0 * side * side * 4;
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(bytes / per_image + 0.5));
  return {n, 3, side, side};
}

// What every path is given: the input's values (the same for every path and request, so the
// answers can be compared bit for bit) and its shape.
struct Case {
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> expected_output;  // the framed path's answer
};

// A POSIX shared-memory segment (/dev/shm/NAME), unlinked when destroyed.
class ShmSegment {
 public:
  static absl::StatusOr<ShmSegment> Create(std::string name, size_t size) {
    const std::string path = "/" + name;
    UniqueFd fd(::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) return absl::InternalError("shm_open " + path + " failed");
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      ::shm_unlink(path.c_str());
      return absl::InternalError("sizing " + path + " failed");
    }
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) {
      ::shm_unlink(path.c_str());
      return absl::InternalError("mapping " + path + " failed");
    }
    return ShmSegment(std::move(name), static_cast<uint8_t*>(base), size);
  }
  ShmSegment(ShmSegment&& other) noexcept
      : name_(std::move(other.name_)), data_(std::exchange(other.data_, nullptr)),
        size_(other.size_) {}
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment& operator=(ShmSegment&&) = delete;
  ~ShmSegment() {
    if (data_ == nullptr) return;
    ::munmap(data_, size_);
    ::shm_unlink(("/" + name_).c_str());
  }
  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  ShmSegment(std::string name, uint8_t* data, size_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  std::string name_;
  uint8_t* data_;
  size_t size_;
};

// The inputs of one call, moved (a braced list would copy the tensor's bytes inside the clock).
std::vector<proto::HostTensor> Inputs(proto::HostTensor input) {
  std::vector<proto::HostTensor> inputs;
  inputs.push_back(std::move(input));
  return inputs;
}

using PathCall = std::function<absl::StatusOr<std::vector<uint8_t>>(const Case&)>;

struct Path {
  std::string name;
  PathCall call;
  std::map<size_t, std::vector<double>> ms;  // by case index
  // pswitchd's own side where the path's answer tells it (the C++ client's breakdown, HTTP's
  // Server-Timing): from the request's first byte (HTTP: its head) to the answer, and to the
  // first layer's start (the worker's copy of the input is before it).
  std::map<size_t, std::vector<double>> server_ms;
  std::map<size_t, std::vector<double>> first_layer_ms;
  // The path sends a HostTensor (take_input): it is built before the clock for this path only,
  // so the others do not run while 8.6 to 34 MB of freshly written bytes leave the cache.
  bool takes_input = false;
};

// What the last call's answer said of pswitchd's side; unset for paths whose answer does not.
struct ServerSide {
  double server_ms = -1;
  double first_layer_ms = -1;
};
ServerSide last_server_side;

template <typename Result>
void NoteServerSide(const Result& r) {
  last_server_side.server_ms = absl::ToDoubleMilliseconds(r.latency);
  last_server_side.first_layer_ms = absl::ToDoubleMilliseconds(r.breakdown.first_layer_start);
}

// The same from an HTTP answer's Server-Timing header ("first-layer;dur=0.41, total;dur=0.70").
void NoteServerTiming(const httplib::Result& r) {
  ServerSide side;
  for (absl::string_view metric : absl::StrSplit(r->get_header_value("Server-Timing"), ", ")) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(metric, ";dur=");
    double ms = -1;
    if (!absl::SimpleAtod(kv.second, &ms)) continue;
    if (kv.first == "first-layer") side.first_layer_ms = ms;
    if (kv.first == "total") side.server_ms = ms;
  }
  if (side.server_ms >= 0 && side.first_layer_ms >= 0) last_server_side = side;
}

// A bare loopback TCP connection in this process: what the kernel alone takes to move the
// bytes (the ceiling for the TCP paths on this machine). One length-prefixed message, received
// into memory already faulted in by a thread, answered with one byte.
class LoopbackPair {
 public:
  static absl::StatusOr<std::unique_ptr<LoopbackPair>> Create() {
    UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (!listener.valid() || ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listener.get(), 1) != 0 ||
        ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return absl::InternalError("loopback baseline: cannot listen");
    }
    UniqueFd sender(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!sender.valid() ||
        ::connect(sender.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::InternalError("loopback baseline: cannot connect");
    }
    UniqueFd receiver(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!receiver.valid()) return absl::InternalError("loopback baseline: cannot accept");
    const int one = 1;  // as the client and pswitchd do
    (void)::setsockopt(sender.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)::setsockopt(receiver.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return std::unique_ptr<LoopbackPair>(new LoopbackPair(std::move(sender), std::move(receiver)));
  }
  ~LoopbackPair() {
    sender_.Reset();  // the receiver sees end of stream and stops
    thread_.join();
  }

  // Sends `bytes` and waits for the receiver's acknowledgement; -1 on a socket error.
  double SendMs(const std::vector<uint8_t>& bytes) {
    const absl::Time start = absl::Now();
    const uint64_t n = bytes.size();
    if (!SendAll(reinterpret_cast<const uint8_t*>(&n), sizeof(n)) ||
        !SendAll(bytes.data(), bytes.size())) {
      return -1;
    }
    uint8_t ack = 0;
    if (::recv(sender_.get(), &ack, 1, MSG_WAITALL) != 1) return -1;
    return absl::ToDoubleMilliseconds(absl::Now() - start);
  }

 private:
  LoopbackPair(UniqueFd sender, UniqueFd receiver)
      : sender_(std::move(sender)), receiver_(std::move(receiver)) {
    thread_ = std::thread([this] { Receive(); });
  }
  bool SendAll(const uint8_t* data, size_t n) {
    while (n > 0) {
      const ssize_t k = ::send(sender_.get(), data, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      data += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }
  void Receive() {
    std::vector<uint8_t> into;
    while (true) {
      uint64_t n = 0;
      if (::recv(receiver_.get(), &n, sizeof(n), MSG_WAITALL) != sizeof(n)) return;
      if (into.size() < n) into.assign(n, 0);  // faulted in once, before the clock matters
      if (::recv(receiver_.get(), into.data(), n, MSG_WAITALL) != static_cast<ssize_t>(n)) return;
      const uint8_t ack = 1;
      if (::send(receiver_.get(), &ack, 1, MSG_NOSIGNAL) != 1) return;
    }
  }

  UniqueFd sender_;
  UniqueFd receiver_;
  std::thread thread_;
};

double MemcpyMs(const Case& c, std::vector<uint8_t>& into) {
  const absl::Time start = absl::Now();
  std::memcpy(into.data(), c.bytes.data(), c.bytes.size());
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  // Keeps the copy from being optimised away.
  if (into[into.size() / 2] != c.bytes[c.bytes.size() / 2]) std::abort();
  return ms;
}

int Run() {
  const int n = absl::GetFlag(FLAGS_requests);
  if (n < 5) return Fail(absl::InvalidArgumentError("--requests must be >= 5"));
  std::vector<Case> cases;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    double mb = 0;
    if (!absl::SimpleAtod(s, &mb) || mb <= 0 || mb > 512) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("bad size '", s, "'")));
    }
    Case c;
    c.shape = ShapeFor(mb);
    c.bytes.resize(static_cast<size_t>(c.shape[0] * c.shape[1] * c.shape[2] * c.shape[3] * 4));
    for (size_t i = 0; i < c.bytes.size(); ++i) c.bytes[i] = static_cast<uint8_t>(i * 131 + 7);
    // Keep the floats finite and small: every 4th byte (the exponent's high bits) is 0x3f.
    for (size_t i = 3; i < c.bytes.size(); i += 4) c.bytes[i] = 0x3f;
    cases.push_back(std::move(c));
  }

  char tmpl[] = "/tmp/bench-dataplane-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::filesystem::path dir = tmpl;
  tools::PswitchdProcess daemon(
      tools::SiblingBinary("pswitchd"),
      {"--backend=" + absl::GetFlag(FLAGS_backend), "--listen=127.0.0.1:0",
       "--http-listen=127.0.0.1:0", "--standby-workers=1", "--allow-client-paths=true",
       "--unix-socket=" + (dir / "pswitchd.sock").string(), "--socket=" + (dir / "m.sock").string()},
      (dir / "pswitchd.log").string());
  if (daemon.port() == 0 || daemon.http_port() == 0) {
    return Fail(absl::UnavailableError("pswitchd did not start:\n" + daemon.log()));
  }
  client::ClientOptions tcp_options;
  tcp_options.transport = client::Transport::kTcp;  // the framed baseline, never the Unix socket
  client::ClientOptions payload_options = tcp_options;
  tcp_options.tcp_framing = client::TcpFraming::kInline;
  auto tcp = client::Client::Connect(daemon.address(), tcp_options);
  if (!tcp.ok()) return Fail(tcp.status());
  auto tcp_payload = client::Client::Connect(daemon.address(), payload_options);
  if (!tcp_payload.ok()) return Fail(tcp_payload.status());
  auto local = client::Client::Connect("unix:" + (dir / "pswitchd.sock").string());
  if (!local.ok()) return Fail(local.status());
  if (!(*local)->local()) return Fail(absl::InternalError("the Unix client has no transfer area"));
  // Each case's input as an area tensor filled once in place, as a caller that produces its
  // input straight into the area does (Client::Tensor): a request then moves no input byte
  // before the worker's one copy.
  std::vector<client::AreaTensor> area_inputs;
  const std::string model = "probe";
  {
    client::RegisterOptions reg;
    reg.name = model;
    reg.archive_path = absl::GetFlag(FLAGS_archive);
    reg.batch_size = 1;
    auto registered = (*tcp)->Register(reg);
    if (!registered.ok()) return Fail(registered.status());
  }
  httplib::Client http("127.0.0.1", daemon.http_port());
  http.set_keep_alive(true);
  http.set_tcp_nodelay(true);
  http.set_read_timeout(120, 0);
  const std::string infer_path = "/v2/models/" + model + "/infer";

  // The caller's input as a HostTensor, built before the clock starts when measuring (the
  // caller had it already: building it is not the data path's cost).
  std::optional<proto::HostTensor> staged_input;
  auto take_input = [&](const Case& c) {
    if (staged_input.has_value()) {
      proto::HostTensor t = std::move(*staged_input);
      staged_input.reset();
      return t;
    }
    return proto::HostTensor{"input", proto::DType::F32, c.shape, c.bytes};
  };
  std::vector<Path> paths;
  // The baseline: tensors inside the FlatBuffers frame.
  paths.push_back({"tcp-framed", [&](const Case& c) -> absl::StatusOr<std::vector<uint8_t>> {
                     proto::HostTensor input = take_input(c);
                     auto result = (*tcp)->Infer(model, Inputs(std::move(input)));
                     if (!result.ok()) return result.status();
                     NoteServerSide(*result);
                     if (result->outputs.empty()) return absl::InternalError("no output");
                     return result->outputs[0].data;
                   }});
  paths.back().takes_input = true;
  paths.push_back({"tcp-payload", [&](const Case& c) -> absl::StatusOr<std::vector<uint8_t>> {
                     // Moved in, not through an initializer list (which would copy the bytes).
                     std::vector<proto::HostTensor> inputs;
                     inputs.push_back(take_input(c));
                     auto result = (*tcp_payload)->Infer(model, std::move(inputs));
                     if (!result.ok()) return result.status();
                     NoteServerSide(*result);
                     if (result->outputs.empty()) return absl::InternalError("no output");
                     return result->outputs[0].data;
                   }});
  paths.back().takes_input = true;
  paths.push_back({"http-binary", [&](const Case& c) -> absl::StatusOr<std::vector<uint8_t>> {
                     const std::string header =
                         json{{"inputs", {{{"name", "input"},
                                           {"shape", c.shape},
                                           {"datatype", "FP32"},
                                           {"parameters", {{"binary_data_size", c.bytes.size()}}}}}},
                              {"outputs",
                               {{{"name", "output"}, {"parameters", {{"binary_data", true}}}}}}}
                             .dump();
                     // Sent from the caller's buffers (the header, then the tensor's bytes), as
                     // a client that does not build a body string first does.
                     const size_t total = header.size() + c.bytes.size();
                     auto provide = [&](size_t offset, size_t length, httplib::DataSink& sink) {
                       while (length > 0) {
                         const bool in_header = offset < header.size();
                         const char* from =
                             in_header ? header.data() + offset
                                       : reinterpret_cast<const char*>(c.bytes.data()) +
                                             (offset - header.size());
                         const size_t n = std::min(
                             length, in_header ? header.size() - offset : total - offset);
                         if (!sink.write(from, n)) return false;
                         offset += n;
                         length -= n;
                       }
                       return true;
                     };
                     auto r = http.Post(
                         infer_path,
                         {{"Inference-Header-Content-Length", std::to_string(header.size())}}, total,
                         provide, "application/octet-stream");
                     if (!r) return absl::UnavailableError("HTTP request failed");
                     if (r->status != 200) {
                       return absl::InternalError(absl::StrCat("HTTP ", r->status, ": ", r->body));
                     }
                     NoteServerTiming(r);
                     auto length = r->get_header_value("Inference-Header-Content-Length");
                     size_t json_bytes = 0;
                     if (!absl::SimpleAtoi(length, &json_bytes) || json_bytes > r->body.size()) {
                       return absl::InternalError("bad binary response");
                     }
                     return std::vector<uint8_t>(r->body.begin() + json_bytes, r->body.end());
                   }});

  for (const Case& c : cases) {
    auto t = (*local)->Tensor(c.shape, proto::DType::F32);
    if (!t.ok()) return Fail(t.status());
    std::memcpy(t->data(), c.bytes.data(), c.bytes.size());
    area_inputs.push_back(std::move(*t));
  }
  auto case_index = [&](const Case& c) { return static_cast<size_t>(&c - cases.data()); };
  paths.push_back({"unix-area", [&](const Case& c) -> absl::StatusOr<std::vector<uint8_t>> {
                     auto result = (*local)->InferArea(model, {area_inputs[case_index(c)]});
                     if (!result.ok()) return result.status();
                     NoteServerSide(*result);
                     if (result->outputs.empty()) return absl::InternalError("no output");
                     auto bytes = result->outputs[0].bytes();
                     return std::vector<uint8_t>(bytes.begin(), bytes.end());
                   }});
  // The same over the HostTensor API: the client copies the input into its area once.
  paths.push_back({"unix-copy", [&](const Case& c) -> absl::StatusOr<std::vector<uint8_t>> {
                     proto::HostTensor input = take_input(c);
                     auto result = (*local)->Infer(model, Inputs(std::move(input)));
                     if (!result.ok()) return result.status();
                     NoteServerSide(*result);
                     if (result->outputs.empty()) return absl::InternalError("no output");
                     return result->outputs[0].data;
                   }});
  paths.back().takes_input = true;

  // Triton system shared memory: one /dev/shm segment per case holding its input (filled once,
  // as a Triton client does with set_shared_memory_region), one for the outputs.
  std::vector<ShmSegment> shm_inputs;
  const std::string shm_prefix = absl::StrCat("pswitch-bench-", ::getpid(), "-");
  for (size_t k = 0; k < cases.size(); ++k) {
    auto seg = ShmSegment::Create(absl::StrCat(shm_prefix, "in", k), cases[k].bytes.size());
    if (!seg.ok()) return Fail(seg.status());
    std::memcpy(seg->data(), cases[k].bytes.data(), cases[k].bytes.size());
    shm_inputs.push_back(std::move(*seg));
  }
  auto shm_output = ShmSegment::Create(shm_prefix + "out", 1 << 20);
  if (!shm_output.ok()) return Fail(shm_output.status());
  std::vector<const ShmSegment*> segments;
  for (const ShmSegment& s : shm_inputs) segments.push_back(&s);
  segments.push_back(&*shm_output);
  for (const ShmSegment* seg : segments) {
    auto r = http.Post("/v2/systemsharedmemory/region/" + seg->name() + "/register",
                       json{{"key", "/" + seg->name()}, {"offset", 0}, {"byte_size", seg->size()}}
                           .dump(),
                       "application/json");
    if (!r || r->status != 200) {
      return Fail(absl::InternalError("registering a shared-memory region: " +
                                      (r ? r->body : std::string("no answer"))));
    }
  }
  paths.push_back({"http-shm", [&](const Case& c) -> absl::StatusOr<std::vector<uint8_t>> {
                     const ShmSegment& in = shm_inputs[case_index(c)];
                     const std::string body =
                         json{{"inputs", {{{"name", "input"},
                                           {"shape", c.shape},
                                           {"datatype", "FP32"},
                                           {"parameters",
                                            {{"shared_memory_region", in.name()},
                                             {"shared_memory_byte_size", in.size()}}}}}},
                              {"outputs", {{{"name", "output"},
                                            {"parameters",
                                             {{"shared_memory_region", shm_output->name()},
                                              {"shared_memory_byte_size", shm_output->size()}}}}}}}
                             .dump();
                     auto r = http.Post(infer_path, body, "application/json");
                     if (!r) return absl::UnavailableError("HTTP request failed");
                     if (r->status != 200) {
                       return absl::InternalError(absl::StrCat("HTTP ", r->status, ": ", r->body));
                     }
                     NoteServerTiming(r);
                     // The output's size is in the answer; its bytes are in the segment.
                     const json answer = json::parse(r->body, nullptr, false);
                     if (answer.is_discarded() || !answer.contains("outputs")) {
                       return absl::InternalError("bad answer: " + r->body);
                     }
                     const json& out = answer["outputs"][0];
                     const uint64_t size =
                         out["parameters"]["shared_memory_byte_size"].get<uint64_t>();
                     if (size > shm_output->size()) return absl::InternalError("output too large");
                     return std::vector<uint8_t>(shm_output->data(), shm_output->data() + size);
                   }});

  // The framed path computes the reference answers; it is measured only when asked for.
  const Path reference = paths[0];
  if (const std::string only = absl::GetFlag(FLAGS_paths); !only.empty()) {
    const std::vector<std::string> wanted = absl::StrSplit(only, ',');
    std::vector<Path> kept;
    for (Path& p : paths) {
      if (std::find(wanted.begin(), wanted.end(), p.name) != wanted.end()) kept.push_back(p);
    }
    if (kept.size() != wanted.size()) {
      return Fail(absl::InvalidArgumentError("--paths names an unknown path"));
    }
    paths = std::move(kept);
  }
  // The framed path's answers are the reference every path must match bit for bit.
  for (Case& c : cases) {
    auto out = reference.call(c);
    if (!out.ok()) return Fail(out.status());
    c.expected_output = *out;
  }
  std::fprintf(stderr, "warming up...\n");
  for (int i = 0; i < 3; ++i) {
    for (Path& p : paths) {
      for (const Case& c : cases) {
        auto out = p.call(c);
        if (!out.ok()) return Fail(absl::Status(out.status().code(), p.name + ": " + std::string(out.status().message())));
        if (*out != c.expected_output) {
          return Fail(absl::InternalError(p.name + ": answer differs from the framed path's"));
        }
      }
    }
  }
  std::fprintf(stderr, "measuring %d requests per path and size, interleaved...\n", n);
  std::map<size_t, std::vector<double>> memcpy_ms;
  std::map<size_t, std::vector<double>> loopback_ms;
  auto loopback = LoopbackPair::Create();
  if (!loopback.ok()) return Fail(loopback.status());
  for (const Case& c : cases) (void)(*loopback)->SendMs(c.bytes);  // the receiver's buffer
  std::vector<uint8_t> scratch;
  std::vector<size_t> order(paths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 shuffler(26);
  for (int i = 0; i < n; ++i) {
    for (size_t k = 0; k < cases.size(); ++k) {
      scratch.resize(cases[k].bytes.size());
      std::memset(scratch.data(), 0, scratch.size());  // faulted in: memcpy's best case
      memcpy_ms[k].push_back(MemcpyMs(cases[k], scratch));
      const double bare = (*loopback)->SendMs(cases[k].bytes);
      if (bare < 0) return Fail(absl::InternalError("the loopback baseline's socket failed"));
      loopback_ms[k].push_back(bare);
      // A new order each round (seeded: runs repeat): what a path finds in the caches depends
      // on what ran just before it (the baselines move the same bytes, other paths other bytes),
      // and in a fixed order, or any rotation of one, a path keeps the same predecessor.
      std::shuffle(order.begin(), order.end(), shuffler);
      for (const size_t j : order) {
        Path& p = paths[j];
        if (p.takes_input) {
          staged_input =
              proto::HostTensor{"input", proto::DType::F32, cases[k].shape, cases[k].bytes};
        }
        last_server_side = ServerSide{};
        const absl::Time start = absl::Now();
        auto out = p.call(cases[k]);
        p.ms[k].push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
        // After the clock: what is left of the staged input is freed outside the path's time
        // (unmapping tens of MB takes milliseconds).
        staged_input.reset();
        if (last_server_side.server_ms >= 0) {
          p.server_ms[k].push_back(last_server_side.server_ms);
          p.first_layer_ms[k].push_back(last_server_side.first_layer_ms);
        }
        if (!out.ok()) return Fail(out.status());
        if (*out != cases[k].expected_output) {
          return Fail(absl::InternalError(p.name + ": answer differs from the framed path's"));
        }
      }
    }
  }
  if (absl::GetFlag(FLAGS_keep_dir)) {
    std::fprintf(stderr, "scratch directory kept: %s\n", dir.c_str());
  } else {
    (void)base::RemoveTree(dir.string());
  }

  auto pct = [](const std::vector<double>& v, double q) { return *tools::Percentile(v, q); };
  std::printf(
      "bench-dataplane: %s backend, corner_probe (almost no compute), %d requests per path and "
      "size, interleaved; baseline: tcp-framed and memcpy of the same bytes, same run\n",
      absl::GetFlag(FLAGS_backend).c_str(), n);
  std::printf("%-8s %-12s %9s %9s %8s %14s %12s %10s %15s\n", "MB", "path", "p50_ms", "p99_ms",
              "GB/s", "vs_memcpy+0.2", "vs_framed", "server_ms", "first_layer_ms");
  for (size_t k = 0; k < cases.size(); ++k) {
    const double mb = static_cast<double>(cases[k].bytes.size()) / 1e6;
    const double copy = pct(memcpy_ms[k], 50);
    std::printf("%-8.1f %-12s %9.3f %9.3f %8.2f %14s %12s\n", mb, "memcpy", copy,
                pct(memcpy_ms[k], 99), mb / 1e3 / (copy / 1e3), "", "");
    const double bare = pct(loopback_ms[k], 50);
    std::printf("%-8.1f %-12s %9.3f %9.3f %8.2f %14s %12s\n", mb, "tcp-loopback", bare,
                pct(loopback_ms[k], 99), mb / 1e3 / (bare / 1e3), "", "");
    const bool framed_measured = paths[0].name == "tcp-framed";
    const double framed = framed_measured ? pct(paths[0].ms[k], 50) : 0;
    for (Path& p : paths) {
      const double p50 = pct(p.ms[k], 50);
      // pswitchd's side (p50), where the path's answer tells it.
      auto side = [&](const std::map<size_t, std::vector<double>>& v) {
        auto it = v.find(k);
        return it == v.end() || it->second.empty() ? std::string("-")
                                                   : absl::StrFormat("%.3f", pct(it->second, 50));
      };
      std::printf("%-8.1f %-12s %9.3f %9.3f %8.2f %14.2f %12s %10s %15s\n", mb, p.name.c_str(), p50,
                  pct(p.ms[k], 99), mb / 1e3 / (p50 / 1e3), p50 / (copy + 0.2),
                  framed_measured ? absl::StrFormat("%.2f", p50 / framed).c_str() : "-",
                  side(p.server_ms).c_str(), side(p.first_layer_ms).c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace pswitch

int main(int argc, char** argv) {
  pswitch::tools::ParseToolFlags(
      argc, argv, "Tensor transfer latency per data path against memcpy, in the same run.");
  return pswitch::Run();
}
