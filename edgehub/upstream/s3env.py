"""What the standard AWS environment gives an ``s3://`` landing zone: the endpoint, the region, the profile and where
the credentials come from, as botocore (under s3fs) resolves them, for ``edgehub config show``.

The hub takes no S3 setting of its own: s3fs makes its client through botocore, which reads ``AWS_ENDPOINT_URL_S3``
(or ``AWS_ENDPOINT_URL``, or ``endpoint_url`` in the profile; botocore >= 1.31, which every s3fs the hub allows
brings), ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with
``~/.aws/config`` and ``~/.aws/credentials``, ``AWS_DEFAULT_REGION``/``AWS_REGION``, and otherwise an instance or
container role; ``AWS_CA_BUNDLE`` names the CA an ``https://`` endpoint's certificate is checked against. With an
endpoint of its own, botocore addresses buckets by path (``http://host:9000/bucket/key``), which MinIO, Ceph and
moto take. This module asks botocore the same questions, so what ``config show`` prints is what the hub's writes
will use.

Invariants: never a secret (the access key id is shown by its last four characters, as the AWS console does; the
secret key and the session token never); None when botocore is not installed (no ``s3://`` landing zone then).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["S3Environment", "s3_environment", "s3_environment_problem"]


@dataclass(frozen=True, slots=True)
class S3Environment:
    """Where an ``s3://`` landing zone's requests go and who signs them; each ``*_from`` says where it was read."""

    endpoint: str
    endpoint_from: str
    region: str
    region_from: str
    credentials: str
    credentials_from: str
    trusts: str = "the system's CAs"  # for an https:// endpoint: AWS_CA_BUNDLE (or the profile's ca_bundle) if set


def s3_environment(*, look_up_credentials: bool = True) -> S3Environment | None:
    """The environment's answers (see the module docstring). ``look_up_credentials`` False leaves out the
    credential chain, whose last links (an instance or container role) may ask the network."""
    resolved = _resolve()
    if resolved is None:
        return None
    if isinstance(resolved, str):  # AWS_PROFILE names a profile the files do not hold
        return S3Environment(
            endpoint="unknown",
            endpoint_from=resolved,
            region="unknown",
            region_from=resolved,
            credentials="none",
            credentials_from=resolved,
        )
    session, endpoint = resolved
    from botocore.exceptions import BotoCoreError  # _resolve found botocore

    profile = session.get_config_variable("profile")
    if endpoint:
        endpoint_from = next(
            (name for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(name) == endpoint),
            f"profile {profile or 'default'}",
        )
    else:
        endpoint, endpoint_from = "AWS S3 (by region)", "default"
    region = session.get_config_variable("region")
    region_from = next(
        (name for name in ("AWS_REGION", "AWS_DEFAULT_REGION") if region and os.environ.get(name) == region),
        f"profile {profile or 'default'}" if region else "default",
    )
    if not look_up_credentials:
        credentials, credentials_from = "not looked up", "-"
    else:
        try:
            found = session.get_credentials()
        except BotoCoreError as exc:
            found, credentials_from = None, str(exc)
        else:
            credentials_from = "found nowhere: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        if found is not None:
            key = found.access_key or ""
            credentials = f"access key ...{key[-4:]}" if len(key) > 8 else "set"
            credentials_from = _METHODS.get(found.method, found.method)
        else:
            credentials = "none"
    ca_bundle = session.get_config_variable("ca_bundle")
    trusts = "the system's CAs"
    if ca_bundle:
        trusts = f"{ca_bundle} ({'AWS_CA_BUNDLE' if os.environ.get('AWS_CA_BUNDLE') == ca_bundle else 'profile'})"
    return S3Environment(
        endpoint=endpoint,
        endpoint_from=endpoint_from,
        region=region or "us-east-1",
        region_from=region_from,
        credentials=credentials,
        credentials_from=credentials_from,
        trusts=trusts,
    )


def s3_environment_problem() -> str | None:
    """What in the AWS environment would make every write fail, said before the hub starts (None: nothing seen):
    an endpoint that is no URL, a profile the files do not hold. Wrong or missing credentials are not seen here:
    only the store can say (``edgehub.upstream.landing`` names them at the first write)."""
    resolved = _resolve()
    if resolved is None:
        return None
    if isinstance(resolved, str):
        return f"the AWS environment: {resolved}"
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url  # _resolve found botocore

    _, endpoint = resolved
    if endpoint and not (is_valid_endpoint_url(endpoint) or is_valid_ipv6_endpoint_url(endpoint)):
        return f"the S3 endpoint {endpoint!r} is not a URL (http://host:port or https://host)"
    return None


def _resolve() -> tuple[Any, str | None] | str | None:
    """botocore's session and the S3 endpoint it configures (None: AWS S3 by region); a string saying why the
    environment cannot be read (a profile the files do not hold); None without botocore."""
    try:
        import botocore.session
        from botocore.configprovider import ConfiguredEndpointProvider
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return None
    session = botocore.session.Session()
    try:
        scoped = session.get_scoped_config()
    except BotoCoreError as exc:
        return str(exc)
    provider = ConfiguredEndpointProvider(full_config=session.full_config, scoped_config=scoped, client_name="s3")
    endpoint: str | None = provider.provide()
    return session, endpoint


# botocore's names for where credentials came from, in the words of its documentation.
_METHODS = {
    "env": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    "shared-credentials-file": "the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials)",
    "config-file": "the config file (AWS_CONFIG_FILE or ~/.aws/config)",
    "assume-role": "a role assumed through the profile",
    "assume-role-with-web-identity": "a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE)",
    "sso": "AWS SSO through the profile",
    "container-role": "the container's role",
    "iam-role": "the instance's role",
    "custom-process": "the profile's credential_process",
}
