#include "frontend/http_message.h"

#include "nlohmann/json.hpp"

namespace pswitch::frontend {

void SetJsonError(HttpResponse& res, int status, absl::string_view message) {
  res.status = status;
  res.tail.clear();
  res.tail_owner.reset();
  res.set_content(nlohmann::json{{"error", std::string(message)}}.dump(
                      -1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

}  // namespace pswitch::frontend
