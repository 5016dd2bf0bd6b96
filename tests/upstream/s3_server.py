"""A real S3-compatible server for tests: moto in server mode on 127.0.0.1, on a port the OS chose free, in a thread
of the test process. moto keeps its buckets in the process, not in the server: two servers in one test process
see the same buckets, so each test names its own.

``environment()`` is what a user's shell would hold to point boto3, s3fs or ``edgehub run`` at it: the standard
AWS variables only (botocore >= 1.31 reads the endpoint from ``AWS_ENDPOINT_URL_S3``), with the shared config and
credentials files pointed into the test's own folder, so the machine's ``~/.aws`` never takes part, and the EC2
metadata lookup off (no credentials is then an answer at once, not a wait on 169.254.169.254).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import s3fs
from moto.server import ThreadedMotoServer

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
            "client_kwargs": {"region_name": REGION},
            "skip_instance_cache": True,
        }

    def fs(self) -> s3fs.S3FileSystem:
        """The server seen directly through s3fs (what a reader in the cloud would use)."""
        return s3fs.S3FileSystem(**self.options())

    def make_bucket(self, name: str) -> None:
        self.fs().mkdir(name, region_name=REGION)


@contextmanager
def s3_server(home: Path) -> Iterator[S3Server]:
    """A fresh moto S3 server on a free loopback port until the block ends; ``home`` holds the AWS files the
    environment names (made, empty of profiles)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config").write_text("")
    (home / "credentials").write_text("")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3Server(endpoint_url=f"http://{host}:{port}", home=home)
    finally:
        server.stop()
