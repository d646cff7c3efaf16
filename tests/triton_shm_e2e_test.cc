// End-to-end: Triton's system shared-memory extension on pswitchd's HTTP port (docs/dataplane.md),
// against a real daemon: registration and its checks, and inference whose tensors lie in the
// client's segments, compared with the same request's bytes sent in the body.
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e_helpers.h"
#include "tests/raw_socket.h"
#include "tests/test_daemon.h"

namespace pswitch {
namespace {

using e2e::Input;
using nlohmann::json;

// A segment under /dev/shm of ours, mapped here as a client maps it; unlinked at the end.
class Segment {
 public:
  explicit Segment(size_t bytes) : key_(NewKey()), bytes_(bytes) {
    const std::string path = Path();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd_, 0) << path;
    EXPECT_EQ(::ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<uint8_t*>(p);
  }
  ~Segment() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
    if (fd_ >= 0) ::close(fd_);
    ::unlink(Path().c_str());
  }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  const std::string& key() const { return key_; }  // "/name", as shm_open takes it
  std::string Path() const { return "/dev/shm" + key_; }
  uint8_t* data() { return data_; }
  int fd() const { return fd_; }

  static std::string NewKey() {
    static int n = 0;
    return absl::StrCat("/pswitch-e2e-", ::getpid(), "-", n++);
  }

