#include "registry/model_repository.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/status.h"
#include "base/text.h"
#include "models/model_source.h"

namespace pswitch::registry {
namespace {

constexpr uint64_t kMaxConfigBytes = 64 << 10;
constexpr size_t kMaxTrainers = 256;

absl::StatusOr<std::string> StringField(const nlohmann::json& config, const std::string& where,
                                        const char* field, bool required) {
  auto it = config.find(field);
  if (it == config.end()) {
    if (!required) return std::string();
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing \"", field, "\""));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", field, "\" must be a string"));
  }
  return it->get<std::string>();
}

// "trainers": the principals (token names) who may train and unload the model besides admins.
absl::StatusOr<std::vector<std::string>> TrainersField(const nlohmann::json& config,
                                                       const std::string& where) {
  std::vector<std::string> trainers;
  auto it = config.find("trainers");
  if (it == config.end()) return trainers;
  if (!it->is_array() || it->size() > kMaxTrainers) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"trainers\" must be an array of at most ", kMaxTrainers, " names"));
  }
  for (const nlohmann::json& name : *it) {
    if (!name.is_string() || name.get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"trainers\" must hold non-empty strings"));
    }
    PSWITCH_RETURN_IF_ERROR(base::CheckText(name.get<std::string>(), "trainer name", 128));
    trainers.push_back(name.get<std::string>());
  }
  return trainers;
}

}  // namespace

absl::StatusOr<ModelRepository> ModelRepository::Open(const std::string& dir) {
  PSWITCH_ASSIGN_OR_RETURN(base::ConfinedDir root, base::ConfinedDir::Open(dir));
  return ModelRepository(std::move(root));
}

absl::StatusOr<std::vector<std::string>> ModelRepository::Index() const {
  PSWITCH_ASSIGN_OR_RETURN(std::vector<std::string> folders, root_.SubdirectoryNames());
  std::vector<std::string> models;
  for (const std::string& folder : folders) {
    absl::StatusOr<base::ConfinedDir> dir = root_.Sub(folder, "model folder");
    if (dir.ok() && dir->OpenForRead("config.json", "config", kMaxConfigBytes).ok()) {
      models.push_back(folder);
    }
  }
  return models;
}

absl::StatusOr<ModelRequest> ModelRepository::Request(const std::string& name,
                                                      const std::string* config_text) const {
  if (absl::StartsWith(name, kFillModelPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", name, "': names starting with '", kFillModelPrefix,
                     "' are reserved for fill jobs' own models; rename its folder"));
  }
  absl::StatusOr<base::ConfinedDir> folder = root_.Sub(name, "model");
  if (!folder.ok()) {
    if (absl::IsInvalidArgument(folder.status())) return folder.status();
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not in the model repository"));
  }
  std::string where = absl::StrCat("model repository: ", name, "/config.json");
  std::string text;
  if (config_text != nullptr) {
    // The client's config in place of the folder's: its files still resolve in the folder.
    if (config_text->size() > kMaxConfigBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", name, "': the config is over ", kMaxConfigBytes, " bytes"));
    }
    where = absl::StrCat("model '", name, "': the given config");
    text = *config_text;
  } else {
    PSWITCH_ASSIGN_OR_RETURN(text, folder->Read("config.json", "config", kMaxConfigBytes));
  }
  PSWITCH_ASSIGN_OR_RETURN(nlohmann::json config, base::ParseUntrustedJson(text, where));
  if (!config.is_object())
    return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  ModelRequest request;
  request.name = name;
  PSWITCH_ASSIGN_OR_RETURN(request.archive_path, StringField(config, where, "archive", false));
  PSWITCH_ASSIGN_OR_RETURN(
      request.zoo_model, StringField(config, where, "architecture", request.archive_path.empty()));
  if (!request.archive_path.empty()) {
    // The user's own model: its archive is its architecture.
    if (!request.zoo_model.empty() && request.zoo_model != models::kScriptArchitecture) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"archive\" and \"architecture\" '",
                                                     request.zoo_model,
                                                     "' both name the model; keep one"));
    }
    request.zoo_model = models::kScriptArchitecture;
  }
  PSWITCH_ASSIGN_OR_RETURN(request.weights_path, StringField(config, where, "weights", false));
  PSWITCH_ASSIGN_OR_RETURN(request.plan, StringField(config, where, "plan", false));
  PSWITCH_ASSIGN_OR_RETURN(request.dtype, StringField(config, where, "dtype", false));
  if (request.plan.empty()) request.plan = "auto";
  auto batch = config.find("batch");
  if (batch != config.end()) {
    if (!batch->is_number_unsigned() || batch->get<uint64_t>() < 1 ||
        batch->get<uint64_t>() > UINT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"batch\" must be a positive integer"));
    }
    request.batch_size = static_cast<uint32_t>(batch->get<uint64_t>());
  }
  PSWITCH_ASSIGN_OR_RETURN(request.trainers, TrainersField(config, where));
  if (auto pin = config.find("pin_resident"); pin != config.end()) {
    if (!pin->is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"pin_resident\" must be true or false"));
    }
    request.pin_resident = pin->get<bool>();
  }
  for (const std::string* file : {&request.weights_path, &request.plan, &request.archive_path}) {
    if (!file->empty() && *file != "auto") {
      PSWITCH_RETURN_IF_ERROR(base::ConfinedDir::CheckName(*file, where));
    }
  }
  request.files = std::make_shared<const base::ConfinedDir>(std::move(*folder));
  return request;
}

absl::StatusOr<ModelRequest> ResolveModelRequest(ModelRequest from_client,
                                                 const ModelRepository* repository,
                                                 bool allow_client_paths) {
  const bool names_files = !from_client.weights_path.empty() || from_client.plan != "auto" ||
                           !from_client.archive_path.empty();
  if (from_client.zoo_model.empty() && !names_files) {
    if (repository == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "model '", from_client.name,
          "': this pswitchd has no --model-repository; name an architecture to register"));
    }
    PSWITCH_ASSIGN_OR_RETURN(ModelRequest request, repository->Request(from_client.name));
    // The registering admin's trainers join the config's.
    request.trainers.insert(request.trainers.end(), from_client.trainers.begin(),
                            from_client.trainers.end());
    // A precision the client names is the config's unless the config names another.
    if (!from_client.dtype.empty()) {
      if (!request.dtype.empty() && request.dtype != from_client.dtype) {
        return absl::InvalidArgumentError(absl::StrCat("model '", from_client.name,
                                                       "': its repository config registers it in ",
                                                       request.dtype, ", not ", from_client.dtype));
      }
      request.dtype = from_client.dtype;
    }
    // A pin the registering admin asks for holds whatever the config says.
    request.pin_resident = request.pin_resident || from_client.pin_resident;
    return request;
  }
  if (names_files && !allow_client_paths) {
    return absl::PermissionDeniedError(
        "this pswitchd does not open files clients name: put the model in its "
        "--model-repository and register it by name (or start pswitchd with "
        "--allow-client-paths=true for local use)");
  }
  for (const std::string* path :
       {&from_client.weights_path, &from_client.plan, &from_client.archive_path}) {
    if (!path->empty() && *path != "auto" && path->front() != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", *path, "': files named by clients must be absolute paths on the server"));
    }
  }
  if (!from_client.archive_path.empty()) {
    if (!from_client.zoo_model.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", from_client.name, "': name an architecture or an archive, not both"));
    }
    from_client.zoo_model = models::kScriptArchitecture;
  }
  from_client.files = nullptr;
  return from_client;
}

}  // namespace pswitch::registry
