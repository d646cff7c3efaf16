// make_fuzz_seeds CORPUS_DIR: writes the fuzz targets' seed corpora, CORPUS_DIR/<target>/<seed>
// (`cmake --build build-fuzz --target fuzz_seeds` writes fuzz/corpus). The seeds are checked in;
// rerun this after a schema or format change and commit what changed. Files it does not write
// (seeds added by hand, crashes kept as seeds) are left alone.
//
// Each corpus holds valid inputs of every kind the target reads, a few edge cases, and the
// attacks of issue 14 (deep JSON nesting; a reply sent as a request; an unknown enum value).
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fill/bubble_cycle.h"
#include "grouping/cost_model.h"
#include "grouping/profile.h"
#include "grouping/search.h"
#include "models/model_facts.h"
#include "models/safetensors.h"
#include "proto/client_generated.h"
#include "proto/framing.h"
#include "proto/host_tensor.h"
#include "proto/memdaemon_generated.h"
#include "proto/worker_generated.h"

namespace pswitch::fuzz {
namespace {

using Builder = flatbuffers::FlatBufferBuilder;
using proto::ClientRequestBody;

std::string g_root;
int g_written = 0;

void Die(const std::string& what) {
  std::fprintf(stderr, "make_fuzz_seeds: %s\n", what.c_str());
  std::exit(1);
}

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = absl::StrCat(g_root, "/", target);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) Die("cannot create " + dir);
  std::ofstream out(absl::StrCat(dir, "/", name), std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) Die(absl::StrCat("cannot write ", dir, "/", name));
  ++g_written;
}

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// ---- fuzz_frames: byte 0 picks the read sizes (see fuzz_frames.cc), then framed payloads.

std::string Framed(const Builder& b) {
  absl::StatusOr<std::vector<uint8_t>> frame = proto::EncodeFrame(b);
  if (!frame.ok()) Die(frame.status().ToString());
  return std::string(frame->begin(), frame->end());
}

std::string Request(ClientRequestBody type,
                    const std::function<flatbuffers::Offset<void>(Builder&)>& body,
                    uint64_t id = 7) {
  Builder b;
  auto offset = body(b);
  proto::Finish(b, proto::CreateClientRequest(b, id, type, offset));
  return Framed(b);
}

std::vector<proto::HostTensor> Inputs() {
  proto::HostTensor image{"input", proto::DType::F32, {1, 2, 2}, std::vector<uint8_t>(16, 0x3f)};
  proto::HostTensor labels{"labels", proto::DType::I64, {1}, std::vector<uint8_t>(8, 1)};
  return {image, labels};
}

constexpr char kCycleJson[] =
    R"({"period_ns":100000000,"bubbles":[{"offset_ns":0,"duration_ns":30000000,)"
    R"("free_bytes":4294967296},{"offset_ns":40000000,"duration_ns":14000001,)"
    R"("free_bytes":8589934592}]})";

flatbuffers::Offset<proto::FillSubmit> Fill(Builder& b, proto::FillKind kind) {
  return proto::CreateFillSubmitDirect(b, kind, "resnet18", "jobs/in.safetensors",
                                       "jobs/out.safetensors", /*batch=*/4, /*steps=*/10,
                                       /*seed=*/1, /*step_us=*/2500, /*memory_bytes=*/1 << 28,
                                       /*deadline_ms=*/60000, /*synthetic_step_us=*/100,
                                       /*synthetic_alloc_bytes=*/1 << 20);
}