 private:
  const std::string key_;
  const size_t bytes_;
  int fd_ = -1;
  uint8_t* data_ = nullptr;
};

json Body(const httplib::Result& r) { return json::parse(r->body, nullptr, false); }

class TritonShmE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<e2e::TestDaemon>(
        std::vector<std::string>{"--preload=tiny_mlp", "--standby-workers=0"});
    ASSERT_GT(daemon_->http_port(), 0) << daemon_->log();
    http_ = std::make_unique<httplib::Client>("127.0.0.1", daemon_->http_port());
    http_->set_read_timeout(60, 0);
  }
  httplib::Result Register(const std::string& name, const std::string& key, uint64_t offset,
                           uint64_t bytes) {
    return http_->Post("/v2/systemsharedmemory/region/" + name + "/register",
                       json{{"key", key}, {"offset", offset}, {"byte_size", bytes}}.dump(),
                       "application/json");
  }
  json Status() {
    auto r = http_->Get("/v2/systemsharedmemory/status");
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    return Body(r);
  }
  // The infer body whose input "input" lies in region `in` (at `in_offset`) and whose output
  // goes to region `out`.
  static std::string ShmInferBody(const proto::HostTensor& t, const std::string& in,
                                  uint64_t in_offset, const std::string& out, uint64_t out_bytes) {
    return json{{"inputs",
                 {{{"name", t.name},
                   {"shape", t.shape},
                   {"datatype", "FP32"},
                   {"parameters",
                    {{"shared_memory_region", in},
                     {"shared_memory_byte_size", t.data.size()},
                     {"shared_memory_offset", in_offset}}}}}},
                {"outputs",
                 {{{"name", "output"},
                   {"parameters",
                    {{"shared_memory_region", out}, {"shared_memory_byte_size", out_bytes}}}}}}}
        .dump();
  }
  // The same input in the body, its output as binary data: the bytes the JSON path answers.
  std::string OutputBytesInBody(const proto::HostTensor& t, json* output) {
    const std::string header = json{{"inputs",
                                     {{{"name", t.name},
                                       {"shape", t.shape},
                                       {"datatype", "FP32"},
                                       {"parameters", {{"binary_data_size", t.data.size()}}}}}},
                                    {"parameters", {{"binary_data_output", true}}}}
                                   .dump();
    std::string body = header;
    body.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    httplib::Headers headers{{"Inference-Header-Content-Length", std::to_string(header.size())}};
    auto r = http_->Post("/v2/models/tiny_mlp/infer", headers, body, "application/octet-stream");
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    const size_t json_bytes = std::stoul(r->get_header_value("Inference-Header-Content-Length"));
    *output = json::parse(r->body.substr(0, json_bytes))["outputs"][0];
    return r->body.substr(json_bytes);
  }

  std::unique_ptr<e2e::TestDaemon> daemon_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(TritonShmE2eTest, RegisterStatusUnregister) {
  Segment seg(2 * 4096);
  auto server = http_->Get("/v2");
  ASSERT_TRUE(server);
  EXPECT_NE(server->body.find("system_shared_memory"), std::string::npos) << server->body;

  auto r = Register("in", seg.key(), 4096, 4096);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  r = Register("out", seg.key(), 0, 100);
  ASSERT_EQ(r->status, 200) << r->body;
  // A name twice is a conflict, and the region stays as it was.
  r = Register("in", seg.key(), 0, 16);
  EXPECT_EQ(r->status, 409) << r->body;

  json status = Status();
  ASSERT_EQ(status.size(), 2u) << status;
  EXPECT_EQ(status[0],
            (json{{"name", "in"}, {"key", seg.key()}, {"offset", 4096}, {"byte_size", 4096}}));
  auto one = http_->Get("/v2/systemsharedmemory/region/out/status");
  ASSERT_EQ(one->status, 200) << one->body;
  EXPECT_EQ(Body(one)[0]["byte_size"], 100);

  // Ranges outside the segment, and offsets off a page, are refused.
  EXPECT_EQ(Register("big", seg.key(), 0, 3 * 4096)->status, 400);
  EXPECT_EQ(Register("odd", seg.key(), 100, 16)->status, 400);
  EXPECT_EQ(Register("dots", "/../etc/passwd", 0, 16)->status, 400);

  r = http_->Post("/v2/systemsharedmemory/region/in/unregister", "", "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  status = Status();
  ASSERT_EQ(status.size(), 1u) << status;
  EXPECT_EQ(status[0]["name"], "out");
  EXPECT_EQ(http_->Get("/v2/systemsharedmemory/region/in/status")->status, 404);
  r = http_->Post("/v2/systemsharedmemory/unregister", "", "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(Status().empty());

  // CUDA shared memory is the CUDA backend's: the host backend says so.
  auto cuda = http_->Get("/v2/cudasharedmemory/status");
  ASSERT_TRUE(cuda);
  EXPECT_EQ(cuda->status, 501) << cuda->body;
  EXPECT_NE(Body(cuda)["error"].get<std::string>().find("CUDA backend"), std::string::npos);
}

// A missing segment, a link and (where this test may chown) another user's segment get the same
// status and message; none is mapped.
TEST_F(TritonShmE2eTest, AnotherUsersMissingAndLinkedSegmentsGetOneAnswer) {
  const std::string missing_key = Segment::NewKey();
  auto missing = Register("r", missing_key, 0, 64);
  ASSERT_TRUE(missing);
  ASSERT_EQ(missing->status, 404) << missing->body;
  auto message = [](const httplib::Result& r, const std::string& key) {
    std::string m = Body(r)["error"].get<std::string>();
    const size_t at = m.find(key);
    EXPECT_NE(at, std::string::npos) << m;
    return at == std::string::npos ? m : m.replace(at, key.size(), "KEY");
  };
  const std::string expected = message(missing, missing_key);

  Segment target(4096);
  const std::string link_key = Segment::NewKey();
  ASSERT_EQ(::symlink(target.Path().c_str(), ("/dev/shm" + link_key).c_str()), 0);
  auto linked = Register("r", link_key, 0, 64);
  ::unlink(("/dev/shm" + link_key).c_str());
  EXPECT_EQ(linked->status, 404) << linked->body;
  EXPECT_EQ(message(linked, link_key), expected);

  if (::geteuid() == 0) {
    Segment theirs(4096);
    ASSERT_EQ(::fchown(theirs.fd(), 65534, 65534), 0);
    auto other = Register("r", theirs.key(), 0, 64);
    EXPECT_EQ(other->status, 404) << other->body;
    EXPECT_EQ(message(other, theirs.key()), expected);
  } else {
    // Not root: another user's file cannot be made here; frontend/triton_shm_test.cc checks the
    // owner comparison itself (OpenShmSegmentTest).
    GTEST_LOG_(INFO) << "not root: another user's segment is checked in triton_shm_test";
  }
  EXPECT_TRUE(Status().empty());
}

// One HTTP request (Connection: close) on a new loopback connection: "STATUS BODY".
std::string RawRequest(int port, const std::string& method, const std::string& path,
                       const std::string& body) {
  const int fd = testing::ConnectLoopback(port);
  if (fd < 0) return "connect failed";
  testing::SendAll(fd, absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: x\r\n",
                                    "Content-Type: application/json\r\nContent-Length: ",
                                    body.size(), "\r\nConnection: close\r\n\r\n", body));
  const std::string answer = testing::ReadUntilClose(fd, absl::Seconds(30));
  ::close(fd);
  const size_t body_at = answer.find("\r\n\r\n");
  if (answer.size() < 12 || body_at == std::string::npos) return "no answer";
  return answer.substr(9, 3) + " " + answer.substr(body_at + 4);
}

// Root's pswitchd, a client running as another user (nobody): each maps only its own segments.
// The other user cannot map root's segment, root (pswitchd's own uid, an admin) cannot map the
// other user's, and each sees only its own regions.
TEST_F(TritonShmE2eTest, EachUserMapsOnlyItsOwnSegments) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another user";
  constexpr uid_t kNobody = 65534;
  Segment roots(4096);
  const std::string their_key = Segment::NewKey();
  const std::string missing_key = Segment::NewKey();
  const int port = daemon_->http_port();
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The client: nobody, with a segment of its own.
    ::close(pipe_fds[0]);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0) {
      ::_exit(3);
    }
    const int fd = ::open(("/dev/shm" + their_key).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) ::_exit(4);
    ::close(fd);
    auto reg = [&](const std::string& name, const std::string& key) {
      return RawRequest(port, "POST", "/v2/systemsharedmemory/region/" + name + "/register",
                        json{{"key", key}, {"byte_size", 64}}.dump());
    };
    const std::string lines[] = {reg("mine", their_key), reg("roots", roots.key()),
                                 reg("missing", missing_key),
                                 RawRequest(port, "GET", "/v2/systemsharedmemory/status", "")};
    std::string out;
    for (const std::string& line : lines) out += line + "\n";
    if (::write(pipe_fds[1], out.data(), out.size()) != static_cast<ssize_t>(out.size())) {
      ::_exit(5);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) out.append(buf, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::vector<std::string> answers;
  for (size_t at = 0, nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1) {
    answers.push_back(out.substr(at, nl - at));
  }
  ASSERT_EQ(answers.size(), 4u) << out;
  EXPECT_EQ(answers[0].substr(0, 3), "200") << answers[0];
  // Root's segment and a missing one: the same answer, but for the key named.
  std::string roots_answer = answers[1], missing_answer = answers[2];
  ASSERT_NE(roots_answer.find(roots.key()), std::string::npos) << roots_answer;
  roots_answer.replace(roots_answer.find(roots.key()), roots.key().size(), "KEY");
  ASSERT_NE(missing_answer.find(missing_key), std::string::npos) << missing_answer;
  missing_answer.replace(missing_answer.find(missing_key), missing_key.size(), "KEY");
  EXPECT_EQ(roots_answer.substr(0, 3), "404");
  EXPECT_EQ(roots_answer, missing_answer);
  // Nobody sees its own region only.
  const json theirs = json::parse(answers[3].substr(4));
  ASSERT_EQ(theirs.size(), 1u) << theirs;
  EXPECT_EQ(theirs[0]["name"], "mine");

  // Root (pswitchd's own uid) neither sees nobody's region nor may map nobody's segment.
  EXPECT_TRUE(Status().empty());
  auto r = Register("theirs", their_key, 0, 64);
  ::unlink(("/dev/shm" + their_key).c_str());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_TRUE(Status().empty());
}

