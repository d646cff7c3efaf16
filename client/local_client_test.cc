// The client's local path against a fake pswitchd on a real Unix socket. The fake does what the
// contract (docs/dataplane.md) gives pswitchd and its worker to do: it checks each area's seal,
// maps it, reads inputs from its own mapping at the slices the request names, and writes outputs
// into the slice `outputs_to` names. So these tests prove the client side alone: bytes written
// into an area tensor reach the peer with no copy (the request carries only the slice), results
// are views of the area, and named files travel as fds.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/unique_fd.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/client_generated.h"
#include "proto/frame_channel.h"
#include "proto/framing.h"

namespace pswitch::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Builder = flatbuffers::FlatBufferBuilder;

// One frame and every fd that came with it.
struct Frame {
  std::vector<uint8_t> payload;
  std::vector<UniqueFd> fds;
};

// Reads exactly `n` bytes, keeping any fds that arrive; false when the peer closed.
bool ReadExactly(int fd, uint8_t* out, size_t n, std::vector<UniqueFd>* fds) {
  size_t got = 0;
  while (got < n) {
    iovec iov{out + got, n - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->emplace_back(passed);
      }
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

bool ReadFrame(int fd, Frame* frame) {
  uint8_t header[4];
  if (!ReadExactly(fd, header, 4, &frame->fds)) return false;
  const uint32_t length =
      header[0] | header[1] << 8 | header[2] << 16 | static_cast<uint32_t>(header[3]) << 24;
  frame->payload.resize(length);
  return ReadExactly(fd, frame->payload.data(), length, &frame->fds);
}

struct MappedArea {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  int seals = 0;
};

// What the fake saw, for the tests to check.
struct Seen {
  std::vector<MappedArea> areas;
  std::vector<proto::HostTensor> inputs;  // of the last SubmitTask
  std::vector<float> input_values;        // read from its own mapping
  proto::Place outputs_place = proto::Place::Inline;
  proto::ByteSlice outputs_to;
  size_t submit_frame_bytes = 0;
  std::vector<proto::FileRole> roles;
  std::vector<std::string> passed_contents;  // what each passed fd read
  std::vector<bool> passed_writable;
};

// pswitchd as the contract describes it, for one model "double" (F32 [-1, 4]: y = 2x) and
// "hostile", whose answers put its output outside the space it was given.
class FakePswitchd {
 public:
  FakePswitchd() {
    dir_ = ::testing::TempDir() + "/pswitch-client-XXXXXX";
    EXPECT_NE(::mkdtemp(dir_.data()), nullptr);
    path_ = dir_ + "/pswitchd.sock";
    listener_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_.get(), 8), 0);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakePswitchd() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    acceptor_.join();
    {
      absl::MutexLock lock(&mu_);
      for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : servers_) t.join();
    for (const MappedArea& a : seen_.areas) ::munmap(a.data, a.bytes);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  const std::string& path() const { return path_; }
  const std::string& dir() const { return dir_; }
  Seen seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  void RefuseFills() { refuse_fills_ = true; }
  // Model "slow" is answered only once this is called (bounded: 10 s).
  void ReleaseSlow() { slow_.Notify(); }
  // The next ListModels is answered by closing the connection (the server going away).
  void CloseOnList() { close_on_list_ = true; }

 private:
  void AcceptLoop() {
    while (true) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      absl::MutexLock lock(&mu_);
      connections_.push_back(fd);
      servers_.emplace_back([this, fd] { Serve(UniqueFd(fd)); });
    }
  }

  void Forget(int fd) {
    absl::MutexLock lock(&mu_);
    std::erase(connections_, fd);
  }

  void Reply(int fd, Builder& b) {
    auto frame = proto::EncodeFrame(b);
    ASSERT_TRUE(frame.ok());
    ASSERT_TRUE(proto::SendAllWithFd(fd, *frame, -1).ok());
  }

  void ReplyError(int fd, uint64_t id, proto::ErrorCode code, const std::string& message) {
    Builder b;
    auto error = proto::CreateError(b, code, b.CreateString(message));
    proto::Finish(
        b, proto::CreateControllerReply(b, id, proto::ControllerReplyBody::Error, error.Union()));
    Reply(fd, b);
  }

  void Serve(UniqueFd fd) {
    std::map<uint64_t, MappedArea> areas;  // this connection's, by id
    Frame frame;
    while (ReadFrame(fd.get(), &frame)) {
      auto request = proto::VerifyPayload<proto::ClientRequest>(frame.payload, "request");
      ASSERT_TRUE(request.ok());
      const uint64_t id = (*request)->request_id();
      Builder b;
      switch ((*request)->body_type()) {
        case proto::ClientRequestBody::RegisterArea: {
          ASSERT_EQ(frame.fds.size(), 1u);
          MappedArea area;
          area.bytes = (*request)->body_as_RegisterArea()->bytes();
          area.seals = ::fcntl(frame.fds[0].get(), F_GET_SEALS);
          if (area.seals < 0 || (area.seals & F_SEAL_SHRINK) == 0) {
            ReplyError(fd.get(), id, proto::ErrorCode::FailedPrecondition, "not sealed");
            break;
          }
          void* data = ::mmap(nullptr, area.bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                              frame.fds[0].get(), 0);
          ASSERT_NE(data, MAP_FAILED);
          area.data = static_cast<uint8_t*>(data);
          const uint64_t area_id = next_area_++;
          areas[area_id] = area;
          {
            absl::MutexLock lock(&mu_);
            seen_.areas.push_back(area);
          }
          auto body = proto::CreateAreaRegistered(b, area_id, area.bytes);
          proto::Finish(b, proto::CreateControllerReply(
                               b, id, proto::ControllerReplyBody::AreaRegistered, body.Union()));
          Reply(fd.get(), b);
          break;
        }
        case proto::ClientRequestBody::ListModels: {
          if (close_on_list_) {
            Forget(fd.get());
            return;
          }
          std::vector<flatbuffers::Offset<proto::ModelInfo>> models;
          for (const char* name : {"double", "hostile", "slow"}) {
            models.push_back(proto::CreateModelInfo(b, b.CreateString(name), b.CreateString("fake"),
                                                    0, proto::DType::F32,
                                                    b.CreateVector<int64_t>({-1, 4})));
          }
          auto body = proto::CreateModelList(b, b.CreateVector(models));
          proto::Finish(b, proto::CreateControllerReply(
                               b, id, proto::ControllerReplyBody::ModelList, body.Union()));
          Reply(fd.get(), b);
          break;
        }
        case proto::ClientRequestBody::SubmitTask:
          Submit(fd.get(), id, *(*request)->body_as_SubmitTask(), areas, frame.payload.size());
          break;
        case proto::ClientRequestBody::RegisterModel:
        case proto::ClientRequestBody::FillSubmit: {
          RecordFiles(**request, frame.fds);
          if ((*request)->body_type() == proto::ClientRequestBody::FillSubmit && refuse_fills_) {
            ReplyError(fd.get(), id, proto::ErrorCode::InvalidArgument, "no such model");
            break;
          }
          if ((*request)->body_type() == proto::ClientRequestBody::RegisterModel) {
            auto body = proto::CreateRegistered(b, b.CreateString("m"), 3, 1, 12);
            proto::Finish(b, proto::CreateControllerReply(
                                 b, id, proto::ControllerReplyBody::Registered, body.Union()));
          } else {
            auto body = proto::CreateFillStatus(b, 9);
            proto::Finish(b, proto::CreateControllerReply(
                                 b, id, proto::ControllerReplyBody::FillStatus, body.Union()));
          }
          Reply(fd.get(), b);
          break;
        }
        default:
          ReplyError(fd.get(), id, proto::ErrorCode::Unimplemented, "not in the fake");
      }
      frame = Frame();
    }
    Forget(fd.get());
  }

  void RecordFiles(const proto::ClientRequest& request, const std::vector<UniqueFd>& fds) {
    absl::MutexLock lock(&mu_);
    seen_.roles.clear();
    seen_.passed_contents.clear();
    seen_.passed_writable.clear();
    if (request.passed_files() != nullptr) {
      for (auto role : *request.passed_files()) seen_.roles.push_back(role);
    }
    for (const UniqueFd& f : fds) {
      char buffer[256] = {};
      const ssize_t n = ::pread(f.get(), buffer, sizeof(buffer) - 1, 0);
      seen_.passed_contents.emplace_back(n > 0 ? std::string(buffer, n) : "");
      seen_.passed_writable.push_back((::fcntl(f.get(), F_GETFL) & O_ACCMODE) == O_WRONLY);
      if (seen_.passed_writable.back()) (void)!::write(f.get(), "written by the job", 18);
    }
  }

  void Submit(int fd, uint64_t id, const proto::SubmitTask& task,
              const std::map<uint64_t, MappedArea>& areas, size_t frame_bytes) {
    auto inputs = proto::FromWireTensors(task.inputs());
    ASSERT_TRUE(inputs.ok());
    std::vector<float> values;
    for (const proto::HostTensor& t : *inputs) {
      if (t.place == proto::Place::Inline) {  // the framed path (areas full)
        const auto* x = reinterpret_cast<const float*>(t.data.data());
        values.assign(x, x + t.data.size() / sizeof(float));
        continue;
      }
      ASSERT_EQ(t.place, proto::Place::Region);
      auto area = areas.find(t.slice.region);
      ASSERT_NE(area, areas.end());
      ASSERT_LE(t.slice.offset + t.slice.length, area->second.bytes);
      const float* x = reinterpret_cast<const float*>(area->second.data + t.slice.offset);
      values.assign(x, x + t.slice.length / sizeof(float));
    }
    const proto::Slice* to = task.outputs_to();
    {
      absl::MutexLock lock(&mu_);
      seen_.inputs = *inputs;
      seen_.input_values = values;
      seen_.outputs_place = task.outputs_place();
      seen_.outputs_to =
          to ? proto::ByteSlice{to->region(), to->offset(), to->length()} : proto::ByteSlice{};
      seen_.submit_frame_bytes = frame_bytes;
    }
    Builder accepted;
    proto::Finish(accepted, proto::CreateControllerReply(
                                accepted, id, proto::ControllerReplyBody::TaskAccepted,
                                proto::CreateTaskAccepted(accepted, 77).Union()));
    Reply(fd, accepted);
    if (task.model()->str() == "slow") slow_.WaitForNotificationWithTimeout(absl::Seconds(10));
    if (task.outputs_place() == proto::Place::Inline) {
      proto::HostTensor out;
      out.name = "output";
      out.shape = {static_cast<int64_t>(values.size() / 4), 4};
      out.data.resize(values.size() * sizeof(float));
      auto* y = reinterpret_cast<float*>(out.data.data());
      for (size_t i = 0; i < values.size(); ++i) y[i] = 2 * values[i];
      Builder b;
      auto body = proto::CreateTaskResult(b, 77, proto::CreateWireTensors(b, {out}));
      proto::Finish(b, proto::CreateControllerReply(b, id, proto::ControllerReplyBody::TaskResult,
                                                    body.Union()));
      return Reply(fd, b);
    }
    ASSERT_EQ(task.outputs_place(), proto::Place::Region);
    ASSERT_NE(to, nullptr);
    const uint64_t out_bytes = values.size() * sizeof(float);
    ASSERT_GE(to->length(), out_bytes);
    auto area = areas.find(to->region());
    ASSERT_NE(area, areas.end());
    float* y = reinterpret_cast<float*>(area->second.data + to->offset());
    for (size_t i = 0; i < values.size(); ++i) y[i] = 2 * values[i];
    const bool hostile = task.model()->str() == "hostile";
    proto::HostTensor out;
    out.name = "output";
    out.dtype = proto::DType::F32;
    out.shape = {static_cast<int64_t>(values.size() / 4), 4};
    out.place = proto::Place::Region;
    out.slice = {to->region(), to->offset() + (hostile ? to->length() : 0), out_bytes};
    Builder b;
    auto outputs = proto::CreateWireTensors(b, {out});
    auto body = proto::CreateTaskResult(b, 77, outputs, 1234);
    proto::Finish(b, proto::CreateControllerReply(b, id, proto::ControllerReplyBody::TaskResult,
                                                  body.Union()));
    Reply(fd, b);
  }

  std::string dir_;
  std::string path_;
  UniqueFd listener_;
  std::atomic<uint64_t> next_area_{100};
  std::atomic<bool> refuse_fills_{false};
  std::atomic<bool> close_on_list_{false};
  absl::Notification slow_;
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> servers_;
  Seen seen_ ABSL_GUARDED_BY(mu_);
};