// One framed request of each body type, named by the type.
std::map<std::string, std::string> EveryRequest() {
  std::map<std::string, std::string> out;
  out["register_model"] = Request(ClientRequestBody::RegisterModel, [](Builder& b) {
    return proto::CreateRegisterModelDirect(b, "resnet50", "resnet50", "", 8, "auto").Union();
  });
  out["submit_inference"] = Request(ClientRequestBody::SubmitTask, [](Builder& b) {
    auto inputs = proto::CreateWireTensors(b, Inputs());
    return proto::CreateSubmitTask(b, b.CreateString("tiny_cnn"), proto::TaskKind::Inference,
                                   inputs, 1, 0, /*priority=*/2, /*deadline_ms=*/500)
        .Union();
  });
  out["submit_training"] = Request(ClientRequestBody::SubmitTask, [](Builder& b) {
    return proto::CreateSubmitTask(b, b.CreateString("tiny_cnn"), proto::TaskKind::Training, 0,
                                   /*iterations=*/100, /*seed=*/3, 0, 0, proto::Optimizer::Adam,
                                   1e-3, 0.9, /*batch_size=*/16)
        .Union();
  });
  out["submit_training_copy"] = Request(ClientRequestBody::SubmitTask, [](Builder& b) {
    return proto::CreateSubmitTask(b, b.CreateString("tiny_cnn"), proto::TaskKind::Training, 0,
                                   /*iterations=*/10, /*seed=*/3, 0, 0, proto::Optimizer::Sgd, 10,
                                   0.9, /*batch_size=*/0, b.CreateString("my-cnn"))
        .Union();
  });
  out["register_model_trainers"] = Request(ClientRequestBody::RegisterModel, [](Builder& b) {
    auto trainers = b.CreateVectorOfStrings(std::vector<std::string>{"alice", "bob"});
    return proto::CreateRegisterModel(b, b.CreateString("shared"), b.CreateString("tiny_cnn"), 0, 1,
                                      0, 0, trainers)
        .Union();
  });
  out["query_task"] = Request(ClientRequestBody::QueryTask,
                              [](Builder& b) { return proto::CreateQueryTask(b, 42).Union(); });
  out["cancel_task"] = Request(ClientRequestBody::CancelTask,
                               [](Builder& b) { return proto::CreateCancelTask(b, 42).Union(); });
  out["unload_model"] = Request(ClientRequestBody::UnloadModel, [](Builder& b) {
    return proto::CreateUnloadModel(b, b.CreateString("resnet50")).Union();
  });
  out["list_models"] = Request(ClientRequestBody::ListModels,
                               [](Builder& b) { return proto::CreateListModels(b).Union(); });
  out["list_tasks"] = Request(ClientRequestBody::ListTasks,
                              [](Builder& b) { return proto::CreateListTasks(b, 20).Union(); });
  out["bubble_begin"] = Request(ClientRequestBody::BubbleBegin, [](Builder& b) {
    return proto::CreateBubbleBegin(b, 1, 30000, 1ull << 30, 123456789).Union();
  });
  out["bubble_end"] = Request(ClientRequestBody::BubbleEnd,
                              [](Builder& b) { return proto::CreateBubbleEnd(b, 1).Union(); });
  out["register_bubble_cycle"] = Request(ClientRequestBody::RegisterBubbleCycle, [](Builder& b) {
    return proto::CreateRegisterBubbleCycleDirect(b, 0, kCycleJson, 0).Union();
  });
  out["fill_submit"] = Request(ClientRequestBody::FillSubmit, [](Builder& b) {
    return Fill(b, proto::FillKind::Inference).Union();
  });
  out["fill_query"] = Request(ClientRequestBody::FillQuery,
                              [](Builder& b) { return proto::CreateFillQuery(b, 3).Union(); });
  out["fill_stats"] = Request(ClientRequestBody::FillStatsQuery,
                              [](Builder& b) { return proto::CreateFillStatsQuery(b).Union(); });
  out["fill_estimate"] = Request(ClientRequestBody::FillEstimateQuery, [](Builder& b) {
    return proto::CreateFillEstimateQuery(b, Fill(b, proto::FillKind::Training)).Union();
  });
  out["fill_cancel"] = Request(ClientRequestBody::FillCancel,
                               [](Builder& b) { return proto::CreateFillCancel(b, 3).Union(); });
  out["authenticate"] = Request(ClientRequestBody::Authenticate, [](Builder& b) {
    return proto::CreateAuthenticateDirect(b, "3q5Jk8vN0tX9Yc2mPq7RzL1w").Union();
  });
  return out;
}

