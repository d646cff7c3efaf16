"""pswitch's exceptions: one class per status code pswitchd answers with.

Each carries `.code` (the status code's name, e.g. "NOT_FOUND") and the server's message. Where a
builtin exception means the same, the class derives from it too, as torch's own errors do
(InvalidArgumentError is a ValueError, DeadlineExceededError a TimeoutError, ...).
"""


class PswitchError(Exception):
    """Base of every error pswitchd or the client library reports."""

    code = "UNKNOWN"

    def __init__(self, message="", code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return f"{self.code}: {self.message}"


class CancelledError(PswitchError):
    code = "CANCELLED"


class UnknownError(PswitchError):
    code = "UNKNOWN"


class InvalidArgumentError(PswitchError, ValueError):
    code = "INVALID_ARGUMENT"


class DeadlineExceededError(PswitchError, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class NotFoundError(PswitchError, LookupError):
    code = "NOT_FOUND"


class AlreadyExistsError(PswitchError):
    code = "ALREADY_EXISTS"


class PermissionDeniedError(PswitchError, PermissionError):
    code = "PERMISSION_DENIED"


class ResourceExhaustedError(PswitchError):
    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(PswitchError):
    code = "FAILED_PRECONDITION"


class AbortedError(PswitchError):
    code = "ABORTED"


class OutOfRangeError(PswitchError, ValueError):
    code = "OUT_OF_RANGE"


class UnimplementedError(PswitchError, NotImplementedError):
    code = "UNIMPLEMENTED"


class InternalError(PswitchError):
    code = "INTERNAL"


class UnavailableError(PswitchError, ConnectionError):
    code = "UNAVAILABLE"


class DataLossError(PswitchError):
    code = "DATA_LOSS"


class UnauthenticatedError(PswitchError, PermissionError):
    code = "UNAUTHENTICATED"


_BY_CODE = {cls.code: cls for cls in (
    CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError, NotFoundError,
    AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError, FailedPreconditionError,
    AbortedError, OutOfRangeError, UnimplementedError, InternalError, UnavailableError,
    DataLossError, UnauthenticatedError)}


def from_status(code, message):
    """The exception for an absl status code name (the binding calls this)."""
    cls = _BY_CODE.get(code, PswitchError)
    return cls(message, code=code)
