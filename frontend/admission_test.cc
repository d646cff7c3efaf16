#include "frontend/admission.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <map>

#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pswitch::frontend {
namespace {

using controller::TaskKind;
using controller::TaskOutcome;
using controller::TaskSpec;
using registry::CatalogEntry;
using registry::EntryRef;
using ::testing::HasSubstr;

// The catalog and queue admission talks to, held in memory. Copies register when the test says
// (as the registration thread would, later); queued tasks are answered when the test says.
class FakeSink : public TaskSink {
 public:
  void Add(const std::string& name, std::vector<std::string> trainers = {},
           std::string owner = "") {
    auto entry = std::make_shared<CatalogEntry>();
    entry->request.name = name;
    entry->request.trainers = std::move(trainers);
    entry->request.owner = std::move(owner);
    entry->input = {"input", proto::DType::F32, {-1, 3, 8, 8}};
    models_[name] = entry;
  }
  absl::StatusOr<EntryRef> Find(absl::string_view model) const override {
    auto it = models_.find(std::string(model));
    if (it == models_.end()) return absl::NotFoundError("model is not registered");
    return EntryRef(it->second);
  }
  std::vector<EntryRef> List() const override {
    std::vector<EntryRef> out;
    for (const auto& [name, entry] : models_) out.push_back(entry);
    return out;
  }
  absl::StatusOr<uint64_t> Queue(TaskSpec spec, controller::TaskCallback done) override {
    if (!queue_error.ok()) return queue_error;
    const uint64_t id = next_id_++;
    queued.push_back({id, std::move(spec), std::move(done)});
    if (answer_at_once) Answer(queued.size() - 1, TaskOutcome{});
    return id;
  }
  void RegisterCopy(std::string original, std::string name, std::string owner,
                    std::function<void(const absl::StatusOr<EntryRef>&)> done) override {
    copies.push_back({std::move(original), std::move(name), std::move(owner), std::move(done)});
  }
  // Finishes the oldest pending copy registration (as Controller::RegisterCopy would).
  void RegisterNextCopy() {
    Copy copy = std::move(copies.front());
    copies.pop_front();
    Add(copy.name, {}, copy.owner);
    copy.done(EntryRef(models_[copy.name]));
  }
  void Answer(size_t index, const absl::StatusOr<TaskOutcome>& outcome) {
    controller::TaskCallback done = std::move(queued[index].done);
    done(outcome);
  }

  struct Queued {
    uint64_t id;
    TaskSpec spec;
    controller::TaskCallback done;
  };
  struct Copy {
    std::string original, name, owner;
    std::function<void(const absl::StatusOr<EntryRef>&)> done;
  };
  std::vector<Queued> queued;
  std::deque<Copy> copies;
  absl::Status queue_error;
  bool answer_at_once = false;

 private:
  std::map<std::string, std::shared_ptr<CatalogEntry>> models_;
  uint64_t next_id_ = 1;
};

proto::HostTensor Tensor(std::string name, proto::DType dtype, std::vector<int64_t> shape) {
  return proto::HostTensor{std::move(name), dtype, std::move(shape), {}};
}

TaskSpec Inference(const std::string& model, std::vector<proto::HostTensor> inputs) {
  TaskSpec spec;
  spec.model = model;
  spec.kind = TaskKind::kInference;
  spec.inputs = std::move(inputs);
  return spec;
}

TaskSpec Training(const std::string& model) {
  TaskSpec spec;
  spec.model = model;
  spec.kind = TaskKind::kTraining;
  spec.iterations = 5;
  spec.trainer.learning_rate = 10;
  return spec;
}

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest() : quota_(2), admission_(&sink_, &quota_, &owners_) {
    sink_.Add("shared");
    sink_.Add("team", {"carol"});
  }
  const Principal alice_{"alice", Role::kUser};
  const Principal bob_{"bob", Role::kUser};
  const Principal carol_{"carol", Role::kUser};
  const Principal root_{"root", Role::kAdmin};
  FakeSink sink_;
  ClientQuota quota_;
  TaskOwners owners_;
  TaskAdmission admission_;
};

