"""Which storage errors are transient, and how a failure is reported.

Remote calls fail transiently (connection resets, timeouts, 500/502/503, SlowDown);
those are worth retrying (:mod:`.retry`). Permanent errors (403, 404, NoSuchBucket, a
full or read-only disk) are not. Every error that is not "absent" reaches the caller as
:class:`~ravex.format.errors.StorageError` (a ``RavexError`` and an ``OSError``) naming
the store, the operation, the key and the cause.
"""

from __future__ import annotations

import errno
from urllib.parse import urlsplit

from ..errors import StorageError

#: Exception classes (matched by name anywhere in the MRO, so that botocore, aiohttp and
#: fsspec need not be imported) that mean "the request may not have reached the server,
#: or its answer was lost": retried.
_TRANSIENT_CLASSES = frozenset(
    {
        "ConnectionError",  # builtin (reset, refused, aborted, broken pipe) and botocore's
        "TimeoutError",  # builtin, socket.timeout, fsspec FSTimeoutError, aiohttp timeouts
        "HTTPClientError",  # botocore: ConnectionClosedError, ReadTimeoutError, ResponseStreamingError
        "IncompleteReadError",
        "ResponseParserError",  # throttling answers with broken XML (s3fs issue 484)
        "ClientConnectionError",  # aiohttp: ServerDisconnectedError, ClientOSError
        "ClientPayloadError",
    }
)
#: Error codes of S3-style services that are worth retrying.
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "OperationAborted",
        "BadDigest",  # body damaged in transit
        "XAmzContentSHA256Mismatch",
    }
)
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504, 509})
_PERMANENT_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR}
)


def _http_status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    """Status and service error code of an HTTP error, looking through ``__cause__``."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            meta = response.get("ResponseMetadata") or {}
            err = response.get("Error") or {}
            status = meta.get("HTTPStatusCode")
            return (int(status) if status else None), err.get("Code")
        status = getattr(e, "status", None) or getattr(e, "code", None)  # aiohttp, gcsfs
        if isinstance(status, int) and 100 <= status < 600:
            return status, None
        e = e.__cause__ or e.__context__
        seen += 1
    return None, None


def is_transient(exc: BaseException) -> bool:
    """Whether an exception from a storage call is worth retrying."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)):
        return False
    status, code = _http_status_and_code(exc)
    if code is not None and code in _TRANSIENT_CODES:
        return True
    if status is not None:
        return status in _TRANSIENT_STATUS
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return False
    names = {c.__name__ for c in type(exc).__mro__}
    if names & _TRANSIENT_CLASSES:
        return True
    cause = exc.__cause__
    return cause is not None and cause is not exc and is_transient(cause)


def describe(exc: BaseException) -> str:
    """``HTTP 503 SlowDown: Please reduce your request rate.``, ``ConnectionResetError: ...``"""
    text = str(exc) or repr(exc)
    status, code = _http_status_and_code(exc)
    if status is not None:
        return f"HTTP {status}{f' {code}' if code else ''}: {text}"
    return f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text


#: Service error codes that say what to change, and the fix said with them.
_FIXES = {
    "NoSuchBucket": "create the bucket ({scheme}://{bucket}), or name one that exists",
    "AccessDenied": "use credentials allowed to {op} in {scheme}://{bucket} (AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, or a profile), or a bucket policy that allows them",
    "InvalidAccessKeyId": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile) to a key the "
                          "endpoint knows",
    "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY: it does not belong to the access key",
}


def _fix(url: str, op: str, exc: BaseException) -> str:
    """``; fix: ...`` for a service error that names what to change, else ``""``."""
    code = _http_status_and_code(exc)[1]
    fix = _FIXES.get(code or "")
    if fix is None:
        return ""
    parts = urlsplit(url)
    return "; fix: " + fix.format(scheme=parts.scheme, bucket=parts.netloc, op=op)


def storage_error(url: str, op: str, key: str, exc: BaseException, note: str = "") -> StorageError:
    """The error a caller sees: the store, the operation, the key and the cause (its errno
    kept), and the fix where the service's answer names one."""
    err = StorageError(f"store {url!r}: {op} {key!r} failed{note}: {describe(exc)}{_fix(url, op, exc)}")
    if isinstance(exc, OSError) and exc.errno is not None:
        err.errno = exc.errno  # (not strerror: OSError.__str__ would then drop the message)
    return err
