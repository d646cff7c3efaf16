// Status helpers shared by every pswitch module.
//
// Debian's Abseil (20220623) predates absl's own RETURN_IF_ERROR / ASSIGN_OR_RETURN, so the
// project keeps its pair here. Errors cross module edges as absl::Status with the standard
// codes; the wire form (proto/common.fbs ErrorCode) converts through the two functions below.
#ifndef PSWITCH_BASE_STATUS_H_
#define PSWITCH_BASE_STATUS_H_

#include <cerrno>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define PSWITCH_STATUS_CONCAT_INNER_(a, b) a##b
#define PSWITCH_STATUS_CONCAT_(a, b) PSWITCH_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define PSWITCH_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::absl::Status pswitch_status_ = (expr);           \
    if (!pswitch_status_.ok()) return pswitch_status_; \
  } while (0)

// `lhs = *expr` for an absl::StatusOr<T> `expr`, returning its status from the enclosing
// function if not OK. `lhs` may declare a variable: PSWITCH_ASSIGN_OR_RETURN(auto x, F());
#define PSWITCH_ASSIGN_OR_RETURN(lhs, expr) \
  PSWITCH_ASSIGN_OR_RETURN_IMPL_(PSWITCH_STATUS_CONCAT_(pswitch_statusor_, __LINE__), lhs, expr)
#define PSWITCH_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

namespace pswitch {

// An error status for a failed system call: code from errno, message "what: strerror".
absl::Status ErrnoStatus(absl::string_view what, int errno_value = errno);

}  // namespace pswitch

#endif  // PSWITCH_BASE_STATUS_H_
