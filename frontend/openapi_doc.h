// docs/openapi.json, built into pswitchd (GET /openapi.json): the document and the routes
// served cannot drift apart unnoticed (HttpOpenApiE2eTest compares them).
#ifndef PSWITCH_FRONTEND_OPENAPI_DOC_H_
#define PSWITCH_FRONTEND_OPENAPI_DOC_H_

#include "absl/strings/string_view.h"

namespace pswitch::frontend {

absl::string_view OpenApiDocument();

}  // namespace pswitch::frontend

#endif  // PSWITCH_FRONTEND_OPENAPI_DOC_H_