void FrameSeeds() {
  const std::string t = "fuzz_frames";
  const std::map<std::string, std::string> requests = EveryRequest();
  for (const auto& [name, frame] : requests) {
    Write(t, "request_" + name, std::string(1, '\0') + frame);
  }
  // Several requests on one connection, arriving in reads of 1..7 and 1..200 bytes.
  const std::string stream = requests.at("authenticate") + requests.at("submit_inference") +
                             requests.at("register_bubble_cycle") + requests.at("query_task");
  Write(t, "stream_small_reads", std::string(1, '\x07') + stream);
  Write(t, "stream_large_reads", std::string(1, '\xc8') + stream);

  // The other protocols' roots (each identifier verifies as its own type only).
  {
    Builder b;
    auto ack = proto::CreateAck(b);
    proto::Finish(b,
                  proto::CreateControllerReply(b, 7, proto::ControllerReplyBody::Ack, ack.Union()));
    Write(t, "reply_ack_sent_as_request", std::string(1, '\0') + Framed(b));
  }
  {
    Builder b;
    auto result = proto::CreateTaskResult(b, 42, proto::CreateWireTensors(b, Inputs()), 1500);
    proto::Finish(b, proto::CreateControllerReply(b, 7, proto::ControllerReplyBody::TaskResult,
                                                  result.Union()));
    Write(t, "reply_task_result", std::string(1, '\x03') + Framed(b));
  }
  {
    Builder b;
    std::vector<uint32_t> last = {3, 9, 20};
    auto prepare = proto::CreatePrepareDirect(b, "resnet18", 5, 0, &last);
    proto::Finish(
        b, proto::CreateWorkerCommand(b, 1, proto::WorkerCommandBody::Prepare, prepare.Union()));
    Write(t, "worker_command_prepare", std::string(1, '\0') + Framed(b));
  }
  {
    Builder b;
    auto drained = proto::CreateDrained(b, 5, 100, 110, 120);
    proto::Finish(b,
                  proto::CreateWorkerEvent(b, 1, proto::WorkerEventBody::Drained, drained.Union()));
    Write(t, "worker_event_drained", std::string(1, '\0') + Framed(b));
  }
  {
    Builder b;
    auto lease = proto::CreateRequestLeaseDirect(b, "worker-1", 1 << 20);
    proto::Finish(
        b, proto::CreateMemRequest(b, 1, proto::MemRequestBody::RequestLease, lease.Union()));
    Write(t, "mem_request_lease", std::string(1, '\0') + Framed(b));
  }
  {
    Builder b;
    std::vector<uint8_t> handle(64, 0xab);
    auto grant = proto::CreateArenaGrantDirect(b, proto::Backend::Cuda, 0, 1ull << 30, &handle,
                                               4096, 16, 16, 256);
    proto::Finish(b, proto::CreateMemReply(b, 1, proto::MemReplyBody::ArenaGrant, grant.Union()));
    Write(t, "mem_reply_grant", std::string(1, '\0') + Framed(b));
  }

  // Edge cases: no identifier (the schema before issue 14), an unknown body type and enum
  // value, a zero length, a length over the maximum, a frame cut short.
  {
    Builder b;
    auto query = proto::CreateQueryTask(b, 42);
    b.Finish(proto::CreateClientRequest(b, 7, ClientRequestBody::QueryTask, query.Union()));
    Write(t, "edge_no_identifier", std::string(1, '\0') + Framed(b));
  }
  Write(t, "edge_unknown_body_type",
        std::string(1, '\0') + Request(static_cast<ClientRequestBody>(200), [](Builder& b) {
          return proto::CreateQueryTask(b, 1).Union();
        }));
  Write(t, "edge_unknown_task_kind",
        std::string(1, '\0') + Request(ClientRequestBody::SubmitTask, [](Builder& b) {
          return proto::CreateSubmitTask(b, b.CreateString("tiny_cnn"),
                                         static_cast<proto::TaskKind>(7))
              .Union();
        }));
  Write(t, "edge_non_utf8_name",
        std::string(1, '\0') + Request(ClientRequestBody::RegisterModel, [](Builder& b) {
          return proto::CreateRegisterModelDirect(b, "r\xff\xfe\x01", "resnet18").Union();
        }));
  Write(t, "edge_zero_length", std::string("\0\0\0\0\0", 5) + requests.at("query_task"));
  Write(t, "edge_over_maximum", std::string("\0\x01\x00\x00\x40", 5) + "abcdefgh");
  Write(t, "edge_truncated", std::string(1, '\x05') + requests.at("fill_submit").substr(0, 40));
  // Issue 14, item 1: a bubble cycle nested deep (20,000 levels here: the tests have 100,000).
  Write(t, "attack_deep_cycle_json",
        std::string(1, '\0') + Request(ClientRequestBody::RegisterBubbleCycle, [](Builder& b) {
          const std::string attack = "{\"period_ns\":" + Nested(20000) + ",\"bubbles\":[]}";
          return proto::CreateRegisterBubbleCycleDirect(b, 0, attack.c_str(), 0).Union();
        }));
}