ClientOptions SmallAreas() {
  ClientOptions o;
  o.timeout = absl::Seconds(20);
  o.areas.first_area_bytes = 1 << 20;
  o.areas.max_areas = 4;
  o.areas.max_total_bytes = 8 << 20;
  return o;
}

std::unique_ptr<Client> ConnectTo(const FakePswitchd& server, ClientOptions o = SmallAreas()) {
  auto client = Client::Connect("unix:" + server.path(), o);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

TEST(LocalClientTest, UnixAddressRegistersOneSealedAreaOnConnecting) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->local());
  Seen seen = server.seen();
  ASSERT_EQ(seen.areas.size(), 1u);
  EXPECT_EQ(seen.areas[0].bytes, 1u << 20);
  EXPECT_NE(seen.areas[0].seals & F_SEAL_SHRINK, 0);
  EXPECT_EQ(client->areas()->area_count(), 1u);
}

TEST(LocalClientTest, AnAreaTensorIsSentAsItsOwnSliceNotCopied) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  // 64 rows: 1 KiB of input. The request must name the tensor's own bytes, not carry them.
  auto x = client->Tensor({64, 4}, proto::DType::F32);
  ASSERT_TRUE(x.ok()) << x.status();
  auto* values = reinterpret_cast<float*>(x->data());
  for (int i = 0; i < 256; ++i) values[i] = static_cast<float>(i) * 0.5f;
  const proto::ByteSlice own = x->Descriptor().slice;

  auto result = client->InferArea("double", {*x});
  ASSERT_TRUE(result.ok()) << result.status();
  Seen seen = server.seen();
  ASSERT_EQ(seen.inputs.size(), 1u);
  EXPECT_EQ(seen.inputs[0].place, proto::Place::Region);
  EXPECT_EQ(seen.inputs[0].slice, own);
  EXPECT_TRUE(seen.inputs[0].data.empty());
  EXPECT_LT(seen.submit_frame_bytes, 1024u);  // the descriptors only
  // The peer read, from its own mapping, exactly what was written in place.
  ASSERT_EQ(seen.input_values.size(), 256u);
  EXPECT_EQ(seen.input_values[255], 127.5f);
  EXPECT_EQ(result->sent_inputs[0].slice, own);

  // The output space was sized from the model's spec: [-1, 4] F32 at the input's batch.
  EXPECT_EQ(seen.outputs_place, proto::Place::Region);
  EXPECT_EQ(seen.outputs_to.length, 64u * 4 * 4);
  EXPECT_EQ(seen.outputs_to.offset % kAreaAlignment, 0u);
  // The output is a view of the area, where the peer wrote it.
  ASSERT_EQ(result->outputs.size(), 1u);
  const AreaTensor& y = result->outputs[0];
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(y.Descriptor().slice.offset, seen.outputs_to.offset);
  const auto* out = reinterpret_cast<const float*>(y.data());
  EXPECT_EQ(out[255], 255.0f);
  EXPECT_EQ(result->task_id, 77u);
  EXPECT_EQ(result->latency, absl::Microseconds(1234));
}

