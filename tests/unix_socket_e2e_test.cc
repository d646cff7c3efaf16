// End-to-end: pswitchd's local path (issue 26 item 1, server side), spoken byte by byte over
// its Unix socket as a hostile local client would: transfer areas passed as memfds, inference
// whose tensors lie in an area (bit-identical to the framed path), descriptors that point
// elsewhere, the bounds on registrations, files passed by fd, and who a local peer is when it
// presents no token (the Unix socket's SO_PEERCRED, loopback TCP's socket owner).
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/registry.h"
#include "models/weights.h"
#include "models/zoo_model.h"
#include "proto/client_generated.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"
#include "tests/controller_replies.h"
#include "tests/e2e_helpers.h"
#include "tests/raw_socket.h"
#include "tests/test_daemon.h"

namespace pswitch {
namespace {

using e2e::Input;
using e2e::TestDaemon;
using e2e::TokenFile;
using ::testing::HasSubstr;
using ::testing::Not;
using Builder = flatbuffers::FlatBufferBuilder;
using proto::ClientRequestBody;
using proto::ControllerReplyBody;
using testing::ErrorCode;
using testing::ErrorMessage;
using testing::Reply;

constexpr absl::Duration kReplyTimeout = absl::Seconds(60);

// One raw connection (Unix or TCP): frames out, optionally with fds; replies in, each kept as
// its verified bytes.
class RawConnection {
 public:
  static std::optional<RawConnection> Unix(const std::string& path) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    if (!fd.valid() ||
        ::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      return std::nullopt;
    }
    return RawConnection(std::move(fd));
  }
  static std::optional<RawConnection> Tcp(int port) {
    UniqueFd fd(testing::ConnectLoopback(port));
    if (!fd.valid()) return std::nullopt;
    return RawConnection(std::move(fd));
  }

  // Sends the finished request in `b` with `fds` attached to its first byte.
  bool Send(const Builder& b, const std::vector<int>& fds = {}) {
    auto frame = proto::EncodeFrame(b);
    if (!frame.ok()) return false;
    iovec iov{frame->data(), frame->size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)));
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
    }
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (n < 0) return false;
    // The rest (a large frame) without the fds, which went with the first byte.
    return testing::SendAll(fd_.get(),
                            absl::string_view(reinterpret_cast<const char*>(frame->data() + n),
                                              frame->size() - static_cast<size_t>(n)));
  }

  // The next reply's payload, or empty when none came within the timeout (or the peer closed).
  std::vector<uint8_t> Next(absl::Duration timeout = kReplyTimeout) {
    const absl::Time deadline = absl::Now() + timeout;
    uint8_t header[4];
    if (!testing::ReadExactly(fd_.get(), header, 4, deadline)) return {};
    const uint32_t length =
        header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<uint32_t>(header[3]) << 24);
    std::vector<uint8_t> payload(length);
    if (!testing::ReadExactly(fd_.get(), payload.data(), length, deadline)) return {};
    return payload;
  }

  // Sends and returns the first reply (replies come in request order on one connection).
  std::vector<uint8_t> Call(const Builder& b, const std::vector<int>& fds = {}) {
    if (!Send(b, fds)) return {};
    return Next();
  }

  int fd() const { return fd_.get(); }

 private:
  explicit RawConnection(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};




void RegisterAreaRequest(Builder& b, uint64_t id, uint64_t bytes) {
  auto body = proto::CreateRegisterArea(b, bytes);
  proto::Finish(b,
                proto::CreateClientRequest(b, id, ClientRequestBody::RegisterArea, body.Union()));
}

void ReleaseAreaRequest(Builder& b, uint64_t id, uint64_t area) {
  auto body = proto::CreateReleaseArea(b, area);
  proto::Finish(b, proto::CreateClientRequest(b, id, ClientRequestBody::ReleaseArea, body.Union()));
}