// ---- fuzz_safetensors

std::string Safetensors(const std::vector<models::SafetensorsEntry>& entries,
                        const std::map<std::string, std::string>& metadata = {}) {
  absl::StatusOr<std::string> bytes = models::SerializeSafetensors(entries, metadata);
  if (!bytes.ok()) Die(bytes.status().ToString());
  return *bytes;
}

// A file with `header` as its JSON header (unpadded) and `data` after it.
std::string RawSafetensors(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

void SafetensorsSeeds() {
  const std::string t = "fuzz_safetensors";
  const std::vector<float> weight = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f, -0.125f};
  const std::vector<uint16_t> half = {0x3c00, 0x4000, 0xbc00, 0x0000};
  const std::vector<int64_t> index = {1, 2, 3, 4};
  Write(t, "one_tensor",
        Safetensors({{"fc.weight", models::DType::kF32, {2, 3}, weight.data(), 24}}));
  Write(t, "two_tensors_metadata",
        Safetensors({{"conv1.weight", models::DType::kF16, {4}, half.data(), 8},
                     {"num_batches_tracked", models::DType::kI64, {2, 2}, index.data(), 32}},
                    {{"format", "pt"}, {"model", "resnet18"}}));
  Write(t, "empty_tensor",
        Safetensors({{"empty", models::DType::kBF16, {0, 5}, nullptr, 0},
                     {"scalar", models::DType::kF32, {}, weight.data(), 4}}));
  Write(t, "edge_no_tensors", RawSafetensors("{}      ", ""));
  Write(t, "edge_header_past_end", RawSafetensors("{}", "").substr(0, 9));
  Write(t, "edge_overlap",
        RawSafetensors(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                       "abcd"));
  Write(t, "edge_not_safetensors", "root:$6$salt$hash:19000:0:99999:7:::\n");
  // Issue 14, item 1: a shape entry nested deep (30,000 levels; the tests have 100,000).
  Write(t, "attack_deep_shape",
        RawSafetensors(
            R"({"w":{"dtype":"F32","shape":[)" + Nested(30000) + R"(],"data_offsets":[0,4]}})",
            std::string(4, '\0')));
}

// ---- fuzz_model_facts

