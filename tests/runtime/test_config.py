"""Configuration: ravex.yaml < RAVEX_* < activate() overrides, one validated dataclass."""

from __future__ import annotations

import re

import pytest

from ravex.errors import ConfigError
from ravex.runtime.config import RavexConfig


def _yaml(tmp_path, text: str) -> str:
    path = tmp_path / "ravex.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_without_any_source(tmp_path):
    config = RavexConfig.load(path=None, environ={})
    assert config.storage.url == "./checkpoints"
    assert config.backend == "zarr" and config.resume == "auto"
    assert config.checkpoint_on_signal == ["SIGTERM"]
    assert set(config.sources.values()) == {"default"}


def test_precedence_file_then_env_then_overrides(tmp_path):
    path = _yaml(tmp_path, "checkpoint_every: 7\nkeep_last: 2\nstorage: ./a\nlog_level: debug\n")
    env = {"RAVEX_CHECKPOINT_EVERY": "9", "RAVEX_STORAGE": "s3://bucket/run"}
    config = RavexConfig.load({"keep_last": 5}, path=path, environ=env)
    assert config.checkpoint_every == 9 and config.sources["checkpoint_every"] == "env RAVEX_CHECKPOINT_EVERY"
    assert config.keep_last == 5 and config.sources["keep_last"] == "activate()"
    assert config.storage.url == "s3://bucket/run" and config.storage.is_remote
    assert config.log_level == "DEBUG" and config.sources["log_level"] == path


def test_unknown_key_names_key_file_and_nearest(tmp_path):
    path = _yaml(tmp_path, "checkpoint_evry: 10\n")
    with pytest.raises(ConfigError) as info:
        RavexConfig.load(path=path, environ={})
    message = str(info.value)
    assert "'checkpoint_evry'" in message and path in message
    assert "did you mean 'checkpoint_every'" in message
    assert "\n" not in message


def test_unknown_storage_key_is_named_with_its_section(tmp_path):
    path = _yaml(tmp_path, "storage:\n  url: ./x\n  endpont: http://localhost:9000\n")
    with pytest.raises(ConfigError, match=r"'storage.endpont'.*did you mean 'storage.endpoint'"):
        RavexConfig.load(path=path, environ={})


@pytest.mark.parametrize(
    "text,match",
    [
        ("checkpoint_every: ten\n", r"'checkpoint_every'.*positive integer.*'ten'"),
        ("backend: moonclip\n", r"'backend'.*\['zarr', 'torch_save'\].*'moonclip'"),
        ("resume: sometimes\n", r"'resume'.*'auto', 'never' or a step"),
        ("checkpoint_on_signal: [SIGKILL]\n", r"not a signal that can be caught"),
        ("local: s3://bucket/fast\n", r"'local'.*a path on this machine.*a remote store is 'storage:'"),
        ("persist_every: 0\n", r"'persist_every'"),
        ("replicas: 2\n", r"'replicas'.*expected 0 .* or 1 .*other machine.*got 2"),
        ("replicas: true\n", r"'replicas'.*expected 0 .* or 1"),
        ("- a\n- b\n", r"expected a mapping"),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path, text, match):
    path = _yaml(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        RavexConfig.load(path=path, environ={})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "data,where,what",
    [
        # the problem is on line 2 (the ':' after keep_last), its context on line 1
        (b"storage: [unclosed\nkeep_last: 3\n", "2:10",
         r"expected ',' or '\]', but got ':' \(while parsing a flow sequence at 1:10\)"),
        (b"storage: ./a\n  keep_last: 3\n", "2:12", "mapping values are not allowed here"),
        (b"storage: ./a\nnote: 'open\n", "3:1",
         r"found unexpected end of stream \(while scanning a quoted scalar at 2:7\)"),
        (b"storage: ./a\nx: !!python/object:os.system ls\n", "2:4", "could not determine a constructor for the tag"),
        (b"storage: ./a\nnote: \x07\n", "2:7", "unacceptable character #x0007: special characters are not allowed"),
    ],
)
def test_malformed_yaml_names_file_line_and_column(tmp_path, data, where, what):
    path = tmp_path / "ravex.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        RavexConfig.load(path=str(path), environ={})
    message = str(info.value)
    assert "\n" not in message, message
    assert re.fullmatch(rf"{re.escape(str(path))}:{where}: not valid YAML: {what}.*; "
                        r"fix the YAML at that line or delete the file", message), message


def test_ravex_yaml_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "ravex.yaml"
    path.write_bytes(b"storage: ./a\nnote: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        RavexConfig.load(path=str(path), environ={})
    assert str(info.value) == (f"{path}:2:10: not valid UTF-8 (byte 0xe9); "
                               "fix the YAML at that line or delete the file")


def test_env_values_are_parsed_and_validated():
    config = RavexConfig.load(path=None, environ={
        "RAVEX_CHECKPOINT_ON_EXIT": "false", "RAVEX_RESUME": "120",
        "RAVEX_STORAGE_ENDPOINT": "https://r2.example", "RAVEX_S3_ACCESS_KEY": "k",
        "AWS_SECRET_ACCESS_KEY": "s", "RAVEX_STORAGE": "s3://b/p",
    })
    assert config.checkpoint_on_exit is False and config.resume == 120
    assert config.storage.endpoint == "https://r2.example"
    opts = config.storage.storage_options()
    assert opts["key"] == "k" and opts["secret"] == "s"
    assert opts["client_kwargs"]["endpoint_url"] == "https://r2.example"
    assert config.describe()["storage.access_key"] == "***"
    with pytest.raises(ConfigError, match="RAVEX_KEEP_LAST"):
        RavexConfig.load(path=None, environ={"RAVEX_KEEP_LAST": "-3"})


def test_unknown_override_is_a_type_error():
    with pytest.raises(TypeError, match=r"'chekpoint_every'.*did you mean 'checkpoint_every'"):
        RavexConfig.load({"chekpoint_every": 3}, path=None, environ={})


def test_explicitly_named_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        RavexConfig.load(path=str(tmp_path / "nope.yaml"), environ={})