// With tokens, the uid a segment must belong to is the one the token's line names (the token
// file's UID column); a token without one maps nothing by name. Each token sees its own regions.
TEST(TritonShmTokensE2eTest, TheTokensUidColumnSaysWhoseSegmentsItMayMap) {
  e2e::TokenFile tokens(absl::StrCat("user-token-alice-0123456789 alice user ", ::getuid(),
                                     "\nuser-token-bob-0123456789 bob user\n"));
  e2e::TestDaemon daemon({"--preload=tiny_mlp", "--standby-workers=0", tokens.flag()});
  ASSERT_GT(daemon.http_port(), 0) << daemon.log();
  httplib::Client http("127.0.0.1", daemon.http_port());
  Segment seg(4096);
  const std::string body = json{{"key", seg.key()}, {"byte_size", 4096}}.dump();
  const std::string path = "/v2/systemsharedmemory/region/r/register";
  auto as = [](const std::string& token) {
    return httplib::Headers{{"Authorization", "Bearer " + token}};
  };
  auto none = http.Post(path, body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  auto bob = http.Post(path, as("user-token-bob-0123456789"), body, "application/json");
  ASSERT_TRUE(bob);
  EXPECT_EQ(bob->status, 403) << bob->body;
  auto alice = http.Post(path, as("user-token-alice-0123456789"), body, "application/json");
  ASSERT_TRUE(alice);
  EXPECT_EQ(alice->status, 200) << alice->body;
  auto alices = http.Get("/v2/systemsharedmemory/status", as("user-token-alice-0123456789"));
  ASSERT_TRUE(alices);
  EXPECT_EQ(json::parse(alices->body).size(), 1u) << alices->body;
  auto bobs = http.Get("/v2/systemsharedmemory/status", as("user-token-bob-0123456789"));
  ASSERT_TRUE(bobs);
  EXPECT_EQ(json::parse(bobs->body).size(), 0u) << bobs->body;
}

TEST_F(TritonShmE2eTest, TenThousandRegistrationsAreBounded) {
  Segment seg(4096);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 10000; ++i) {
    auto r = Register(absl::StrCat("r", i), seg.key(), 0, 4096);
    ASSERT_TRUE(r) << i;
    if (r->status == 200) {
      ++accepted;
    } else {
      ASSERT_EQ(r->status, 429) << r->body;
      ++refused;
    }
  }
  EXPECT_EQ(accepted, 64) << "--max-regions-per-client's default";
  EXPECT_EQ(refused, 10000 - 64);
  EXPECT_EQ(Status().size(), 64u);
  ASSERT_EQ(http_->Post("/v2/systemsharedmemory/unregister", "", "application/json")->status, 200);
  EXPECT_TRUE(Status().empty());
}

