"""s3_storage_options: S3, R2, MinIO; RAVEX_S3_* then AWS_* fallbacks; a clear error without credentials."""

from __future__ import annotations

import pytest
from rhelpers import BUCKET, FAST_RETRY, KEY, SECRET, assert_same, state

from ravex.format import open_store
from ravex.format.errors import RavexError, RemoteConfigError
from ravex.format.storage.remote import s3_storage_options


def test_explicit_arguments_win():
    env = {"RAVEX_S3_ACCESS_KEY": "rk", "RAVEX_S3_SECRET_KEY": "rs", "AWS_ACCESS_KEY_ID": "ak"}
    opts = s3_storage_options(
        endpoint="https://acct.r2.cloudflarestorage.com", region="auto", access_key="k", secret_key="s", env=env
    )
    assert opts["key"] == "k" and opts["secret"] == "s"
    assert opts["endpoint_url"] == "https://acct.r2.cloudflarestorage.com"
    assert opts["client_kwargs"] == {"region_name": "auto"}
    assert opts["config_kwargs"]["s3"] == {"addressing_style": "path"}  # a custom endpoint: path style


def test_ravex_variables_then_aws_variables():
    env = {"RAVEX_S3_ACCESS_KEY": "rk", "RAVEX_S3_SECRET_KEY": "rs", "AWS_ACCESS_KEY_ID": "ak",
           "AWS_SECRET_ACCESS_KEY": "as"}
    assert s3_storage_options(env=env)["key"] == "rk"
    env = {"AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "as", "AWS_SESSION_TOKEN": "tok",
           "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_DEFAULT_REGION": "eu-west-1"}
    opts = s3_storage_options(env=env)
    assert (opts["key"], opts["secret"], opts["token"]) == ("ak", "as", "tok")
    assert opts["endpoint_url"] == "http://minio:9000"
    assert opts["client_kwargs"] == {"region_name": "eu-west-1"}
    assert s3_storage_options(env=dict(env, AWS_ENDPOINT_URL_S3="http://s3only:1"))["endpoint_url"] == "http://s3only:1"


def test_aws_s3_defaults_have_virtual_hosting():
    opts = s3_storage_options(access_key="k", secret_key="s", env={})
    assert "endpoint_url" not in opts and "config_kwargs" not in opts
    opts = s3_storage_options(access_key="k", secret_key="s", path_style=True, env={})
    assert opts["config_kwargs"]["s3"] == {"addressing_style": "path"}


def test_missing_credentials_is_one_clear_line():
    with pytest.raises(RemoteConfigError) as info:
        s3_storage_options(endpoint="http://127.0.0.1:9000", env={})
    msg = str(info.value)
    assert isinstance(info.value, RavexError) and "\n" not in msg
    for name in ("RAVEX_S3_ACCESS_KEY", "RAVEX_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert name in msg
    with pytest.raises(RemoteConfigError, match="no secret key"):
        s3_storage_options(access_key="k", env={})
    with pytest.raises(RemoteConfigError, match="scheme"):
        s3_storage_options(endpoint="minio:9000", access_key="k", secret_key="s", env={})


def test_profile_or_anonymous_defer_to_botocore():
    assert "key" not in s3_storage_options(env={"AWS_PROFILE": "training"})
    assert s3_storage_options(anon=True, env={})["anon"] is True


def test_standard_aws_variables_work_unchanged(moto_server, s3_url, monkeypatch):
    """Only AWS_* in the environment, no argument at all: both through s3_storage_options and
    through botocore's own reading of the environment (options without credentials)."""
    for name in ("RAVEX_S3_ACCESS_KEY", "RAVEX_S3_SECRET_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    opts = s3_storage_options()
    opts["skip_instance_cache"] = True
    store = open_store(s3_url, create=True, storage_options=opts, retry=FAST_RETRY)
    with store.writer() as w:
        w.commit(1, state(1, small=3))
    plain = open_store(s3_url, storage_options={"skip_instance_cache": True}, retry=FAST_RETRY)
    assert_same(plain.read(1), state(1, small=3))
    assert s3_url.startswith(f"s3://{BUCKET}/")