void ModelFactsSeeds() {
  const std::string t = "fuzz_model_facts";
  const std::string w(24, '\x3f'), b = "bias";
  models::ModelFacts facts;
  auto span = [](const std::string& s) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
  };
  facts.layers = {{"conv1", true, {{"weight", span(w)}, {"bias", span(b)}}},
                  {"relu", true, {}},
                  {"aux.fc", false, {{"weight", span(b)}}}};
  facts.train_order = {0, 1, 2};  // the aux head runs when training
  facts.optimizer_slot_bytes = 256;
  facts.input = {models::DType::kF32, {-1, 3, 32, 32}};
  facts.output = {models::DType::kF32, {-1, 10}};
  absl::StatusOr<std::string> encoded = models::EncodeModelFacts(facts);
  if (!encoded.ok()) Die(encoded.status().ToString());
  Write(t, "three_layers", *encoded);
  facts.trainable = absl::FailedPreconditionError("exported without a loss");
  facts.layers.resize(1);
  facts.train_order = {0};
  facts.input = {models::DType::kI64, {-1, 16}};
  encoded = models::EncodeModelFacts(facts);
  if (!encoded.ok()) Die(encoded.status().ToString());
  Write(t, "untrainable_token_input", *encoded);
  Write(t, "refusal", models::EncodeRefusal(absl::InvalidArgumentError("layer 'fc': float64")));
  Write(t, "edge_facts_metadata_not_json",
        Safetensors({}, {{"pswitch.facts", "{\"format\": 1, \"layers\": [["}}));
}

// ---- JSON targets

void BubbleCycleSeeds() {
  const std::string t = "fuzz_bubble_cycle";
  Write(t, "two_bubbles", kCycleJson);
  Write(t, "no_bubbles", R"({"period_ns": 250000000, "bubbles": []})");
  Write(t, "touching_bubbles",
        R"({"period_ns":100,"bubbles":[{"offset_ns":0,"duration_ns":50,"free_bytes":0},)"
        R"({"offset_ns":50,"duration_ns":50,"free_bytes":1}]})");
  Write(t, "edge_overlapping",
        R"({"period_ns":100,"bubbles":[{"offset_ns":0,"duration_ns":30,"free_bytes":0},)"
        R"({"offset_ns":29,"duration_ns":10,"free_bytes":0}]})");
  Write(t, "edge_unknown_field", R"({"period_ns":100,"bubbles":[],"period_us":1})");
  Write(t, "edge_huge_numbers",
        R"({"period_ns":9223372036854775807,"bubbles":[{"offset_ns":9223372036854775806,)"
        R"("duration_ns":18446744073709551615,"free_bytes":-1}]})");
  Write(t, "edge_float", R"({"period_ns":1e8,"bubbles":[]})");
  // Issue 14, item 1, as reported (30,000 levels here; the tests have 100,000).
  Write(t, "attack_deep_nesting", "{\"period_ns\":" + Nested(30000) + ",\"bubbles\":[]}");
}

// The 6-layer profile of tools/find_grouping_test.cc.
constexpr char kCliNetProfile[] = R"({
  "model": "cli-net", "bandwidth_bytes_per_s": 1e9, "transfer_overhead_s": 1e-5,
  "group_sync_overhead_s": 1e-5,
  "layers": [
    {"name": "conv1", "param_bytes": 1000000, "exec_s": 0.0008},
    {"name": "relu1", "param_bytes": 0, "exec_s": 0.00002},
    {"name": "conv2", "param_bytes": 2000000, "exec_s": 0.0015},
    {"name": "relu2", "param_bytes": 0, "exec_s": 0.00002},
    {"name": "conv3", "param_bytes": 3000000, "exec_s": 0.001},
    {"name": "fc", "param_bytes": 4000000, "exec_s": 0.0001}
  ]})";