// An inference of `model` on `inputs`; outputs inline, or (`outputs_to`) in that region slice.
void SubmitRequest(Builder& b, uint64_t id, const std::string& model,
                   const std::vector<proto::HostTensor>& inputs,
                   std::optional<proto::ByteSlice> outputs_to = std::nullopt) {
  auto tensors = proto::CreateWireTensors(b, inputs);
  auto name = b.CreateString(model);
  const proto::Slice to =
      outputs_to ? proto::Slice(outputs_to->region, outputs_to->offset, outputs_to->length)
                 : proto::Slice();
  auto body = proto::CreateSubmitTask(
      b, name, proto::TaskKind::Inference, tensors, 1, 0, 0, 0, proto::Optimizer::Sgd, 0.01, 0.9, 0,
      0, outputs_to ? proto::Place::Region : proto::Place::Inline, outputs_to ? &to : nullptr);
  proto::Finish(b, proto::CreateClientRequest(b, id, ClientRequestBody::SubmitTask, body.Union()));
}

void ListModelsRequest(Builder& b, uint64_t id) {
  auto body = proto::CreateListModels(b);
  proto::Finish(b, proto::CreateClientRequest(b, id, ClientRequestBody::ListModels, body.Union()));
}

// A transfer area as a client makes one: a memfd (sealed against shrinking unless `sealed` is
// false), mapped shared.
struct Area {
  explicit Area(size_t size, bool sealed = true) : bytes(size) {
    fd = UniqueFd(::memfd_create("unix-socket-e2e-area", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
    if (sealed) {
      EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    memory = static_cast<uint8_t*>(p);
  }
  ~Area() {
    if (memory != nullptr) ::munmap(memory, bytes);
  }
  Area(const Area&) = delete;
  Area& operator=(const Area&) = delete;

  UniqueFd fd;
  size_t bytes;
  uint8_t* memory = nullptr;
};

// Registers `area` on `conn`; its id, or 0 with the refusal in `*error`.
uint64_t Register(RawConnection& conn, const Area& area, uint64_t id,
                  absl::StatusCode* error = nullptr) {
  Builder b;
  RegisterAreaRequest(b, id, area.bytes);
  std::vector<uint8_t> reply = conn.Call(b, {area.fd.get()});
  if (error != nullptr) *error = ErrorCode(reply);
  const proto::ControllerReply* r = Reply(reply);
  if (r == nullptr || r->body_type() != ControllerReplyBody::AreaRegistered) return 0;
  EXPECT_EQ(r->body_as_AreaRegistered()->bytes(), area.bytes);
  return r->body_as_AreaRegistered()->area();
}

// The input as a Region slice at `offset` of `area` (its bytes written there).
proto::HostTensor PlaceIn(Area& area, uint64_t area_id, uint64_t offset,
                          const proto::HostTensor& inline_tensor) {
  std::memcpy(area.memory + offset, inline_tensor.data.data(), inline_tensor.data.size());
  proto::HostTensor placed = inline_tensor;
  placed.data.clear();
  placed.place = proto::Place::Region;
  placed.slice = proto::ByteSlice{area_id, offset, inline_tensor.data.size()};
  return placed;
}

// Submits and waits for the result: the TaskResult's outputs, or the refusal's code.
struct Outcome {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;
  std::vector<proto::HostTensor> outputs;
};
Outcome Infer(RawConnection& conn, uint64_t id, const std::string& model,
              const std::vector<proto::HostTensor>& inputs,
              std::optional<proto::ByteSlice> outputs_to = std::nullopt) {
  Builder b;
  SubmitRequest(b, id, model, inputs, outputs_to);
  std::vector<uint8_t> first = conn.Call(b);
  Outcome out;
  out.code = ErrorCode(first);
  out.message = ErrorMessage(first);
  if (out.code != absl::StatusCode::kOk) return out;
  EXPECT_EQ(Reply(first)->body_type(), ControllerReplyBody::TaskAccepted);
  std::vector<uint8_t> second = conn.Next();
  out.code = ErrorCode(second);
  out.message = ErrorMessage(second);
  if (out.code != absl::StatusCode::kOk) return out;
  const proto::ControllerReply* r = Reply(second);
  EXPECT_EQ(r->body_type(), ControllerReplyBody::TaskResult);
  auto outputs = proto::FromWireTensors(r->body_as_TaskResult()->outputs());
  EXPECT_TRUE(outputs.ok()) << outputs.status();
  if (outputs.ok()) out.outputs = *std::move(outputs);
  return out;
}

// How many of `pid`'s fds are this test's areas (memfds named "unix-socket-e2e-area"): what
// pswitchd holds for them, whatever else it opens or closes meanwhile.
size_t AreaFds(pid_t pid) {
  size_t n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.find("memfd:unix-socket-e2e-area") != std::string::npos) ++n;
  }
  return n;
}

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = e2e::BackendSkipReason(gpu::Backend::kHost); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
  static std::string SocketOf(const TestDaemon& daemon) {
    // --unix-socket=auto puts it beside the memdaemon socket, in the test's directory.
    return (daemon.dir() / "pswitchd.sock").string();
  }
};

