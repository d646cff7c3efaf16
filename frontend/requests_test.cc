#include "frontend/requests.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "proto/framing.h"

namespace pswitch::frontend {
namespace {

using Builder = flatbuffers::FlatBufferBuilder;

// The request `b` holds, as a server reads it: verified first.
const proto::ClientRequest* Verified(const Builder& b) {
  auto request = proto::VerifyPayload<proto::ClientRequest>(
      std::span<const uint8_t>(b.GetBufferPointer(), b.GetSize()), "request");
  EXPECT_TRUE(request.ok()) << request.status();
  return request.ok() ? *request : nullptr;
}

template <typename T>
void FinishRequest(Builder& b, proto::ClientRequestBody type, flatbuffers::Offset<T> body) {
  proto::Finish(b, proto::CreateClientRequest(b, 1, type, body.Union()));
}

// Trust-boundary issue, item 1: nesting 100000 deep overflowed the stack; the parse refuses it.
TEST(RequestsTest, DeeplyNestedCycleJsonIsRefused) {
  std::string json = R"({"period_ns":)" + std::string(100000, '[') + std::string(100000, ']') +
                     R"(,"bubbles":[]})";
  Builder b;
  FinishRequest(b, proto::ClientRequestBody::RegisterBubbleCycle,
                proto::CreateRegisterBubbleCycle(b, 0, b.CreateString(json), 0));
  const proto::ClientRequest* request = Verified(b);
  ASSERT_NE(request, nullptr);
  auto cycle = ParseCycle(*request->body_as_RegisterBubbleCycle(), 1000, absl::Now());
  EXPECT_EQ(cycle.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RequestsTest, ACycleOriginInTheFutureIsRefusedAndAPastOneIsPlacedOnTheWallClock) {
  const std::string json = R"({"period_ns": 100000000, "bubbles": []})";
  const absl::Time now = absl::FromUnixSeconds(1'000'000);
  for (uint64_t origin : {uint64_t{5000}, uint64_t{200}}) {
    Builder b;
    FinishRequest(b, proto::ClientRequestBody::RegisterBubbleCycle,
                  proto::CreateRegisterBubbleCycle(b, 0, b.CreateString(json), origin));
    auto cycle = ParseCycle(*Verified(b)->body_as_RegisterBubbleCycle(), 1000, now);
    if (origin > 1000) {
      EXPECT_EQ(cycle.status().code(), absl::StatusCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(cycle.ok()) << cycle.status();
      EXPECT_EQ(*cycle->origin, now - absl::Nanoseconds(800));
    }
  }
}

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

// Trust-boundary issue, item 9: an unknown TaskKind ran as inference; non-UTF-8 names were
// accepted and echoed.
TEST(RequestsTest, UnknownEnumsAndBadTextAreRefused) {
  {
    Builder b;
    FinishRequest(b, proto::ClientRequestBody::SubmitTask,
                  proto::CreateSubmitTask(b, b.CreateString("m"), static_cast<proto::TaskKind>(7)));
    auto task = ParseTask(*Verified(b)->body_as_SubmitTask(), kNow);
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    Builder b;
    FinishRequest(b, proto::ClientRequestBody::SubmitTask,
                  proto::CreateSubmitTask(b, b.CreateString("m"), proto::TaskKind::Training, 0, 1,
                                          0, 0, 0, static_cast<proto::Optimizer>(9)));
    EXPECT_EQ(ParseTask(*Verified(b)->body_as_SubmitTask(), kNow).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  {
    Builder b;
    FinishRequest(b, proto::ClientRequestBody::RegisterModel,
                  proto::CreateRegisterModel(b, b.CreateString("bad\xff\xfename"),
                                             b.CreateString("tiny_cnn")));
    auto registration = ParseRegistration(*Verified(b)->body_as_RegisterModel());
    EXPECT_EQ(registration.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(registration.status().message().find("bad"), absl::string_view::npos)
        << "not echoed: " << registration.status();
  }
  {
    Builder b;
    FinishRequest(
        b, proto::ClientRequestBody::RegisterModel,
        proto::CreateRegisterModel(b, b.CreateString("fill-7"), b.CreateString("tiny_cnn")));
    EXPECT_EQ(ParseRegistration(*Verified(b)->body_as_RegisterModel()).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Issue 27 item 8: a copy's name is checked text, never a fill job's, and only training copies.
TEST(RequestsTest, ACopyNameIsCheckedText) {
  for (const auto& [kind, name] : std::vector<std::pair<proto::TaskKind, std::string>>{
           {proto::TaskKind::Training, "bad\xff\xfename"},
           {proto::TaskKind::Training, "fill-3"},
           {proto::TaskKind::Inference, "mine"},
       }) {
    Builder b;
    FinishRequest(
        b, proto::ClientRequestBody::SubmitTask,
        proto::CreateSubmitTask(b, b.CreateString("m"), kind, 0, 1, 0, 0, 0, proto::Optimizer::Sgd,
                                0.01, 0.9, 0, b.CreateString(name)));
    auto task = ParseTask(*Verified(b)->body_as_SubmitTask(), kNow);
    EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(task.status().message().find("bad"), absl::string_view::npos) << task.status();
  }
}

TEST(RequestsTest, AnUnloadNamesAClientModel) {
  for (const auto& [name, code] : std::vector<std::pair<std::string, absl::StatusCode>>{
           {"resnet50", absl::StatusCode::kOk},
           {"", absl::StatusCode::kInvalidArgument},
           {"fill-7", absl::StatusCode::kOk},
           {"bad\xff\xfename", absl::StatusCode::kInvalidArgument},
           {std::string(500, 'm'), absl::StatusCode::kInvalidArgument}}) {
    Builder b;
    FinishRequest(b, proto::ClientRequestBody::UnloadModel,
                  proto::CreateUnloadModel(b, b.CreateString(name)));
    const proto::ClientRequest* request = Verified(b);
    ASSERT_NE(request, nullptr);
    absl::StatusOr<std::string> parsed = ParseUnload(*request->body_as_UnloadModel());
    EXPECT_EQ(parsed.status().code(), code) << name.substr(0, 20) << ": " << parsed.status();
    if (parsed.ok()) {
      EXPECT_EQ(*parsed, name);
    }
  }
}

TEST(RequestsTest, InputTensorNamesAreCheckedBeforeAnyErrorCanQuoteThem) {
  Builder b;
  proto::HostTensor bad{"in\x01put", proto::DType::F32, {1}, {0, 0, 0, 0}};
  auto inputs = proto::CreateWireTensors(b, {bad});
  FinishRequest(
      b, proto::ClientRequestBody::SubmitTask,
      proto::CreateSubmitTask(b, b.CreateString("m"), proto::TaskKind::Inference, inputs));
  auto task = ParseTask(*Verified(b)->body_as_SubmitTask(), kNow);
  EXPECT_EQ(task.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(task.status().message().find("in\x01put"), absl::string_view::npos) << task.status();
}

TEST(RequestsTest, ValidRequestsKeepEveryFieldAndDurationsAreBounded) {
  Builder b;
  FinishRequest(b, proto::ClientRequestBody::SubmitTask,
                proto::CreateSubmitTask(b, b.CreateString("bert"), proto::TaskKind::Training, 0, 12,
                                        99, 3, ~uint64_t{0}, proto::Optimizer::Adam, 0.5, 0.9, 8));
  auto task = ParseTask(*Verified(b)->body_as_SubmitTask(), kNow);
  ASSERT_TRUE(task.ok()) << task.status();
  const controller::TaskSpec& spec = task->spec;
  EXPECT_EQ(spec.model, "bert");
  EXPECT_EQ(spec.kind, TaskKind::kTraining);
  EXPECT_EQ(spec.iterations, 12u);
  EXPECT_EQ(spec.seed, 99u);
  EXPECT_EQ(spec.priority, 3);
  EXPECT_EQ(spec.trainer.optimizer, api::OptimizerKind::kAdam);
  EXPECT_EQ(spec.trainer.learning_rate, 0.5);
  EXPECT_EQ(spec.trainer.momentum, 0) << "Adam has no momentum";
  EXPECT_EQ(spec.batch, 8u);
  EXPECT_GT(spec.deadline, kNow);
  EXPECT_LE(spec.deadline, kNow + absl::Hours(24)) << "a deadline of 2^64 ms stays finite";

  Builder copy;
  FinishRequest(copy, proto::ClientRequestBody::SubmitTask,
                proto::CreateSubmitTask(copy, copy.CreateString("bert"), proto::TaskKind::Training,
                                        0, 1, 0, 0, 0, proto::Optimizer::Sgd, 10, 0.9, 0,
                                        copy.CreateString("my-bert")));
  auto on_copy = ParseTask(*Verified(copy)->body_as_SubmitTask(), kNow);
  ASSERT_TRUE(on_copy.ok()) << on_copy.status();
  EXPECT_EQ(on_copy->as_model, "my-bert");
  EXPECT_TRUE(task->as_model.empty()) << "no copy unless asked";

  Builder trainers;
  auto names = trainers.CreateVectorOfStrings(std::vector<std::string>{"alice", "bob"});
  FinishRequest(trainers, proto::ClientRequestBody::RegisterModel,
                proto::CreateRegisterModel(trainers, trainers.CreateString("shared"),
                                           trainers.CreateString("tiny_cnn"), 0, 1, 0, 0, names));
  auto registration = ParseRegistration(*Verified(trainers)->body_as_RegisterModel());
  ASSERT_TRUE(registration.ok()) << registration.status();
  EXPECT_EQ(registration->trainers, (std::vector<std::string>{"alice", "bob"}));
  EXPECT_FALSE(registration->pin_resident) << "not pinned unless asked";

  Builder pinned;
  FinishRequest(pinned, proto::ClientRequestBody::RegisterModel,
                proto::CreateRegisterModel(pinned, pinned.CreateString("hot"),
                                           pinned.CreateString("tiny_cnn"), 0, 1, 0, 0, 0, false, 0,
                                           false, /*pin_resident=*/true));
  auto hot = ParseRegistration(*Verified(pinned)->body_as_RegisterModel());
  ASSERT_TRUE(hot.ok()) << hot.status();
  EXPECT_TRUE(hot->pin_resident);

  Builder begin;
  FinishRequest(begin, proto::ClientRequestBody::BubbleBegin,
                proto::CreateBubbleBegin(begin, 1, ~uint64_t{0}, 5, 6));
  const BubbleBeginRequest bubble = ParseBubbleBegin(*Verified(begin)->body_as_BubbleBegin());
  EXPECT_EQ(bubble.gpu, 1);
  EXPECT_EQ(bubble.expected, absl::Hours(24));
}

// Where outputs go is the client's to say, within what the wire allows: a region slice needs a
// region and a length that do not overflow, Inline takes no slice, training places nothing.
TEST(RequestsTest, OutputPlacesAreCheckedBeforeAdmission) {
  auto parse = [](proto::TaskKind kind, proto::Place place, const proto::Slice* to) {
    Builder b;
    auto body = proto::CreateSubmitTask(b, b.CreateString("m"), kind, 0, 1, 0, 0, 0,
                                        proto::Optimizer::Sgd, 0.01, 0.9, 0, 0, place, to);
    FinishRequest(b, proto::ClientRequestBody::SubmitTask, body);
    return ParseTask(*Verified(b)->body_as_SubmitTask(), kNow);
  };
  const proto::Slice good(7, 128, 4096);
  auto region = parse(proto::TaskKind::Inference, proto::Place::Region, &good);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_FALSE(region->outputs_in_payload);
  EXPECT_EQ(region->spec.outputs_to, (proto::ByteSlice{7, 128, 4096}));
  auto inline_default = parse(proto::TaskKind::Inference, proto::Place::Inline, nullptr);
  ASSERT_TRUE(inline_default.ok());
  EXPECT_FALSE(inline_default->spec.outputs_to.has_value());
  EXPECT_FALSE(inline_default->outputs_in_payload);
  auto payload = parse(proto::TaskKind::Inference, proto::Place::Payload, nullptr);
  ASSERT_TRUE(payload.ok());
  EXPECT_TRUE(payload->outputs_in_payload);

  const proto::Slice no_region(0, 0, 4096), empty(7, 0, 0), overflow(7, UINT64_MAX - 10, 4096);
  for (const proto::Slice* bad : {&no_region, &empty, &overflow}) {
    EXPECT_EQ(parse(proto::TaskKind::Inference, proto::Place::Region, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(parse(proto::TaskKind::Inference, proto::Place::Region, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parse(proto::TaskKind::Inference, proto::Place::Inline, &good).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parse(proto::TaskKind::Training, proto::Place::Region, &good).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      parse(proto::TaskKind::Inference, static_cast<proto::Place>(9), nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// Issue 30 item 4: an inference's latency objective makes it online fill work; nothing else
// may carry one, and it is bounded.
TEST(RequestsTest, AnOnlineObjectiveIsForInferenceAndBounded) {
  auto parse = [](proto::TaskKind kind, uint64_t objective_us) {
    Builder b;
    auto body =
        proto::CreateSubmitTask(b, b.CreateString("m"), kind, 0, 1, 0, 0, 0, proto::Optimizer::Sgd,
                                0.01, 0.9, 0, 0, proto::Place::Inline, nullptr, objective_us);
    FinishRequest(b, proto::ClientRequestBody::SubmitTask, body);
    return ParseTask(*Verified(b)->body_as_SubmitTask(), absl::Now());
  };
  auto plain = parse(proto::TaskKind::Inference, 0);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->spec.online_slo);
  auto online = parse(proto::TaskKind::Inference, 2500);
  ASSERT_TRUE(online.ok()) << online.status();
  EXPECT_EQ(online->spec.online_slo, absl::Microseconds(2500));
  EXPECT_EQ(parse(proto::TaskKind::Training, 2500).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto too_long = parse(proto::TaskKind::Inference, UINT64_MAX);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("(0, 1h]"), std::string::npos) << too_long.status();
}

}  // namespace
}  // namespace pswitch::frontend