// Inputs read from the client's segment and the output written into it give the bytes the same
// request gets with its tensors in the body.
TEST_F(TritonShmE2eTest, InferInSharedMemoryIsBitIdenticalToTheBody) {
  const proto::HostTensor in = Input("tiny_mlp", 7);
  json expected_meta;
  const std::string expected = OutputBytesInBody(in, &expected_meta);
  ASSERT_FALSE(expected.empty());

  Segment seg(3 * 4096);
  std::memcpy(seg.data() + 128, in.data.data(), in.data.size());
  ASSERT_EQ(Register("in", seg.key(), 0, 4096)->status, 200);
  ASSERT_EQ(Register("out", seg.key(), 4096, 2 * 4096)->status, 200);
  std::memset(seg.data() + 4096, 0xee, 2 * 4096);
  auto r = http_->Post("/v2/models/tiny_mlp/infer", ShmInferBody(in, "in", 128, "out", 2 * 4096),
                       "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body << daemon_->log();
  const json out = Body(r)["outputs"][0];
  EXPECT_FALSE(out.contains("data")) << out;
  EXPECT_EQ(out["shape"], expected_meta["shape"]);
  EXPECT_EQ(out["parameters"]["shared_memory_region"], "out");
  ASSERT_EQ(out["parameters"]["shared_memory_byte_size"].get<size_t>(), expected.size()) << out;
  const size_t at = out["parameters"]["shared_memory_offset"].get<size_t>();
  ASSERT_LE(at + expected.size(), 2u * 4096);
  EXPECT_EQ(std::memcmp(seg.data() + 4096 + at, expected.data(), expected.size()), 0);
}

// An input in shared memory with its output asked for as binary data in the answer: the output
// gets a staging region of pswitchd's own (no input needed one), and its bytes are the JSON
// path's.
TEST_F(TritonShmE2eTest, AnInputInSharedMemoryWithItsOutputInTheAnswer) {
  const proto::HostTensor in = Input("tiny_mlp", 5);
  json expected_meta;
  const std::string expected = OutputBytesInBody(in, &expected_meta);
  ASSERT_FALSE(expected.empty());
  Segment seg(4096);
  std::memcpy(seg.data() + 64, in.data.data(), in.data.size());
  ASSERT_EQ(Register("in", seg.key(), 0, 4096)->status, 200);
  const std::string body =
      json{{"inputs",
            {{{"name", in.name},
              {"shape", in.shape},
              {"datatype", "FP32"},
              {"parameters",
               {{"shared_memory_region", "in"},
                {"shared_memory_byte_size", in.data.size()},
                {"shared_memory_offset", 64}}}}}},
           {"parameters", {{"binary_data_output", true}}}}
          .dump();
  for (int i = 0; i < 3; ++i) {  // the room is made per request and goes with its answer
    auto r = http_->Post("/v2/models/tiny_mlp/infer", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body << daemon_->log();
    const size_t json_bytes = std::stoul(r->get_header_value("Inference-Header-Content-Length"));
    const json out = json::parse(r->body.substr(0, json_bytes))["outputs"][0];
    EXPECT_EQ(out["shape"], expected_meta["shape"]);
    EXPECT_EQ(r->body.substr(json_bytes), expected);
  }
}

// Refusals before anything runs: another principal's or an unknown region, a slice past the
// region, an output space too small, a byte size that does not match the shape.
TEST_F(TritonShmE2eTest, BadSlicesAreRefusedBeforeAnythingRuns) {
  const proto::HostTensor in = Input("tiny_mlp", 3);
  Segment seg(2 * 4096);
  ASSERT_EQ(Register("in", seg.key(), 0, 4096)->status, 200);
  ASSERT_EQ(Register("out", seg.key(), 4096, 4096)->status, 200);
  auto infer = [&](const std::string& body) {
    auto r = http_->Post("/v2/models/tiny_mlp/infer", body, "application/json");
    EXPECT_TRUE(r);
    return r->status;
  };
  EXPECT_EQ(infer(ShmInferBody(in, "nobody", 0, "out", 4096)), 404);
  EXPECT_EQ(infer(ShmInferBody(in, "in", 4096 - 8, "out", 4096)), 400);
  EXPECT_EQ(infer(ShmInferBody(in, "in", 0, "out", 8192)), 400);
  json wrong = json::parse(ShmInferBody(in, "in", 0, "out", 4096));
  wrong["inputs"][0]["parameters"]["shared_memory_byte_size"] = in.data.size() - 4;
  EXPECT_EQ(infer(wrong.dump()), 400);
}

// A segment truncated after registration fails the task that uses it, and only that task: the
// next request (in the body) is answered, and the daemon keeps serving.
TEST_F(TritonShmE2eTest, ASegmentTruncatedAfterRegistrationFailsThatTaskOnly) {
  const proto::HostTensor in = Input("tiny_mlp", 5);
  Segment seg(2 * 4096);
  std::memcpy(seg.data(), in.data.data(), in.data.size());
  ASSERT_EQ(Register("in", seg.key(), 0, 4096)->status, 200);
  ASSERT_EQ(Register("out", seg.key(), 4096, 4096)->status, 200);
  ASSERT_EQ(::ftruncate(seg.fd(), 0), 0);
  auto r = http_->Post("/v2/models/tiny_mlp/infer", ShmInferBody(in, "in", 0, "out", 4096),
                       "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("shrank"), std::string::npos) << r->body;
  json meta;
  EXPECT_FALSE(OutputBytesInBody(in, &meta).empty());
  auto live = http_->Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
}

}  // namespace
}  // namespace pswitch