TEST(LocalClientTest, ResultViewsHoldTheirSpanUntilTheLastIsGone) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  AreaAllocator& areas = *client->areas();
  auto x = client->Tensor({2, 4}, proto::DType::F32);
  ASSERT_TRUE(x.ok());
  const uint64_t with_input = areas.allocated_bytes();
  AreaTensor kept;
  {
    auto result = client->InferArea("double", {*x});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_GT(areas.allocated_bytes(), with_input);
    kept = result->outputs[0];  // a copy of the view shares its span
  }
  EXPECT_GT(areas.allocated_bytes(), with_input);
  EXPECT_EQ(areas.Find(kept.data(), kept.length()), kept.span());
  proto::HostTensor copied = kept.ToHost();
  kept = AreaTensor();
  EXPECT_EQ(areas.allocated_bytes(), with_input);  // the output's span went back
  EXPECT_EQ(copied.data.size(), 32u);
}

TEST(LocalClientTest, HostTensorInferCopiesOnceIntoTheArea) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  proto::HostTensor x;
  x.name = "input";
  x.shape = {3, 4};
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = static_cast<float>(i + 1);
  x.data.resize(48);
  std::memcpy(x.data.data(), v.data(), 48);
  auto result = client->Infer("double", {x});
  ASSERT_TRUE(result.ok()) << result.status();
  Seen seen = server.seen();
  EXPECT_EQ(seen.inputs[0].place, proto::Place::Region);
  EXPECT_EQ(seen.input_values, v);
  ASSERT_EQ(result->outputs.size(), 1u);
  EXPECT_EQ(result->outputs[0].place, proto::Place::Inline);
  const auto* y = reinterpret_cast<const float*>(result->outputs[0].data.data());
  EXPECT_EQ(y[11], 24.0f);
  EXPECT_EQ(client->areas()->allocated_bytes(), 0u);  // nothing held once copied out
}