TEST_F(UnixSocketTest, TheSocketIs0660AndRemovedOnExit) {
  std::optional<std::string> path;
  {
    TestDaemon daemon({"--preload="});
    ASSERT_GT(daemon.port(), 0) << daemon.log();
    path = SocketOf(daemon);
    struct stat st;
    ASSERT_EQ(::lstat(path->c_str(), &st), 0) << daemon.log();
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0660u);
    EXPECT_THAT(daemon.log(), HasSubstr("unix_socket=" + *path));
    EXPECT_EQ(daemon.Terminate() & 0x7f, 0);
    EXPECT_NE(::lstat(path->c_str(), &st), 0);
  }
}

// The local default: inputs written in place in an area, the output written into the area by
// the worker, the bytes identical to the framed path's inline answer (over TCP and the socket).
TEST_F(UnixSocketTest, InferenceInAnAreaIsBitIdenticalToTheFramedPath) {
  TestDaemon daemon({"--preload=tiny_cnn"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto conn = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(conn.has_value());
  auto tcp = RawConnection::Tcp(daemon.port());
  ASSERT_TRUE(tcp.has_value());

  // ListModels names the output's dtype and shape (-1: the batch), from which clients size it.
  Builder list;
  ListModelsRequest(list, 1);
  const std::vector<uint8_t> models = conn->Call(list);
  ASSERT_NE(Reply(models), nullptr);
  ASSERT_EQ(Reply(models)->body_type(), ControllerReplyBody::ModelList);
  const proto::ModelInfo* info = nullptr;
  for (const proto::ModelInfo* m : *Reply(models)->body_as_ModelList()->models()) {
    if (m->name()->str() == "tiny_cnn") info = m;
  }
  ASSERT_NE(info, nullptr);
  ASSERT_NE(info->output_shape(), nullptr);
  ASSERT_GE(info->output_shape()->size(), 1u);
  EXPECT_EQ(info->output_shape()->Get(0), -1);
  std::vector<int64_t> output_shape(info->output_shape()->begin(), info->output_shape()->end());
  output_shape[0] = 2;
  const uint64_t output_bytes = *proto::ShapeBytes(info->output_dtype(), output_shape);

  const proto::HostTensor input = Input("tiny_cnn", 7);
  const Outcome framed = Infer(*tcp, 2, "tiny_cnn", {input});
  ASSERT_EQ(framed.code, absl::StatusCode::kOk) << framed.message;
  ASSERT_EQ(framed.outputs.size(), 1u);
  ASSERT_EQ(framed.outputs[0].data.size(), output_bytes);
  const Outcome framed_unix = Infer(*conn, 3, "tiny_cnn", {input});
  ASSERT_EQ(framed_unix.code, absl::StatusCode::kOk) << framed_unix.message;
  EXPECT_EQ(framed_unix.outputs[0].data, framed.outputs[0].data);

  Area area(1 << 20);
  const uint64_t area_id = Register(*conn, area, 4);
  ASSERT_NE(area_id, 0u) << daemon.log();
  const proto::HostTensor placed = PlaceIn(area, area_id, 4096, input);
  const uint64_t out_offset = 512 << 10;
  std::memset(area.memory + out_offset, 0xAB, output_bytes);
  const Outcome in_area =
      Infer(*conn, 5, "tiny_cnn", {placed}, proto::ByteSlice{area_id, out_offset, output_bytes});
  ASSERT_EQ(in_area.code, absl::StatusCode::kOk) << in_area.message << "\n" << daemon.log();
  ASSERT_EQ(in_area.outputs.size(), 1u);
  const proto::HostTensor& out = in_area.outputs[0];
  EXPECT_EQ(out.place, proto::Place::Region);
  EXPECT_EQ(out.slice.region, area_id);
  EXPECT_EQ(out.slice.offset, out_offset);  // the first output at the start of the space
  ASSERT_EQ(out.slice.length, output_bytes);
  EXPECT_EQ(out.shape, framed.outputs[0].shape);
  EXPECT_EQ(
      std::memcmp(area.memory + out.slice.offset, framed.outputs[0].data.data(), output_bytes), 0);
  // The input is still the client's (the worker reads, never writes, it).
  EXPECT_EQ(std::memcmp(area.memory + 4096, input.data.data(), input.data.size()), 0);
}

// Every descriptor that points anywhere but inside the caller's own area is refused before
// anything runs, with the connection left open.
TEST_F(UnixSocketTest, HostileDescriptorsAreRefused) {
  TestDaemon daemon({"--preload=tiny_cnn"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto conn = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(conn.has_value());
  Area area(64 << 10);
  const uint64_t id = Register(*conn, area, 1);
  ASSERT_NE(id, 0u) << daemon.log();
  const proto::HostTensor input = Input("tiny_cnn", 3);
  const uint64_t n = input.data.size();
  uint64_t request = 10;
  auto refused = [&](proto::HostTensor t, std::optional<proto::ByteSlice> to) {
    return Infer(*conn, ++request, "tiny_cnn", {std::move(t)}, to);
  };
  proto::HostTensor placed = PlaceIn(area, id, 0, input);

  proto::HostTensor past_end = placed;
  past_end.slice.offset = area.bytes - n / 2;
  EXPECT_EQ(refused(past_end, std::nullopt).code, absl::StatusCode::kOutOfRange);

  proto::HostTensor overflow = placed;
  overflow.slice.offset = UINT64_MAX - n + 1;  // offset + length wraps to 0
  EXPECT_NE(refused(overflow, std::nullopt).code, absl::StatusCode::kOk);

  const Outcome overlap = refused(placed, proto::ByteSlice{id, n / 2, 4096});
  EXPECT_EQ(overlap.code, absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(overlap.message, HasSubstr("overlaps"));

  const Outcome small = refused(placed, proto::ByteSlice{id, 32768, 8});
  EXPECT_EQ(small.code, absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(small.message, HasSubstr(" 8 bytes"));

  proto::HostTensor unregistered = placed;
  unregistered.slice.region = id + 1000;
  const Outcome missing = refused(unregistered, std::nullopt);
  EXPECT_EQ(missing.code, absl::StatusCode::kNotFound);

  proto::HostTensor wrong_length = placed;
  wrong_length.slice.length = n - 4;
  EXPECT_EQ(refused(wrong_length, std::nullopt).code, absl::StatusCode::kInvalidArgument);

  // Released, the area is gone for new tasks.
  Builder release;
  ReleaseAreaRequest(release, ++request, id);
  EXPECT_EQ(ErrorCode(conn->Call(release)), absl::StatusCode::kOk);
  EXPECT_EQ(refused(placed, std::nullopt).code, absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrorCode(conn->Call(release)), absl::StatusCode::kNotFound);

  // The connection still serves.
  EXPECT_EQ(Infer(*conn, ++request, "tiny_cnn", {input}).code, absl::StatusCode::kOk);
}

// A memfd that may shrink could make a worker fault: refused. So are areas over TCP, frames
// with files they do not take, and a frame with more files than any takes.
TEST_F(UnixSocketTest, UnsealedAreasAndMisplacedFilesAreRefused) {
  TestDaemon daemon({"--preload="});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto conn = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(conn.has_value());
  Area unsealed(4096, /*sealed=*/false);
  absl::StatusCode code;
  EXPECT_EQ(Register(*conn, unsealed, 1, &code), 0u);
  EXPECT_EQ(code, absl::StatusCode::kFailedPrecondition);

  Area area(4096);
  Builder no_fd;
  RegisterAreaRequest(no_fd, 2, 4096);
  EXPECT_EQ(ErrorCode(conn->Call(no_fd)), absl::StatusCode::kInvalidArgument);
  Builder list;
  ListModelsRequest(list, 3);
  EXPECT_EQ(ErrorCode(conn->Call(list, {area.fd.get()})), absl::StatusCode::kInvalidArgument);
  // Still open after those; a claimed size beyond the file is refused too.
  Builder too_big;
  RegisterAreaRequest(too_big, 4, 8192);
  EXPECT_EQ(ErrorCode(conn->Call(too_big, {area.fd.get()})), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Register(*conn, area, 5), 0u);

  auto tcp = RawConnection::Tcp(daemon.port());
  ASSERT_TRUE(tcp.has_value());
  Builder over_tcp;
  RegisterAreaRequest(over_tcp, 6, 4096);
  EXPECT_EQ(ErrorCode(tcp->Call(over_tcp)), absl::StatusCode::kInvalidArgument);

  // Five files with one frame: the connection is closed after an error reply.
  std::vector<int> five(5, area.fd.get());
  Builder many;
  ListModelsRequest(many, 7);
  EXPECT_EQ(ErrorCode(conn->Call(many, five)), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(conn->Next(absl::Seconds(5)).empty());  // closed
}

// 10,000 registrations from one principal hold at most --max-regions-per-client areas (and
// their fds) in pswitchd; the rest are refused and closed.
TEST_F(UnixSocketTest, TenThousandRegistrationsAreBounded) {
  TestDaemon daemon({"--preload=", "--max-regions-per-client=16"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto conn = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(conn.has_value());
  Area area(4096);
  int accepted = 0, exhausted = 0;
  for (uint64_t i = 1; i <= 10000; ++i) {
    absl::StatusCode code;
    if (Register(*conn, area, i, &code) != 0) {
      ++accepted;
    } else if (code == absl::StatusCode::kResourceExhausted) {
      ++exhausted;
    }
  }
  EXPECT_EQ(accepted, 16);
  EXPECT_EQ(exhausted, 10000 - 16);
  EXPECT_EQ(AreaFds(daemon.pid()), 16u);
  // A second connection of the same principal shares the bound.
  auto other = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(other.has_value());
  absl::StatusCode code;
  EXPECT_EQ(Register(*other, area, 1, &code), 0u);
  EXPECT_EQ(code, absl::StatusCode::kResourceExhausted);
  // The first connection closes: its areas (and their fds) go.
  conn.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (AreaFds(daemon.pid()) > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));  // the close is handled on pswitchd's own loop
  }
  EXPECT_EQ(AreaFds(daemon.pid()), 0u);
  EXPECT_NE(Register(*other, area, 2), 0u);
}

// Another principal's area, and a closed connection's, look exactly like one never registered.
TEST_F(UnixSocketTest, AnotherPrincipalsOrAClosedConnectionsAreaIsNotFound) {
  TokenFile tokens(e2e::kThreeTokens);
  TestDaemon daemon({"--preload=tiny_cnn", tokens.flag()});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  // Our uid is pswitchd's: an admin on the socket without a token.
  auto mine = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(mine.has_value());
  Area area(64 << 10);
  const uint64_t id = Register(*mine, area, 1);
  ASSERT_NE(id, 0u) << daemon.log();
  const proto::HostTensor input = Input("tiny_cnn", 5);
  const proto::HostTensor placed = PlaceIn(area, id, 0, input);
  ASSERT_EQ(Infer(*mine, 2, "tiny_cnn", {placed}).code, absl::StatusCode::kOk);

  // Bob's token on the socket wins over the uid: he is bob, and the area is not his.
  auto bob = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(bob.has_value());
  Builder auth;
  auto token = auth.CreateString("user-token-bob-0123456789");
  auto body = proto::CreateAuthenticate(auth, token);
  proto::Finish(auth,
                proto::CreateClientRequest(auth, 1, ClientRequestBody::Authenticate, body.Union()));
  ASSERT_EQ(ErrorCode(bob->Call(auth)), absl::StatusCode::kOk);
  const Outcome foreign = Infer(*bob, 2, "tiny_cnn", {placed});
  proto::HostTensor never = placed;
  never.slice.region = id + 777;
  const Outcome missing = Infer(*bob, 3, "tiny_cnn", {never});
  EXPECT_EQ(foreign.code, absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.code, absl::StatusCode::kNotFound);
  EXPECT_EQ(absl::StrReplaceAll(foreign.message, {{std::to_string(id), "N"}}),
            absl::StrReplaceAll(missing.message, {{std::to_string(id + 777), "N"}}));
  // Nor may bob release it.
  Builder release;
  ReleaseAreaRequest(release, 4, id);
  EXPECT_EQ(ErrorCode(bob->Call(release)), absl::StatusCode::kNotFound);

  // The connection that registered it closes: the area goes with it, for the same principal too.
  mine.reset();
  auto again = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(again.has_value());
  Outcome gone;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (uint64_t i = 10; absl::Now() < deadline; ++i) {
    gone = Infer(*again, i, "tiny_cnn", {placed});
    if (gone.code == absl::StatusCode::kNotFound) break;
    absl::SleepFor(absl::Milliseconds(20));  // the close is handled on pswitchd's own loop
  }
  EXPECT_EQ(gone.code, absl::StatusCode::kNotFound);
}

// Weights passed by fd: pswitchd reads the file the client opened, never a path. A checkpoint of
// zeros makes every output zero, unlike the seeded weights of the same architecture.
TEST_F(UnixSocketTest, WeightsPassedByFdAreTheOnesServed) {
  TestDaemon daemon({"--preload=tiny_cnn", "--allow-client-paths=false"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  auto model = models::CreateModel("tiny_cnn");
  ASSERT_TRUE(model.ok());
  auto state = models::StateDict(**model);
  ASSERT_TRUE(state.ok());
  for (auto& [name, tensor] : *state) tensor = tensor.detach().clone().zero_();
  const std::string path = (daemon.dir() / "zeros.safetensors").string();
  ASSERT_TRUE(models::WriteTensors(path, *state).ok());
  UniqueFd weights(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(weights.valid());

  auto conn = RawConnection::Unix(SocketOf(daemon));
  ASSERT_TRUE(conn.has_value());
  Builder b;
  auto body = proto::CreateRegisterModelDirect(b, "zeros", "tiny_cnn", nullptr, 2);
  std::vector<proto::FileRole> roles = {proto::FileRole::Weights};
  auto passed = b.CreateVector(roles);
  proto::Finish(b, proto::CreateClientRequest(b, 1, ClientRequestBody::RegisterModel, body.Union(),
                                              0, passed));
  std::vector<uint8_t> registered = conn->Call(b, {weights.get()});
  ASSERT_EQ(ErrorCode(registered), absl::StatusCode::kOk) << ErrorMessage(registered) << "\n"
                                                          << daemon.log();
  const proto::HostTensor input = Input("tiny_cnn", 9);
  const Outcome zeros = Infer(*conn, 2, "zeros", {input});
  ASSERT_EQ(zeros.code, absl::StatusCode::kOk) << zeros.message;
  const Outcome seeded = Infer(*conn, 3, "tiny_cnn", {input});
  ASSERT_EQ(seeded.code, absl::StatusCode::kOk) << seeded.message;
  for (float v : e2e::Floats(zeros.outputs[0])) ASSERT_EQ(v, 0.0f);
  EXPECT_NE(zeros.outputs[0].data, seeded.outputs[0].data);

  // A path instead of the fd: not opened (this pswitchd takes no client paths).
  Builder by_path;
  auto body2 = proto::CreateRegisterModelDirect(by_path, "by-path", "tiny_cnn", path.c_str(), 2);
  proto::Finish(by_path, proto::CreateClientRequest(by_path, 4, ClientRequestBody::RegisterModel,
                                                    body2.Union()));
  EXPECT_EQ(ErrorCode(conn->Call(by_path)), absl::StatusCode::kPermissionDenied);
  // A passed file that is not a regular file (a pipe), or is write-only, is refused.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  Builder with_pipe;
  auto body3 = proto::CreateRegisterModelDirect(with_pipe, "piped", "tiny_cnn", nullptr, 2);
  auto passed3 = with_pipe.CreateVector(roles);
  proto::Finish(with_pipe,
                proto::CreateClientRequest(with_pipe, 5, ClientRequestBody::RegisterModel,
                                           body3.Union(), 0, passed3));
  std::vector<uint8_t> piped = conn->Call(with_pipe, {pipe_read.get()});
  EXPECT_EQ(ErrorCode(piped), absl::StatusCode::kInvalidArgument) << ErrorMessage(piped);
  UniqueFd write_only(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  Builder with_wronly;
  auto body4 = proto::CreateRegisterModelDirect(with_wronly, "wronly", "tiny_cnn", nullptr, 2);
  auto passed4 = with_wronly.CreateVector(roles);
  proto::Finish(with_wronly,
                proto::CreateClientRequest(with_wronly, 6, ClientRequestBody::RegisterModel,
                                           body4.Union(), 0, passed4));
  std::vector<uint8_t> wronly = conn->Call(with_wronly, {write_only.get()});
  EXPECT_EQ(ErrorCode(wronly), absl::StatusCode::kInvalidArgument) << ErrorMessage(wronly);
}

// Without tokens, a loopback TCP peer is the uid that owns its socket. Run as root, a child that
// becomes `nobody` is a user: it may not register (so /etc/shadow is never opened for it), nor
// see root's tasks, nor reach the Unix socket at all (0660, root's group).
TEST_F(UnixSocketTest, WithoutTokensALocalPeerIsItsUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  TestDaemon daemon({"--preload=tiny_cnn", "--allow-client-paths=true"});
  ASSERT_GT(daemon.port(), 0) << daemon.log();
  // Our own uid (pswitchd's) is an admin over TCP: a task of ours to hide from nobody.
  auto tcp = RawConnection::Tcp(daemon.port());
  ASSERT_TRUE(tcp.has_value());
  Builder submit;
  SubmitRequest(submit, 1, "tiny_cnn", {Input("tiny_cnn", 1)});
  std::vector<uint8_t> accepted = tcp->Call(submit);
  ASSERT_EQ(Reply(accepted)->body_type(), ControllerReplyBody::TaskAccepted);
  const uint64_t root_task = Reply(accepted)->body_as_TaskAccepted()->task_id();
  ASSERT_EQ(ErrorCode(tcp->Next()), absl::StatusCode::kOk);

  // The child reports each answer's code through a pipe.
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(report[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    int codes[4] = {-1, -1, -1, -1};
    if (auto conn = RawConnection::Tcp(daemon.port())) {
      Builder reg;
      auto body = proto::CreateRegisterModelDirect(reg, "shadow", "tiny_cnn", "/etc/shadow", 1);
      proto::Finish(
          reg, proto::CreateClientRequest(reg, 1, ClientRequestBody::RegisterModel, body.Union()));
      codes[0] = static_cast<int>(ErrorCode(conn->Call(reg)));
      Builder query;
      auto q = proto::CreateQueryTask(query, root_task);
      proto::Finish(query,
                    proto::CreateClientRequest(query, 2, ClientRequestBody::QueryTask, q.Union()));
      codes[1] = static_cast<int>(ErrorCode(conn->Call(query)));
      Builder cancel;
      auto c = proto::CreateCancelTask(cancel, root_task);
      proto::Finish(
          cancel, proto::CreateClientRequest(cancel, 3, ClientRequestBody::CancelTask, c.Union()));
      codes[2] = static_cast<int>(ErrorCode(conn->Call(cancel)));
    }
    codes[3] = RawConnection::Unix(SocketOf(daemon)).has_value() ? 1 : 0;
    (void)!::write(report[1], codes, sizeof(codes));
    ::_exit(0);
  }
  ::close(report[1]);
  int codes[4] = {-2, -2, -2, -2};
  const ssize_t got = ::read(report[0], codes, sizeof(codes));
  ::close(report[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(codes)));
  EXPECT_EQ(codes[0], static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(codes[1], static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(codes[2], static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(codes[3], 0) << "nobody reached a 0660 root socket";
  EXPECT_THAT(daemon.log(), Not(HasSubstr("header length")));
}

}  // namespace
}  // namespace pswitch
