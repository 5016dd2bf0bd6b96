"""A real S3-compatible server for tests: moto in server mode on 127.0.0.1, on a port the OS chose free, in a thread
of the test process, over plain HTTP or HTTPS with a CA of its own. moto keeps its buckets in the process, not in
the server: two servers in one test process see the same buckets, so each test names its own.

``environment()`` is what a user's shell would hold to point boto3, s3fs or ``edgehub run`` at it: the standard
AWS variables only (botocore >= 1.31 reads the endpoint from ``AWS_ENDPOINT_URL_S3``), with the shared config and
credentials files pointed into the test's own folder, so the machine's ``~/.aws`` never takes part, and the EC2
metadata lookup off (no credentials is then an answer at once, not a wait on 169.254.169.254).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import boto3
import s3fs
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from edgehub.testing.certs import TestCA

__all__ = ["REGION", "S3Server", "s3_server"]

REGION = "eu-west-1"


@dataclass(frozen=True, slots=True)
class S3Server:
    """A running server at ``endpoint_url``; ``key``/``secret`` are what the test's clients sign with (moto takes
    any unless told to check them)."""

    endpoint_url: str
    home: Path  # where the environment's AWS config and credentials files are
    key: str = "edgehub-test-key"
    secret: str = "edgehub-test-secret-never-logged"
    # The request lines the server has answered, from its access log ("PUT /bucket/key HTTP/1.1"), so that a test
    # can wait for a client's attempts instead of sleeping.
    requests: list[str] = field(default_factory=list)
    ca_file: Path | None = None  # the CA of an HTTPS server's certificate (None: plain HTTP)

    def requests_matching(self, method: str, path_prefix: str) -> int:
        """How many requests for ``method`` on a path starting with ``path_prefix`` the server has answered."""
        return sum(r.startswith(f"{method} {path_prefix}") for r in list(self.requests))

    def environment(self, **extra: str) -> dict[str, str]:
        """The standard AWS variables that point a client at this server, ``extra`` over them."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": str(self.home / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.home / "credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
            **extra,
        }

    def options(self) -> dict[str, Any]:
        """fsspec storage options reaching this server with the test's own key, not through the environment."""
        return {
            "key": self.key,
            "secret": self.secret,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": REGION}
            | ({"verify": str(self.ca_file)} if self.ca_file is not None else {}),
            "skip_instance_cache": True,
        }

    def fs(self) -> s3fs.S3FileSystem:
        """The server seen directly through s3fs (what a reader in the cloud would use)."""
        return s3fs.S3FileSystem(**self.options())

    def make_bucket(self, name: str) -> None:
        self.fs().mkdir(name, region_name=REGION)

    @contextmanager
    def checking_credentials(self) -> Iterator[S3Server]:
        """The server checking every request's signature until the block ends (moto's documented switch,
        ``/moto-api/reset-auth``, which holds for the whole process); inside, this server as a user who may do
        anything with S3 signs (with an access key moto made), and any other key or secret is refused."""
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint_url,
            verify=str(self.ca_file) if self.ca_file is not None else None,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=REGION,
        )
        user = f"edgehub-{uuid.uuid4().hex[:12]}"
        iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
        access = iam.create_access_key(UserName=user)["AccessKey"]
        self._reset_auth("0")
        try:
            yield replace(self, key=access["AccessKeyId"], secret=access["SecretAccessKey"])
        finally:
            self._reset_auth("inf")

    def _reset_auth(self, unchecked_requests: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint_url}/moto-api/reset-auth",
            data=unchecked_requests.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},  # not a form: moto reads the body as it is
        )
        trusted = ssl.create_default_context(cafile=self.ca_file) if self.ca_file is not None else None
        with urllib.request.urlopen(request, timeout=10, context=trusted) as answer:
            assert answer.status == 200


@contextmanager
def s3_server(home: Path, *, tls: bool = False) -> Iterator[S3Server]:
    """A fresh moto S3 server on a free loopback port until the block ends; ``home`` holds the AWS files the
    environment names (made, empty of profiles). With ``tls``, it serves HTTPS only, its certificate (for
    ``localhost``) issued by a CA of its own at ``ca_file``, which no client trusts unless told."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config").write_text("")
    (home / "credentials").write_text("")
    context, ca_file = None, None
    if tls:
        ca = TestCA(home / "tls", name="edgehub test S3 CA")
        pair = ca.server()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pair.cert, pair.key)
        ca_file = ca.ca_pem
    # What moto's ThreadedMotoServer runs, with TLS when asked (it has no switch for it).
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", 0, app, True, request_handler=MotoRequestHandler, ssl_context=context)
    thread = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    thread.start()
    access = _AccessLog()
    werkzeug = logging.getLogger("werkzeug")  # the server's access log: one record a request
    werkzeug.addHandler(access)
    try:
        port = server.server_address[1]
        endpoint = f"https://localhost:{port}" if tls else f"http://127.0.0.1:{port}"
        yield S3Server(endpoint_url=endpoint, home=home, requests=access.lines, ca_file=ca_file)
    finally:
        werkzeug.removeHandler(access)
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class _AccessLog(logging.Handler):
    """The request lines of werkzeug's access log ('127.0.0.1 - - [date] "PUT /b/k HTTP/1.1" 200 -'); every
    server of the process logs to the same logger, and a record names no server, so each keeps them all (its
    test's bucket names tell them apart)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = _COLOUR.sub("", record.getMessage())  # werkzeug colours the lines of failed requests
        start, end = message.find('"'), message.rfind('"')
        if 0 <= start < end:
            self.lines.append(message[start + 1 : end])