TEST(LocalClientTest, ATimedOutCallHoldsItsSpansUntilTheFinalAnswer) {
  FakePswitchd server;
  ClientOptions o = SmallAreas();
  o.timeout = absl::Milliseconds(100);  // the fake holds "slow"'s answer until released
  auto client = ConnectTo(server, o);
  ASSERT_NE(client, nullptr);
  AreaAllocator& areas = *client->areas();
  {
    auto x = client->Tensor({2, 4}, proto::DType::F32);
    ASSERT_TRUE(x.ok());
    auto result = client->InferArea("slow", {*x});
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  // The caller let go of the input, but the worker may still read it and write the output: the
  // call keeps both spans away from other callers.
  EXPECT_EQ(areas.allocated_bytes(), 2 * kAreaAlignment);  // input and output, 32 bytes each
  server.ReleaseSlow();
  // Replies come in order on the connection: once a later call's is back, the late TaskResult
  // has been handled and its spans returned. (The async form's wait is this test's own.)
  auto later = client->InferAreaAsync("double", {*client->Tensor({1, 4}, proto::DType::F32)});
  ASSERT_EQ(later.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  ASSERT_TRUE(later.get().ok());
  EXPECT_EQ(areas.allocated_bytes(), 0u);
}

TEST(LocalClientTest, HostTensorInferSendsTheFrameWhenTheAreasAreFull) {
  FakePswitchd server;
  ClientOptions o = SmallAreas();
  o.areas.max_areas = 1;
  auto client = ConnectTo(server, o);
  ASSERT_NE(client, nullptr);
  proto::HostTensor x;
  x.name = "input";
  x.shape = {2, 4};
  x.data.resize(32);
  for (int i = 0; i < 8; ++i) reinterpret_cast<float*>(x.data.data())[i] = static_cast<float>(i);
  // The input fits in what is left, its output does not: neither goes in the area.
  auto hog = client->Tensor({(1 << 20) / 4 - 16}, proto::DType::F32);
  ASSERT_TRUE(hog.ok()) << hog.status();
  auto result = client->Infer("double", {x});
  ASSERT_TRUE(result.ok()) << result.status();
  Seen seen = server.seen();
  EXPECT_EQ(seen.inputs[0].place, proto::Place::Inline);
  EXPECT_EQ(seen.outputs_place, proto::Place::Inline);
  EXPECT_EQ(reinterpret_cast<const float*>(result->outputs[0].data.data())[7], 14.0f);
  // Area calls say why they cannot run.
  EXPECT_EQ(client->Tensor({64}, proto::DType::F32).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(LocalClientTest, AnOutputOutsideTheGivenSpaceIsRefused) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  auto x = client->Tensor({1, 4}, proto::DType::F32);
  ASSERT_TRUE(x.ok());
  auto result = client->InferArea("hostile", {*x});
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(result.status().message(), HasSubstr("outside the space"));
}

TEST(LocalClientTest, FullAreasGrowThenStopAtTheBound) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  std::vector<AreaTensor> held;
  for (int i = 0; i < 3; ++i) {
    auto t = client->Tensor({(1 << 20) / 4}, proto::DType::F32);  // 1 MiB each
    ASSERT_TRUE(t.ok()) << t.status();
    held.push_back(*t);
  }
  EXPECT_EQ(server.seen().areas.size(), 3u);
  held.push_back(*client->Tensor({1}, proto::DType::F32));  // a 4th, the last one allowed
  auto over = client->Tensor({(1 << 20) / 4}, proto::DType::F32);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("4 areas"));
}

TEST(LocalClientTest, ALostConnectionStopsNewAreaTensors) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  auto x = client->Tensor({1, 4}, proto::DType::F32);
  ASSERT_TRUE(x.ok());
  server.CloseOnList();
  // The reader closes the areas before it fails the calls in flight, so once this fails no
  // span can be handed out for ids pswitchd no longer knows.
  auto status = client->ListModels();
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable);
  auto y = client->Tensor({1, 4}, proto::DType::F32);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kUnavailable) << y.status();
  std::memset(x->data(), 0, x->length());  // what was handed out stays mapped
}

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

