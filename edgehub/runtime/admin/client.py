"""The CLI's side of the admin API: find a running hub from its data directory and ask it (blocking, stdlib
``http.client``: the commands are one request each, and a client library would add nothing).

``running_hub(data_dir)`` gives an ``AdminClient`` when ``DATA/admin.port`` names a port where a hub answers
``/health``, None when there is no port file or nobody answers (a hub that was killed leaves its file: the
commands then work on the data directory, and the store's lock tells whether a hub really holds it).

Every call is bounded by ``timeout_s``; an answer over ``max_response_bytes`` is an ``AdminError``.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

from edgehub.runtime.admin.files import read_port, read_token

__all__ = ["AdminClient", "AdminError", "identity_path", "running_hub"]

_MAX_RESPONSE_BYTES = 16 << 20


class AdminError(Exception):
    """The admin API refused (``status`` and the body's ``error``/``detail``) or could not be reached
    (``status`` 0)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"admin API: {detail}" if status == 0 else f"admin API answered {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class AdminClient:
    port: int
    token: str
    host: str = "127.0.0.1"
    timeout_s: float = 10.0

    def request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        *,
        query: dict[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> tuple[int, object]:
        """``(status, decoded JSON)``; ``AdminError`` for a status not in ``ok``."""
        status, raw = self.raw(method, path, body, query=query)
        try:
            value: object = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            value = raw.decode("utf-8", "replace")
        if status not in ok:
            detail = value.get("detail", value) if isinstance(value, dict) else value
            raise AdminError(status, str(detail))
        return status, value

    def raw(
        self, method: str, path: str, body: object | None = None, *, query: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        target = path + ("?" + urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, target, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read(_MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise AdminError(0, f"cannot reach the hub on 127.0.0.1:{self.port}: {exc}") from exc
        finally:
            conn.close()
        if len(raw) > _MAX_RESPONSE_BYTES:
            raise AdminError(response.status, "answer too large")
        return response.status, raw


def identity_path(identity_id: str) -> str:
    """``/identities/{device}[/{module}]`` with each part percent-encoded."""
    return "/identities/" + "/".join(quote(part, safe="") for part in identity_id.split("/"))


def running_hub(data_dir: Path, *, timeout_s: float = 10.0) -> AdminClient | None:
    port = read_port(data_dir)
    if port is None:
        return None
    token = read_token(data_dir)
    if token is None:
        return None
    client = AdminClient(port, token, timeout_s=timeout_s)
    try:
        status, _ = client.raw("GET", "/health")
    except AdminError:
        return None  # a port file left behind by a hub that is gone
    return client if status == 200 else None
