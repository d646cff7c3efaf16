// docs/openapi.json, built into pswitchd (GET /openapi.json): the document and the routes
// served cannot drift apart unnoticed (HttpOpenApiE2eTest compares them).
#ifndef PSWITCH_CONTROLLER_OPENAPI_DOC_H_
#define PSWITCH_CONTROLLER_OPENAPI_DOC_H_

#include "absl/strings/string_view.h"

namespace pswitch::controller {

absl::string_view OpenApiDocument();

}  // namespace pswitch::controller

#endif  // PSWITCH_CONTROLLER_OPENAPI_DOC_H_
