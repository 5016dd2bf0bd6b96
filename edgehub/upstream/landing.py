"""The landing zone: where segments land in the cloud for the Spark job to read, through fsspec.

``LandingZone(url).write(name, data)`` stores one segment's bytes at ``{url}/{name.path}``. A plain folder path
or a ``file://`` URL is the default; any other protocol works through its fsspec plugin when it is installed
(``s3://`` with s3fs, ``abfs://`` with adlfs, ``memory://`` for tests).

Invariants:

* **Idempotent.** Segment names are a pure function of the batch, so writing the same name twice leaves one
  file, unchanged: the second write finds it and returns. Locally the publish step is ``os.link``, which
  refuses to replace an existing file, so two racing writers of one name still leave the first one's bytes.
* **Atomically visible.** Bytes go first to a temp name starting with ``.`` in the same folder (Spark's file
  sources skip such names), are fsync'ed (local), and are then published under the final name by a link or a
  move, so a reader sees the whole segment or nothing. Locally the folder is fsync'ed too, so a returned
  ``write`` survives a power cut.
* **Never makes a bucket.** On an object store (s3, gcs, abfs) it makes no folders: there are none, and s3fs
  would create a missing bucket; a write to a bucket that is not there fails (and is retried) instead.
* **Errors are ours.** Every failure is a ``TransportError`` whose ``kind`` says what to do next: a full disk
  or a flaky store is ``TRANSIENT``, a refused permission or an unknown protocol is ``PERMANENT``. A failed
  read or write is a ``LandingError`` whose ``reason`` says why in a word an operator can act on (``REASONS``):
  for an object store, read from the S3 error code or the botocore error under the plugin's ``OSError``.
* **No secret in a message.** The URL is shown with the password of a ``user:password@`` part replaced
  (``shown_url``); object-store credentials never come through here (they are the environment's, read by the
  plugin) and the store's own error texts carry none.
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
from enum import StrEnum
from typing import Any

from edgehub.core import FailureKind, TransportError
from edgehub.upstream.segment import SegmentName

__all__ = ["REASONS", "LandingError", "LandingZone", "WriteOutcome", "shown_url"]

_log = logging.getLogger(__name__)

# Object stores: no folders to make, and s3fs's ``makedirs`` would create a missing bucket, so a mistyped bucket
# name would start a new bucket instead of failing the write.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"})
_PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR})

# Why a landing failed, in a word, with what an operator does about it (the upload transport logs it once).
REASONS = {
    "no_such_bucket": "make the bucket: the hub never makes one",
    "bad_credentials": "the store does not know the access key or the signature is wrong: check AWS_* or the "
    "profile, then restart",
    "expired_credentials": "the credentials have expired: renew them, then restart",
    "no_credentials": "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
    "then restart",
    # S3 answers a HEAD (the existence check before each write) with a bare 403, whatever the cause
    "bad_config": "the AWS environment is not usable (AWS_PROFILE names no profile of the files, or a setting of "
    "it is wrong): fix it, then restart",
    "access_denied": "the store refused the request: a wrong key or secret, or credentials that may not write "
    "here (locally: the folder's permissions); fix them, then restart",
    "untrusted_certificate": "the store's TLS certificate is not trusted: point AWS_CA_BUNDLE at its CA (PEM), "
    "then restart",
    "unreachable": "the store's endpoint did not answer a connection (AWS_ENDPOINT_URL_S3, the network)",
    "timeout": "the store did not answer in time",
    "disk_full": "no space left on the device",
    "error": "another failure: see error=",
}
# S3 error codes (botocore ClientError's response["Error"]["Code"]) and botocore's own errors, by class name so that
# botocore is not imported here (it comes with s3fs, when it is installed at all).
_S3_CODES = {
    "NoSuchBucket": "no_such_bucket",
    "InvalidAccessKeyId": "bad_credentials",
    "SignatureDoesNotMatch": "bad_credentials",
    "InvalidToken": "bad_credentials",
    "ExpiredToken": "expired_credentials",
    "TokenRefreshRequired": "expired_credentials",
    "AccessDenied": "access_denied",
    "403": "access_denied",
    "Forbidden": "access_denied",
    "AllAccessDisabled": "access_denied",
}
_BOTOCORE_ERRORS = {
    "NoCredentialsError": "no_credentials",
    "ProfileNotFound": "bad_config",
    "InvalidConfigError": "bad_config",
    "PartialCredentialsError": "no_credentials",
    "SSLError": "untrusted_certificate",
    "EndpointConnectionError": "unreachable",
    "ConnectTimeoutError": "timeout",
    "ReadTimeoutError": "timeout",
}
# Credentials are read once, when the plugin's client is made: retrying cannot mend them, a restart does.
_PERMANENT_REASONS = frozenset(
    {"bad_credentials", "expired_credentials", "no_credentials", "access_denied", "bad_config", "untrusted_certificate"}
)


class LandingError(TransportError):
    """A landing zone read or write failed; ``reason`` is one of ``REASONS``, ``kind`` what to do next."""

    def __init__(self, message: str, *, kind: FailureKind, reason: str) -> None:
        super().__init__(message, kind=kind)
        self.reason = reason


class WriteOutcome(StrEnum):
    """Whether a write published a new file or found the segment already there."""

    WRITTEN = "written"
    ALREADY_PRESENT = "already_present"


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors under it (``raise ... from``, or raised while handling), outermost first."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def _reason_of(exc: BaseException) -> str:
    """One of ``REASONS`` for ``exc``: the S3 error code or botocore error under it first, then the OS error."""
    for cause in _causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            if code in _S3_CODES:
                return _S3_CODES[code]
        for cls in type(cause).__mro__:
            if cls.__name__ in _BOTOCORE_ERRORS and cls.__module__.startswith("botocore"):
                return _BOTOCORE_ERRORS[cls.__name__]
    if isinstance(exc, PermissionError):
        return "access_denied"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "disk_full"
    return "error"


def _failure(what: str, exc: BaseException) -> LandingError:
    """``exc`` as ours: its reason, and the kind that says what the executor does next."""
    reason = _reason_of(exc)
    kind = FailureKind.PERMANENT if reason in _PERMANENT_REASONS else _kind_of(exc)
    return LandingError(f"{what} failed: {exc} ({REASONS[reason]})", kind=kind, reason=reason)


def shown_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part (sftp, ftp, ...) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostport}{slash}{path}"


def _kind_of(exc: BaseException) -> FailureKind:
    if isinstance(exc, PermissionError):
        return FailureKind.PERMANENT
    if isinstance(exc, TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return FailureKind.PERMANENT
    return FailureKind.TRANSIENT


class LandingZone:
    """A landing zone at ``url``; ``write`` is safe to call again with the same name after any failure."""

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None) -> None:
        if not url:
            raise ValueError("landing zone url must not be empty")
        try:
            import fsspec  # here, not at the top: a hub that uploads nothing does not load it (~15 MB of RSS)

            fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            # An unknown protocol or a missing plugin: retrying will not help.
            raise TransportError(
                f"landing zone {shown_url(url)!r}: no usable filesystem ({exc})", kind=FailureKind.PERMANENT
            ) from exc
        self.url = url
        self.shown_url = shown_url(url)  # for messages and logs
        self._fs = fs
        self._root = root.rstrip("/") if root != "/" else root
        self._local = "file" in _protocols(fs)
        self._object_store = bool(_OBJECT_STORES.intersection(_protocols(fs)))

    def path_of(self, name: SegmentName) -> str:
        """The full path (in the filesystem's own terms) a segment lands at."""
        return f"{self._root}/{name.path}"

    def exists(self, name: SegmentName) -> bool:
        try:
            return bool(self._fs.exists(self.path_of(name)))
        except Exception as exc:
            raise _failure(f"landing zone {self.shown_url!r}: exists", exc) from exc

    def write(self, name: SegmentName, data: bytes) -> WriteOutcome:
        """Publish ``data`` as segment ``name``. Durable (local) and visible on return."""
        return self.write_path(name.path, data)

    def write_path(self, relative_path: str, data: bytes) -> WriteOutcome:
        """``write`` for a name that is not a ``SegmentName`` (e.g. content-addressed), with the same guarantees.

        Each part of ``relative_path`` must be a plain name not starting with ``.`` or ``_``.
        """
        final = f"{self._root}/{_checked(relative_path)}"
        name = relative_path
        try:
            outcome = _write_local(self._root, final, data) if self._local else self._write_remote(final, data)
        except TransportError:
            raise
        except Exception as exc:
            failure = _failure(f"landing zone {self.shown_url!r}: writing {name}", exc)
            # debug: the upload transport says it once an outage, with the reason (each retry would say it again)
            _log.debug(
                "landing.write_failed url=%s segment=%s reason=%s kind=%s error=%s",
                self.shown_url,
                name,
                failure.reason,
                failure.kind,
                exc,
            )
            raise failure from exc
        _log.debug("landing.%s url=%s segment=%s bytes=%d", outcome, self.shown_url, name, len(data))
        return outcome

    def read_path(self, relative_path: str) -> bytes | None:
        """The bytes at ``relative_path``, or None when there is no such file (what the receiver keeps beside the
        segments: dictionaries, quarantined payloads)."""
        path = f"{self._root}/{_checked(relative_path)}"
        try:
            if not self._fs.exists(path):
                return None
            data: bytes = self._fs.cat_file(path)
        except Exception as exc:
            raise _failure(f"landing zone {self.shown_url!r}: reading {relative_path}", exc) from exc
        return data

    def list_paths(self, folder: str) -> list[str]:
        """The files under ``folder`` (relative paths, sorted; none when it does not exist), temp files left out."""
        base = f"{self._root}/{_checked(folder)}"
        try:
            if not self._fs.exists(base):
                return []
            found = self._fs.find(base)
        except Exception as exc:
            raise _failure(f"landing zone {self.shown_url!r}: listing {folder}", exc) from exc
        # fsspec gives paths in its own terms (no protocol), which start with the root it gave us.
        root = self._root.rstrip("/") + "/"
        rels = [str(p)[len(root) :] for p in found if str(p).startswith(root)]
        return sorted(r for r in rels if not r.rsplit("/", 1)[-1].startswith("."))

    def remove_path(self, relative_path: str) -> None:
        """Remove the file at ``relative_path`` (gone already: nothing to do)."""
        path = f"{self._root}/{_checked(relative_path)}"
        try:
            if self._fs.exists(path):
                self._fs.rm(path)
        except Exception as exc:
            raise _failure(f"landing zone {self.shown_url!r}: removing {relative_path}", exc) from exc

    def _write_remote(self, final: str, data: bytes) -> WriteOutcome:
        fs = self._fs
        if fs.exists(final):
            return WriteOutcome.ALREADY_PRESENT
        folder, base = final.rsplit("/", 1)
        tmp = f"{folder}/.{base}.{uuid.uuid4().hex}.tmp"
        if not self._object_store:
            fs.makedirs(folder, exist_ok=True)
        fs.pipe_file(tmp, data)
        try:
            # Object stores have no no-replace rename; a racing writer of the same name writes the same bytes
            # (names are a function of the batch), so last-writer-wins is harmless there.
            if fs.exists(final):
                return WriteOutcome.ALREADY_PRESENT
            fs.mv(tmp, final)
        finally:
            if fs.exists(tmp):
                fs.rm(tmp)
        return WriteOutcome.WRITTEN


def _checked(relative_path: str) -> str:
    """``relative_path`` when each of its parts is a plain name not starting with ``.`` or ``_``; else ValueError."""
    parts = relative_path.split("/")
    if not relative_path or any(not p or p in (".", "..") or p[0] in "._" or "\\" in p for p in parts):
        raise ValueError(f"bad landing path {relative_path!r}")
    return relative_path


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_local(root: str, final: str, data: bytes) -> WriteOutcome:
    if os.path.exists(final):
        return WriteOutcome.ALREADY_PRESENT
    folder, base = os.path.split(final)
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        # New folders are entries in their parents: sync those up to the root so the path survives a crash.
        parent = folder
        while parent != root and parent.startswith(root) and parent != os.path.dirname(parent):
            parent = os.path.dirname(parent)
            _fsync_dir(parent)
    tmp = os.path.join(folder, f".{base}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, final)  # never replaces: the first writer of a name wins
            outcome = WriteOutcome.WRITTEN
        except FileExistsError:
            outcome = WriteOutcome.ALREADY_PRESENT
    finally:
        os.unlink(tmp)
    _fsync_dir(folder)
    return outcome