void PlanSeeds() {
  const std::string t = "fuzz_plan";
  absl::StatusOr<grouping::Profile> profile = grouping::ParseProfileJson(kCliNetProfile);
  if (!profile.ok()) Die(profile.status().ToString());
  absl::StatusOr<grouping::CostModel> model = grouping::CostModel::Create(*profile);
  if (!model.ok()) Die(model.status().ToString());
  // find-grouping's output for each algorithm (search_s fixed so the seeds are reproducible).
  for (const char* algorithm : {"dp", "bnb", "single", "per-layer", "every-k"}) {
    grouping::SearchOptions options;
    options.algorithm = *grouping::ParseGroupingAlgorithm(algorithm);
    options.k = 4;
    absl::StatusOr<grouping::SearchOutcome> outcome = grouping::FindGrouping(*model, options);
    if (!outcome.ok()) Die(outcome.status().ToString());
    outcome->search_s = 1.25e-4;
    Write(t, absl::StrCat("find_grouping_", algorithm),
          grouping::SearchOutcomeToJson(*model, options, *outcome).dump() + "\n");
  }
  Write(t, "edge_gap", R"({"groups": [[0, 1], [3, 5]]})");
  Write(t, "edge_int_limits", R"({"groups": [[0, 2147483647], [-1, 4294967296]]})");
  Write(t, "edge_not_pairs", R"({"groups": [[0], [1, 2, 3], "x", [1.5, 2]]})");
  Write(t, "edge_no_groups", R"({"model": "m", "algorithm": "dp"})");
  // Issue 14, item 1: the plan-file variant of the deep nesting.
  Write(t, "attack_deep_nesting", "{\"groups\":" + Nested(30000) + "}");
}

void ProfileSeeds() {
  const std::string t = "fuzz_profile";
  Write(t, "cli_net", kCliNetProfile);
  // grouping/profile_test.cc's profile: an integral float byte count.
  Write(t, "tiny", R"({
  "model": "tiny",
  "bandwidth_bytes_per_s": 12e9,
  "transfer_overhead_s": 1.5e-5,
  "group_sync_overhead_s": 1e-5,
  "layers": [
    {"name": "conv1", "param_bytes": 37632, "exec_s": 0.0002},
    {"name": "relu", "param_bytes": 0, "exec_s": 0.00001},
    {"name": "fc", "param_bytes": 1e6, "exec_s": 0}
  ]
})");
  grouping::Profile resnetish{"resnet-ish", 25e9, 2e-5, 1e-5, {}};
  for (int i = 0; i < 24; ++i) {
    resnetish.layers.push_back({absl::StrCat("layer", i / 3, ".conv", i % 3),
                                int64_t{1} << (12 + i % 9), 1e-4 * (1 + i % 5)});
  }
  Write(t, "resnet_ish", grouping::ProfileToJson(resnetish).dump());
  Write(t, "edge_zero_bandwidth",
        R"({"model":"m","bandwidth_bytes_per_s":0,"transfer_overhead_s":0,)"
        R"("group_sync_overhead_s":0,"layers":[{"name":"a","param_bytes":1,"exec_s":1}]})");
  Write(t, "edge_overflowing_totals",
        R"({"model":"m","bandwidth_bytes_per_s":1e-300,"transfer_overhead_s":1e308,)"
        R"("group_sync_overhead_s":1e308,"layers":[{"name":"a","param_bytes":9223372036854775807,)"
        R"("exec_s":1e308},{"name":"b","param_bytes":9.2233720368547758e18,"exec_s":1e308}]})");
  Write(t, "edge_wrong_types",
        R"({"model":1,"bandwidth_bytes_per_s":"fast","layers":{"name":"a"}})");
  // Issue 14, item 1: the profile variant of the deep nesting.
  Write(t, "attack_deep_nesting", "{\"model\":\"m\",\"layers\":" + Nested(30000) + "}");
}

}  // namespace
}  // namespace pswitch::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds CORPUS_DIR\n");
    return 2;
  }
  pswitch::fuzz::g_root = argv[1];
  if (::mkdir(argv[1], 0755) != 0 && errno != EEXIST)
    pswitch::fuzz::Die("cannot create corpus dir");
  pswitch::fuzz::FrameSeeds();
  pswitch::fuzz::SafetensorsSeeds();
  pswitch::fuzz::ModelFactsSeeds();
  pswitch::fuzz::BubbleCycleSeeds();
  pswitch::fuzz::PlanSeeds();
  pswitch::fuzz::ProfileSeeds();
  std::printf("make_fuzz_seeds: wrote %d seeds under %s\n", pswitch::fuzz::g_written, argv[1]);
  return 0;
}