TEST_F(AdmissionTest, QueuesWithOwnerAndQuotaAndAnswersOnceAfterTheQuotaIsFreed) {
  int answers = 0;
  size_t unfinished_at_answer = 99;
  absl::StatusOr<uint64_t> task = admission_.Submit(
      alice_, "alice", Inference("shared", {Tensor("input", proto::DType::F32, {2, 3, 8, 8})}),
      [&](const absl::StatusOr<TaskOutcome>& out) {
        ++answers;
        unfinished_at_answer = quota_.unfinished("alice");
        EXPECT_TRUE(out.ok());
      });
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_EQ(sink_.queued.size(), 1u);
  EXPECT_EQ(sink_.queued[0].spec.principal, "alice") << "workers key lease owners by it";
  EXPECT_EQ(quota_.unfinished("alice"), 1u);
  EXPECT_TRUE(owners_.MayAccess(alice_, *task));
  EXPECT_FALSE(owners_.MayAccess(bob_, *task));
  EXPECT_EQ(answers, 0);
  sink_.Answer(0, TaskOutcome{});
  EXPECT_EQ(answers, 1);
  EXPECT_EQ(unfinished_at_answer, 0u) << "the quota is released before the answer";
}

TEST_F(AdmissionTest, RefusalsQueueNothingAndCountNothing) {
  auto refused = [&](const Principal& who, TaskSpec spec) {
    bool answered = false;
    absl::StatusOr<uint64_t> task =
        admission_.Submit(who, who.name, std::move(spec),
                          [&](const absl::StatusOr<TaskOutcome>&) { answered = true; });
    EXPECT_TRUE(sink_.queued.empty());
    EXPECT_EQ(quota_.unfinished(who.name), 0u);
    EXPECT_FALSE(answered);
    return task.status();
  };
  const auto f32 = proto::DType::F32;
  EXPECT_EQ(refused(alice_, Inference("nope", {Tensor("input", f32, {1, 3, 8, 8})})).code(),
            absl::StatusCode::kNotFound);
  // Inputs against the model's recorded input: name, dtype, rank, duplicates, extras' shape.
  for (std::vector<proto::HostTensor> bad : std::vector<std::vector<proto::HostTensor>>{
           {},
           {Tensor("pixels", f32, {1, 3, 8, 8})},
           {Tensor("input", proto::DType::I64, {1, 3, 8, 8})},
           {Tensor("input", f32, {1, 192})},
           {Tensor("input", f32, {1, 3, 8, 8}), Tensor("input", f32, {1, 3, 8, 8})},
           {Tensor("input", f32, {1, 3, 8, 8}), Tensor("attention_mask", proto::DType::I64, {1})},
       }) {
    absl::Status status = refused(alice_, Inference("shared", bad));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("'shared'"));
  }
  // Another user's copy is as absent as a model that does not exist.
  sink_.Add("bobs", {}, "bob");
  absl::Status hidden = refused(alice_, Inference("bobs", {Tensor("input", f32, {1, 3, 8, 8})}));
  EXPECT_EQ(hidden.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(hidden.message(), HasSubstr("not registered"));
  // The scheduler's own refusal.
  sink_.queue_error = absl::ResourceExhaustedError("queue full");
  EXPECT_EQ(refused(alice_, Inference("shared", {Tensor("input", f32, {1, 3, 8, 8})})).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(AdmissionTest, TheClientsQuotaCapsUnfinishedTasks) {
  auto submit = [&] {
    return admission_.Submit(
        alice_, "alice", Inference("shared", {Tensor("input", proto::DType::F32, {1, 3, 8, 8})}),
        [](const absl::StatusOr<TaskOutcome>&) {});
  };
  ASSERT_TRUE(submit().ok());
  ASSERT_TRUE(submit().ok());
  EXPECT_EQ(submit().status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sink_.queued.size(), 2u);
  sink_.Answer(0, absl::CancelledError("cancelled"));
  EXPECT_TRUE(submit().ok()) << "a finished task frees its place, failed or not";
}

TEST_F(AdmissionTest, DeadlinesAreCappedAtADay) {
  TaskSpec spec = Inference("shared", {Tensor("input", proto::DType::F32, {1, 3, 8, 8})});
  spec.deadline = absl::Now() + absl::Hours(24 * 365);
  ASSERT_TRUE(admission_.Submit(alice_, "alice", spec, [](const auto&) {}).ok());
  spec.deadline = absl::Now() + absl::Seconds(5);
  ASSERT_TRUE(admission_.Submit(alice_, "alice", spec, [](const auto&) {}).ok());
  ASSERT_EQ(sink_.queued.size(), 2u);
  EXPECT_LE(sink_.queued[0].spec.deadline, absl::Now() + kMaxTaskDeadline);
  EXPECT_GT(sink_.queued[0].spec.deadline, absl::Now() + kMaxTaskDeadline - absl::Minutes(1));
  EXPECT_EQ(sink_.queued[1].spec.deadline, spec.deadline) << "a nearer deadline is kept";
}

TEST_F(AdmissionTest, OnlyAdminsAndNamedTrainersTrainAModelInPlace) {
  absl::StatusOr<uint64_t> denied =
      admission_.Submit(bob_, "bob", Training("shared"), [](const auto&) {});
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr("copy name"));
  EXPECT_EQ(admission_.Submit(bob_, "bob", Training("team"), [](const auto&) {}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(sink_.queued.empty());
  EXPECT_TRUE(admission_.Submit(carol_, "carol", Training("team"), [](const auto&) {}).ok());
  EXPECT_TRUE(admission_.Submit(root_, "root", Training("shared"), [](const auto&) {}).ok());
  ASSERT_EQ(sink_.queued.size(), 2u);
  EXPECT_EQ(sink_.queued[0].spec.model, "team");
  EXPECT_EQ(sink_.queued[1].spec.model, "shared");
}

TEST_F(AdmissionTest, AUsersTrainingTrainsItsOwnCopyAnsweredAfterItsAcceptance) {
  sink_.answer_at_once = true;  // the answer races the acceptance: it must wait for it
  std::vector<std::string> events;
  admission_.SubmitOnCopy(
      bob_, "bob", Training("shared"), "bobs-shared",
      [&](const absl::StatusOr<uint64_t>& task) {
        ASSERT_TRUE(task.ok()) << task.status();
        events.push_back(absl::StrCat("accepted ", *task));
      },
      [&](const absl::StatusOr<TaskOutcome>& out) {
        EXPECT_TRUE(out.ok());
        EXPECT_EQ(quota_.unfinished("bob"), 0u);
        events.push_back("done");
      });
  ASSERT_EQ(sink_.copies.size(), 1u);
  EXPECT_EQ(sink_.copies[0].original, "shared");
  EXPECT_EQ(sink_.copies[0].owner, "bob");
  EXPECT_EQ(quota_.unfinished("bob"), 1u) << "the copy and its training count from the start";
  EXPECT_TRUE(events.empty());
  sink_.RegisterNextCopy();
  ASSERT_EQ(sink_.queued.size(), 1u);
  EXPECT_EQ(sink_.queued[0].spec.model, "bobs-shared") << "the copy is trained, not the original";
  EXPECT_EQ(sink_.queued[0].spec.principal, "bob");
  EXPECT_THAT(events, ::testing::ElementsAre("accepted 1", "done"));
  EXPECT_TRUE(owners_.MayAccess(bob_, 1));

  // The copy is bob's: he sees, trains and unloads it; alice sees nothing of it.
  EXPECT_TRUE(admission_.FindModel(bob_, "bobs-shared").ok());
  EXPECT_EQ(admission_.FindModel(alice_, "bobs-shared").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(admission_.FindModel(root_, "bobs-shared").ok());
  auto names = [&](const Principal& who) {
    std::vector<std::string> out;
    for (const EntryRef& e : admission_.ListModels(who)) out.push_back(e->request.name);
    return out;
  };
  EXPECT_THAT(names(alice_), ::testing::ElementsAre("shared", "team"));
  EXPECT_THAT(names(bob_), ::testing::ElementsAre("bobs-shared", "shared", "team"));
  EXPECT_TRUE(admission_.Submit(bob_, "bob", Training("bobs-shared"), [](const auto&) {}).ok());
  EXPECT_EQ(admission_.Submit(alice_, "alice", Training("bobs-shared"), [](const auto&) {})
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(admission_.CheckUnload(bob_, "bobs-shared").ok());
  EXPECT_TRUE(admission_.CheckUnload(root_, "bobs-shared").ok());
  EXPECT_EQ(admission_.CheckUnload(alice_, "bobs-shared").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(admission_.CheckUnload(bob_, "shared").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(admission_.CheckUnload(carol_, "team").ok());
}

TEST_F(AdmissionTest, CopyRefusalsRegisterNothingAndAnswerOnlyTheRefusal) {
  sink_.Add("bobs", {}, "bob");
  auto refused = [&](const Principal& who, TaskSpec spec, std::string copy) {
    absl::Status status;
    int acceptances = 0;
    bool answered = false;
    admission_.SubmitOnCopy(
        who, who.name, std::move(spec), std::move(copy),
        [&](const absl::StatusOr<uint64_t>& task) {
          ++acceptances;
          status = task.status();
        },
        [&](const absl::StatusOr<TaskOutcome>&) { answered = true; });
    EXPECT_EQ(acceptances, 1);
    EXPECT_FALSE(answered);
    EXPECT_TRUE(sink_.copies.empty());
    EXPECT_EQ(quota_.unfinished(who.name), 0u);
    return status.code();
  };
  EXPECT_EQ(refused(alice_, Training("shared"), ""), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(alice_, Training("shared"), "fill-7"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused(alice_, Training("shared"), "team"), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(refused(alice_, Training("bobs"), "mine"), absl::StatusCode::kNotFound);
  EXPECT_EQ(refused(alice_, Inference("shared", {}), "mine"), absl::StatusCode::kInvalidArgument);
  // Each copy holds a model's weights in pinned memory: a user's are capped, an admin's not.
  TaskAdmission capped(&sink_, &quota_, &owners_, /*max_copies=*/1);
  auto capped_code = [&](const Principal& who, std::string copy) {
    absl::Status status;
    capped.SubmitOnCopy(
        who, who.name, Training("shared"), std::move(copy),
        [&](const absl::StatusOr<uint64_t>& task) { status = task.status(); },
        [](const absl::StatusOr<TaskOutcome>&) {});
    return status.code();
  };
  EXPECT_EQ(capped_code(bob_, "bobs-2"), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(sink_.copies.empty());
  EXPECT_EQ(capped_code(root_, "roots"), absl::StatusCode::kOk);
  ASSERT_EQ(sink_.copies.size(), 1u);
  sink_.copies.clear();
  quota_.Done("root");

  // A copy registered, then its training refused: one refusal, the quota freed.
  sink_.queue_error = absl::ResourceExhaustedError("queue full");
  absl::Status status;
  admission_.SubmitOnCopy(
      alice_, "alice", Training("shared"), "mine",
      [&](const absl::StatusOr<uint64_t>& task) { status = task.status(); },
      [](const absl::StatusOr<TaskOutcome>&) { ADD_FAILURE() << "no answer after a refusal"; });
  sink_.RegisterNextCopy();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("'mine' is registered"));
  EXPECT_EQ(quota_.unfinished("alice"), 0u);
}

// A client's transfer area of `bytes`: a memfd sealed against shrinking, as the Unix socket
// takes it.
std::shared_ptr<const dataplane::TransferRegion> Area(uint64_t bytes, const std::string& owner) {
  UniqueFd fd(::memfd_create("admission-test-area", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto area = dataplane::TransferRegion::FromSealedMemfd(std::move(fd), bytes, owner);
  EXPECT_TRUE(area.ok()) << area.status();
  return *area;
}

// Issue 26: the descriptors a client sends name bytes pswitchd never looks at, so every one is
// checked against the caller's own regions before anything runs.
class PlacementTest : public ::testing::Test {
 protected:
  PlacementTest() {
    model_.request.name = "m";
    model_.input = {"input", proto::DType::F32, {-1, 3, 8, 8}};
    model_.output = {"output", proto::DType::F32, {-1, 10}};
    area_ = Area(1 << 20, "alice");
    EXPECT_TRUE(regions_.Add("", area_).ok());
    bobs_ = Area(1 << 20, "bob");
    EXPECT_TRUE(regions_.Add("", bobs_).ok());
  }
  // A batch-2 input at `offset` of region `region`, and (output_length > 0) an output space.
  TaskSpec Spec(uint64_t region, uint64_t offset, uint64_t output_offset = 1 << 19,
                uint64_t output_length = 80) {
    TaskSpec spec;
    spec.model = "m";
    proto::HostTensor input;
    input.name = "input";
    input.dtype = proto::DType::F32;
    input.shape = {2, 3, 8, 8};  // 1,536 bytes
    input.place = proto::Place::Region;
    input.slice = proto::ByteSlice{region, offset, 1536};
    spec.inputs.push_back(std::move(input));
    if (output_length > 0) {
      spec.outputs_to = proto::ByteSlice{region, output_offset, output_length};
    }
    return spec;
  }
  absl::Status Resolve(TaskSpec& spec, const Principal& who) {
    return ResolvePlacement(&regions_, who, model_, spec);
  }

  CatalogEntry model_;
  dataplane::RegionTable regions_;
  std::shared_ptr<const dataplane::TransferRegion> area_, bobs_;
  const Principal alice_{"alice", Role::kUser};
};

TEST_F(PlacementTest, InputsAndOutputsInTheCallersAreaHoldItOnce) {
  TaskSpec spec = Spec(area_->id(), 0);
  ASSERT_TRUE(Resolve(spec, alice_).ok()) << Resolve(spec, alice_);
  ASSERT_EQ(spec.regions.size(), 1u);
  EXPECT_EQ(spec.regions[0]->id(), area_->id());
  // The output needs 2 x 10 floats at batch 2.
  EXPECT_EQ(*OutputBytesNeeded(model_, spec.inputs), 80u);
}

TEST_F(PlacementTest, SlicesOutsideTheAreaAreRefusedWithoutOverflow) {
  TaskSpec past_end = Spec(area_->id(), (1 << 20) - 1000);
  EXPECT_EQ(Resolve(past_end, alice_).code(), absl::StatusCode::kOutOfRange);
  TaskSpec overflow = Spec(area_->id(), UINT64_MAX - 100);
  EXPECT_EQ(Resolve(overflow, alice_).code(), absl::StatusCode::kOutOfRange);
  TaskSpec output_past_end = Spec(area_->id(), 0, (1 << 20) - 40, 80);
  EXPECT_EQ(Resolve(output_past_end, alice_).code(), absl::StatusCode::kOutOfRange);
  TaskSpec output_overflow = Spec(area_->id(), 0, UINT64_MAX - 10, 80);
  EXPECT_EQ(Resolve(output_overflow, alice_).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(past_end.regions.empty());
}

TEST_F(PlacementTest, AnotherPrincipalsAreaLooksMissing) {
  TaskSpec foreign = Spec(bobs_->id(), 0);
  TaskSpec missing = Spec(999999, 0);
  const absl::Status a = Resolve(foreign, alice_);
  const absl::Status b = Resolve(missing, alice_);
  EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b.code(), absl::StatusCode::kNotFound);
  // The same words, but for the id the caller gave.
  EXPECT_EQ(absl::StrReplaceAll(a.message(), {{std::to_string(bobs_->id()), "N"}}),
            absl::StrReplaceAll(b.message(), {{"999999", "N"}}));
  // Bob's own area is his, as an output space too.
  TaskSpec bobs = Spec(bobs_->id(), 0);
  EXPECT_TRUE(Resolve(bobs, Principal{"bob", Role::kUser}).ok());
  // An output space in another's area, with the input in one's own.
  TaskSpec split = Spec(area_->id(), 0, 0, 0);
  split.outputs_to = proto::ByteSlice{bobs_->id(), 0, 80};
  EXPECT_EQ(Resolve(split, alice_).code(), absl::StatusCode::kNotFound);
}

TEST_F(PlacementTest, AnOutputOverlappingAnInputIsRefused) {
  TaskSpec overlap = Spec(area_->id(), 1000, 2000, 80);  // input [1000, 2536)
  const absl::Status status = Resolve(overlap, alice_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("overlaps input 'input'"));
  TaskSpec touching = Spec(area_->id(), 1000, 2536, 80);  // adjacent is fine
  EXPECT_TRUE(Resolve(touching, alice_).ok());
  TaskSpec before = Spec(area_->id(), 1000, 920, 80);  // ends where the input starts
  EXPECT_TRUE(Resolve(before, alice_).ok());
}

TEST_F(PlacementTest, AnOutputSpaceTooSmallNamesBothSizes) {
  TaskSpec small = Spec(area_->id(), 0, 4096, 64);
  const absl::Status status = Resolve(small, alice_);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("64"));
  EXPECT_THAT(status.message(), HasSubstr("80"));
}

TEST_F(PlacementTest, ALengthUnlikeTheShapeAndRawPayloadsAreRefused) {
  TaskSpec short_slice = Spec(area_->id(), 0);
  short_slice.inputs[0].slice.length = 1535;
  EXPECT_EQ(Resolve(short_slice, alice_).code(), absl::StatusCode::kInvalidArgument);
  TaskSpec payload = Spec(area_->id(), 0);
  payload.inputs[0].place = proto::Place::Payload;
  payload.inputs[0].slice.region = 0;
  // A Payload slice no port placed (PlacePayload) is refused, never taken for a region.
  EXPECT_EQ(Resolve(payload, alice_).code(), absl::StatusCode::kInvalidArgument);
  TaskSpec no_table = Spec(area_->id(), 0);
  EXPECT_EQ(ResolvePlacement(nullptr, alice_, model_, no_table).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(PlacementTest, PayloadSlicesBecomeSlicesOfTheStagingRegionOnlyInsideThePayload) {
  auto staging = dataplane::TransferRegion::NewStaging(1 << 16, "alice");
  ASSERT_TRUE(staging.ok()) << staging.status();
  auto payload_input = [this](uint64_t offset, uint64_t length) {
    TaskSpec spec = Spec(0, 0, 0, 0);
    spec.inputs[0].place = proto::Place::Payload;
    spec.inputs[0].slice = proto::ByteSlice{0, offset, length};
    return spec;
  };
  const uint64_t bytes = 1536;  // the input's dtype and shape
  TaskSpec placed = payload_input(64, bytes);
  ASSERT_TRUE(PlacePayload(placed.inputs, 64 + bytes, **staging).ok());
  EXPECT_EQ(placed.inputs[0].place, proto::Place::Region);
  EXPECT_EQ(placed.inputs[0].slice.region, (*staging)->id());
  EXPECT_EQ(placed.inputs[0].slice.offset, 64u);
  // One byte past the payload's end, an offset that would wrap, and a length unlike the shape.
  TaskSpec past = payload_input(65, bytes);
  EXPECT_EQ(PlacePayload(past.inputs, 64 + bytes, **staging).code(), absl::StatusCode::kOutOfRange);
  TaskSpec wrap = payload_input(UINT64_MAX - 8, bytes);
  EXPECT_EQ(PlacePayload(wrap.inputs, 64 + bytes, **staging).code(), absl::StatusCode::kOutOfRange);
  TaskSpec short_slice = payload_input(0, bytes - 1);
  EXPECT_EQ(PlacePayload(short_slice.inputs, 64 + bytes, **staging).code(),
            absl::StatusCode::kInvalidArgument);
  // A payload larger than its staging region is the port's bug, not the client's.
  TaskSpec big = payload_input(0, bytes);
  EXPECT_EQ(PlacePayload(big.inputs, (1 << 16) + 1, **staging).code(),
            absl::StatusCode::kInternal);
}

TEST_F(AdmissionTest, ARegionRefusalQueuesNothingAndAnAcceptedTaskHoldsItsArea) {
  dataplane::RegionTable regions;
  auto area = Area(1 << 16, "alice");
  ASSERT_TRUE(regions.Add("", area).ok());
  TaskAdmission admission(&sink_, &quota_, &owners_, 8, &regions);
  TaskSpec spec;
  spec.model = "shared";
  proto::HostTensor input;
  input.name = "input";
  input.dtype = proto::DType::F32;
  input.shape = {1, 3, 8, 8};
  input.place = proto::Place::Region;
  input.slice = proto::ByteSlice{area->id(), 64, 768};
  spec.inputs.push_back(input);
  // As Bob: Alice's area is not his.
  auto refused = admission.Submit(bob_, "bob", spec, [](const auto&) {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sink_.queued.empty());
  EXPECT_EQ(quota_.unfinished("bob"), 0u);
  auto accepted = admission.Submit(alice_, "alice", spec, [](const auto&) {});
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ASSERT_EQ(sink_.queued.size(), 1u);
  ASSERT_EQ(sink_.queued[0].spec.regions.size(), 1u);
  EXPECT_EQ(sink_.queued[0].spec.regions[0].get(), area.get());
  // Released from the table, the area lives on while the task holds it.
  ASSERT_TRUE(regions.Remove("alice", area->id()).ok());
  EXPECT_EQ(sink_.queued[0].spec.regions[0]->bytes(), uint64_t{1} << 16);
}

}  // namespace
}  // namespace pswitch::frontend
