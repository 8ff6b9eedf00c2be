"""Options for S3-compatible stores (AWS S3, Cloudflare R2, MinIO, Ceph, moto).

    >>> opts = s3_storage_options(endpoint="http://127.0.0.1:9000", path_style=True)
    >>> store = open_store("s3://bucket/prefix", create=True, storage_options=opts)

Credentials come from the arguments, else ``RAVEX_S3_ACCESS_KEY`` /
``RAVEX_S3_SECRET_KEY``, else the standard ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (with ``AWS_SESSION_TOKEN``). Endpoint and region fall back
to ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` and ``AWS_REGION`` /
``AWS_DEFAULT_REGION``. Where no key pair is found but the environment names another
source botocore knows (a profile, a credentials file, web identity, a container role),
the options leave credentials to botocore's own chain.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import RemoteConfigError

#: Variables that point botocore's credential chain somewhere other than a key pair.
_CHAIN_VARIABLES = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def s3_storage_options(
    endpoint: str | None = None,
    region: str | None = None,
    path_style: bool | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    env: Mapping[str, str] = os.environ,
    *,
    session_token: str | None = None,
    anon: bool = False,
    connect_timeout: float | None = None,
    read_timeout: float | None = None,
) -> dict[str, Any]:
    """The s3fs ``storage_options`` for an S3-compatible store.

    ``path_style=None`` chooses path-style addressing (``http://host/bucket/key``)
    whenever a custom endpoint is set, as MinIO and most self-hosted servers need;
    R2 and AWS accept either. ``anon=True`` makes unsigned requests (public buckets,
    read only). Raises :class:`~ravex.format.errors.RemoteConfigError` when no
    credentials are given or found.
    """
    key = access_key or env.get("RAVEX_S3_ACCESS_KEY") or None
    secret = secret_key or env.get("RAVEX_S3_SECRET_KEY") or None
    if key is None and secret is None:
        key = env.get("AWS_ACCESS_KEY_ID") or None
        secret = env.get("AWS_SECRET_ACCESS_KEY") or None
        session_token = session_token or env.get("AWS_SESSION_TOKEN") or None
    endpoint = endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None

    opts: dict[str, Any] = {}
    if anon:
        opts["anon"] = True
    elif key and secret:
        opts["key"] = key
        opts["secret"] = secret
        if session_token:
            opts["token"] = session_token
    elif key or secret:
        have, lacking = ("access key", "secret key") if key else ("secret key", "access key")
        raise RemoteConfigError(
            f"S3 credentials are incomplete: a {have} was given but no {lacking}; set both "
            "RAVEX_S3_ACCESS_KEY/RAVEX_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
        )
    elif not any(env.get(name) for name in _CHAIN_VARIABLES):
        raise RemoteConfigError(
            "no S3 credentials: set RAVEX_S3_ACCESS_KEY/RAVEX_S3_SECRET_KEY or "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or storage access_key/secret_key, or AWS_PROFILE)"
        )
    if endpoint:
        if "://" not in endpoint:
            raise RemoteConfigError(f"S3 endpoint {endpoint!r} needs a scheme, e.g. https://{endpoint}")
        opts["endpoint_url"] = endpoint
    client: dict[str, Any] = {}
    if region:
        client["region_name"] = region
    if client:
        opts["client_kwargs"] = client
    config: dict[str, Any] = {}
    if path_style if path_style is not None else bool(endpoint):
        config["s3"] = {"addressing_style": "path"}
    if connect_timeout is not None:
        config["connect_timeout"] = connect_timeout
    if read_timeout is not None:
        config["read_timeout"] = read_timeout
    if config:
        opts["config_kwargs"] = config
    return opts