TEST(LocalClientTest, RegisterPassesTheNamedFilesAsFds) {
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  RegisterOptions o;
  o.name = "m";
  o.weights_path = WriteFile(server.dir() + "/w.safetensors", "weights bytes");
  o.archive_path = WriteFile(server.dir() + "/m.pswitch.pt", "archive bytes");
  o.plan = WriteFile(server.dir() + "/plan.json", "{\"plan\": 1}");
  auto registered = client->Register(o);
  ASSERT_TRUE(registered.ok()) << registered.status();
  Seen seen = server.seen();
  EXPECT_THAT(seen.roles, ElementsAre(proto::FileRole::Weights, proto::FileRole::Archive,
                                      proto::FileRole::Plan));
  EXPECT_THAT(seen.passed_contents, ElementsAre("weights bytes", "archive bytes", "{\"plan\": 1}"));

  o.weights_path = server.dir() + "/missing.safetensors";
  auto missing = client->Register(o);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.safetensors"));
  o.weights_path = server.dir();  // a directory is not a weights file
  EXPECT_EQ(client->Register(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalClientTest, FillPassesItsDatasetAndANewOutputFile) {
  // The default over the Unix socket.
  FakePswitchd server;
  auto client = ConnectTo(server);
  ASSERT_NE(client, nullptr);
  FillJobOptions o;
  o.kind = FillKind::kInference;
  o.model = "m";
  o.dataset_path = WriteFile(server.dir() + "/rows.safetensors", "rows");
  o.output_path = server.dir() + "/out.safetensors";
  auto job = client->SubmitFill(o);
  ASSERT_TRUE(job.ok()) << job.status();
  Seen seen = server.seen();
  EXPECT_THAT(seen.roles, ElementsAre(proto::FileRole::Dataset, proto::FileRole::Output));
  EXPECT_THAT(seen.passed_writable, ElementsAre(false, true));
  std::ifstream written(o.output_path);
  std::string text((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "written by the job");
  // An existing output is never replaced.
  EXPECT_EQ(client->SubmitFill(o).status().code(), absl::StatusCode::kAlreadyExists);
  // A refused job leaves no file behind.
  server.RefuseFills();
  o.output_path = server.dir() + "/refused.safetensors";
  EXPECT_FALSE(client->SubmitFill(o).ok());
  EXPECT_NE(::access(o.output_path.c_str(), F_OK), 0);
  ::unlink((server.dir() + "/out.safetensors").c_str());
  ::unlink((server.dir() + "/rows.safetensors").c_str());
}

TEST(LocalClientTest, FillFilesAreNamedWhenPassingIsOff) {
  // Off, they travel as names under pswitchd's --data-root, as over TCP.
  FakePswitchd server;
  ClientOptions options = SmallAreas();
  options.pass_fill_files = false;
  auto client = ConnectTo(server, options);
  ASSERT_NE(client, nullptr);
  FillJobOptions o;
  o.kind = FillKind::kInference;
  o.model = "m";
  o.dataset_path = "rows.safetensors";
  o.output_path = server.dir() + "/not-created-here.safetensors";
  ASSERT_TRUE(client->SubmitFill(o).ok());
  EXPECT_TRUE(server.seen().roles.empty());
  EXPECT_TRUE(server.seen().passed_contents.empty());
  EXPECT_NE(::access(o.output_path.c_str(), F_OK), 0);
}

TEST(LocalClientTest, LocalAddressesUseTheDefaultUnixSocket) {
  FakePswitchd server;
  ::setenv("PSWITCH_UNIX_SOCKET", server.path().c_str(), 1);
  for (const char* address : {"", "127.0.0.1:7300", "localhost:7300", "[::1]:7300"}) {
    auto client = Client::Connect(address, SmallAreas());
    ASSERT_TRUE(client.ok()) << address << ": " << client.status();
    EXPECT_TRUE((*client)->local()) << address;
  }
  // Forced TCP, or another port (maybe another pswitchd), never takes the Unix socket: with
  // nothing listening on TCP port 1, those connects fail.
  ClientOptions tcp = SmallAreas();
  tcp.transport = Transport::kTcp;
  EXPECT_FALSE(Client::Connect("127.0.0.1:1", SmallAreas()).ok());
  EXPECT_FALSE(Client::Connect("127.0.0.1:1", tcp).ok());
  EXPECT_EQ(Client::Connect("unix:" + server.path(), tcp).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.seen().areas.size(), 4u);
  // The variable, when set, is the only place looked at.
  ::setenv("PSWITCH_UNIX_SOCKET", (server.dir() + "/nobody.sock").c_str(), 1);
  EXPECT_THAT(DefaultUnixSocketPaths(), ElementsAre(server.dir() + "/nobody.sock"));
  // Without the variable: the system's socket, then this user's own pswitchd's.
  ::unsetenv("PSWITCH_UNIX_SOCKET");
  const std::string runtime = server.dir() + "/xdg";
  ASSERT_EQ(::mkdir(runtime.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((runtime + "/pswitch").c_str(), 0700), 0);
  ASSERT_EQ(::symlink(server.path().c_str(), (runtime + "/pswitch/pswitchd.sock").c_str()), 0);
  const char* saved = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved_runtime = saved != nullptr ? saved : "";
  ::setenv("XDG_RUNTIME_DIR", runtime.c_str(), 1);
  EXPECT_THAT(DefaultUnixSocketPaths(),
              ElementsAre("/run/pswitch/pswitchd.sock", runtime + "/pswitch/pswitchd.sock"));
  auto own = Client::Connect("", SmallAreas());
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE((*own)->local());
  own->reset();
  if (saved != nullptr) {
    ::setenv("XDG_RUNTIME_DIR", saved_runtime.c_str(), 1);
  } else {
    ::unsetenv("XDG_RUNTIME_DIR");
  }
  ::unlink((runtime + "/pswitch/pswitchd.sock").c_str());
  ::rmdir((runtime + "/pswitch").c_str());
  ::rmdir(runtime.c_str());
}

TEST(LocalClientTest, AreaCallsNeedTheUnixSocket) {
  // A TCP client (a listening socket nobody answers is enough to connect).
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  auto client = Client::Connect(absl::StrCat("127.0.0.1:", ntohs(addr.sin_port)), SmallAreas());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->local());
  EXPECT_EQ((*client)->areas(), nullptr);
  EXPECT_EQ((*client)->Tensor({1}, proto::DType::F32).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pswitch::client
