"""Configuration: ``ravex.yaml`` < ``RAVEX_*`` environment < ``activate()`` overrides.

One frozen-after-load dataclass, :class:`RavexConfig`, validated in one place so that a
typo fails at start-up with a single line naming the key, where it came from and the
nearest valid key, instead of silently checkpointing with defaults for hours.

Every value remembers its source (``default``, the yaml file, an env var, ``activate()``)
because ``ravex status`` has to answer "why is it writing *there*?".
"""

from __future__ import annotations

import difflib
import os
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, AnyStr

from ravex.errors import ConfigError

CONFIG_FILE = "ravex.yaml"
CONFIG_ENV = "RAVEX_CONFIG"

BACKENDS = ("zarr", "torch_save")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: how a resume checks itself (ravex/runtime/recording/witness.py): every bit, the loss within
#: ``witness_tolerance`` (non-deterministic kernels), or not at all
WITNESS_MODES = ("exact", "tolerant", "off")


@dataclass
class StorageConfig:
    """Where checkpoints go: a local path or an fsspec URL, plus S3/R2 options."""

    url: str = "./checkpoints"
    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)

    @property
    def is_remote(self) -> bool:
        return "://" in self.url and not self.url.startswith(("file://", "memory://"))

    @property
    def local_path(self) -> str | None:
        """The filesystem path for local stores, ``None`` for remote ones."""
        if self.url.startswith("file://"):
            return self.url[len("file://") :]
        if "://" in self.url:
            return None
        return os.path.abspath(os.path.expanduser(self.url))

    def storage_options(self) -> dict[str, Any] | None:
        """fsspec ``storage_options`` for remote stores (s3fs spelling)."""
        if not self.is_remote:
            return None
        opts: dict[str, Any] = {}
        if self.access_key:
            opts["key"] = self.access_key
        if self.secret_key:
            opts["secret"] = self.secret_key
        client: dict[str, Any] = {}
        if self.endpoint:
            client["endpoint_url"] = self.endpoint
        if self.region:
            client["region_name"] = self.region
        if client:
            opts["client_kwargs"] = client
        if self.path_style:
            opts["config_kwargs"] = {"s3": {"addressing_style": "path"}}
        return opts


STORAGE_KEYS = ("url", "path", "endpoint", "region", "path_style", "access_key", "secret_key")


@dataclass
class RavexConfig:
    """The resolved configuration. Build it with :meth:`load`."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    #: steps between checkpoints; ``"auto"``: the interval this run's measured cost and ``mtbf``
    #: make best (Young/Daly, ravex/runtime/counting/autocadence.py), within ``max_overhead``
    checkpoint_every: int | str | None = 100
    checkpoint_every_seconds: float | None = None
    #: the mean time between failures ``checkpoint_every: auto`` plans for, in seconds
    mtbf: float = 6 * 3600.0
    #: the most of the training time ``checkpoint_every: auto`` may spend on checkpoints
    max_overhead: float = 0.02
    keep_last: int | None = 3
    keep_every: int | None = None
    #: the fast tier on this machine (a path): every checkpoint lands there, and every
    #: ``persist_every``-th is also copied to ``storage`` in the background (ravex/saving/steps/tiers.py)
    local: str | None = None
    persist_every: int = 1
    #: retention in ``storage`` when ``local`` is set (``keep_last`` is the local tier's; null: keep all)
    persist_keep_last: int | None = 3
    #: 1: each rank's local step is also kept in the other machines' local tiers (torchrun on
    #: several machines, ``local:`` set), so losing one machine loses no step (ravex/saving/steps/replicas.py)
    replicas: int = 0
    compression: str = "none"
    delta: bool = True
    #: arrays of many small chunks (sparse tables) as chunk tables (spec §5.1, format 1.2);
    #: false: every array as a JSON chunk map, which Ravex 1.0/1.1 readers also read
    chunk_tables: bool = True
    #: don't copy a tensor whose version counter, storage and layout did not move since the
    #: last checkpoint (frozen parameters); see ravex.saving.stager.Stager for what that misses
    skip_unchanged: bool = True
    #: every N-th checkpoint copies every tensor anyway (1: every one, i.e. no skipping)
    full_stage_every: int = 10
    #: most bytes of host memory the staging buffers may hold (None: the state's size). A state
    #: larger than this stages what fits and the writer reads the rest from the live tensors
    #: while the training loop waits: the stall grows, the checkpoint is the same (0: no cap)
    staging_max_bytes: int | None = None
    backend: str = "zarr"
    checkpoint_on_exit: bool = True
    checkpoint_on_signal: list[str] = field(default_factory=lambda: ["SIGTERM"])
    resume: str | int = "auto"
    #: the main script's variables a checkpoint saves with its loop position: "auto" (those
    #: the loops assign and read again, found from the source), "none", or a list of names
    script_variables: str | list[str] = "auto"
    log_level: str = "INFO"
    #: the resume witness (spec §22): "exact" compares each resumed step's loss bit for bit,
    #: "tolerant" within ``witness_tolerance`` (relative; the input batches always exactly),
    #: "off" records and compares nothing
    witness: str = "exact"
    witness_tolerance: float = 1e-3
    #: key -> where its value came from; filled by :meth:`load`.
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    #: the yaml file that was read, if any.
    config_file: str | None = field(default=None, repr=False, compare=False)

    @property
    def fixed_every(self) -> int | None:
        """The steps between checkpoints where a number sets them (None: ``auto`` or none)."""
        return self.checkpoint_every if isinstance(self.checkpoint_every, int) else None

    # ── loading ─────────────────────────────────────────────────────────

    @classmethod
    def load(
        cls,
        overrides: dict[str, Any] | None = None,
        path: str | None = None,
        environ: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> RavexConfig:
        """Resolve file < env < overrides into one validated config.

        ``path`` defaults to ``$RAVEX_CONFIG`` or ``ravex.yaml`` in ``cwd`` (the working
        directory); a missing file is fine (defaults apply) unless it was named explicitly.
        """
        env = os.environ if environ is None else environ
        config = cls()
        config.sources = {name: "default" for name in config.keys()}
        file_path = path or env.get(CONFIG_ENV) or find_config_file(cwd)
        if file_path:
            config.config_file = os.path.abspath(file_path)
            config._apply(_read_yaml(file_path), f"{file_path}")
        config._apply_env(env)
        if overrides:
            for key in overrides:
                if key not in config.keys() and key != "storage":
                    hint = _nearest(key, config.keys())
                    raise TypeError(f"unknown configuration option {key!r}{hint}")
            config._apply(dict(overrides), "activate()")
        return config

    @staticmethod
    def keys() -> list[str]:
        return [f.name for f in fields(RavexConfig) if f.name not in ("sources", "config_file")]

    def _apply(self, values: dict[str, Any], source: str) -> None:
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a mapping of options, got {type(values).__name__}")
        for key, value in values.items():
            if key not in self.keys():
                raise ConfigError(
                    f"unknown key {key!r} in {source}{_nearest(str(key), self.keys())}"
                )
            try:
                if key == "storage":
                    self._set_storage(value, source)
                    continue
                setattr(self, key, _VALIDATORS[key](value))
            except ConfigError:
                raise
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"bad value for {key!r} in {source}: {exc}") from None
            self.sources[key] = source

    def _set_storage(self, value: Any, source: str) -> None:
        if isinstance(value, str):
            self.storage.url = _nonempty_str(value)
            self.sources["storage"] = source
            return
        if not isinstance(value, dict):
            raise ConfigError(
                f"bad value for 'storage' in {source}: expected a path/URL string or a mapping "
                f"with keys {list(STORAGE_KEYS)}, got {value!r}"
            )
        for key, item in value.items():
            if key not in STORAGE_KEYS:
                raise ConfigError(
                    f"unknown key 'storage.{key}' in {source}"
                    f"{_nearest(str(key), STORAGE_KEYS, prefix='storage.')}"
                )
            try:
                if key in ("url", "path"):
                    self.storage.url = _nonempty_str(item)
                elif key == "path_style":
                    self.storage.path_style = _bool(item)
                else:
                    setattr(self.storage, key, None if item is None else _nonempty_str(item))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"bad value for 'storage.{key}' in {source}: {exc}") from None
            self.sources[f"storage.{'url' if key == 'path' else key}"] = source
        self.sources["storage"] = source

    def _apply_env(self, env: Any) -> None:
        values: dict[str, Any] = {}
        storage: dict[str, Any] = {}
        for name, raw in env.items():
            if not name.startswith("RAVEX_") or name == CONFIG_ENV:
                continue
            key = name[len("RAVEX_") :].lower()
            if key in self.keys():
                values[key] = _parse_env(raw)
            elif key.startswith("storage_") and key[len("storage_") :] in STORAGE_KEYS:
                storage[key[len("storage_") :]] = raw
            elif key in ("s3_access_key", "s3_secret_key"):
                storage[key[len("s3_") :]] = raw
            else:
                import logging

                logging.getLogger("ravex").warning(
                    "ignoring unknown environment variable %s%s",
                    name,
                    _nearest(key, self.keys(), prefix="RAVEX_", upper=True),
                )
        # AWS_* are the fallback for credentials, never an override of RAVEX_S3_*.
        if self.storage.access_key is None and "access_key" not in storage:
            if env.get("AWS_ACCESS_KEY_ID"):
                self.storage.access_key = env["AWS_ACCESS_KEY_ID"]
                self.sources["storage.access_key"] = "env AWS_ACCESS_KEY_ID"
        if self.storage.secret_key is None and "secret_key" not in storage:
            if env.get("AWS_SECRET_ACCESS_KEY"):
                self.storage.secret_key = env["AWS_SECRET_ACCESS_KEY"]
                self.sources["storage.secret_key"] = "env AWS_SECRET_ACCESS_KEY"
        for key, value in values.items():
            self._apply({key: value}, f"env RAVEX_{key.upper()}")
        for key, value in storage.items():
            env_name = f"RAVEX_S3_{key.upper()}" if key.endswith("_key") else f"RAVEX_STORAGE_{key.upper()}"
            self._set_storage({key: value}, f"env {env_name}")

    # ── reporting ───────────────────────────────────────────────────────

    def describe(self) -> dict[str, Any]:
        """The effective values (credentials masked), for ``status()``."""
        out: dict[str, Any] = {}
        for name in self.keys():
            if name == "storage":
                out["storage"] = self.storage.url
                for key in ("endpoint", "region"):
                    if getattr(self.storage, key):
                        out[f"storage.{key}"] = getattr(self.storage, key)
                if self.storage.path_style:
                    out["storage.path_style"] = True
                if self.storage.access_key:
                    out["storage.access_key"] = "***"
                continue
            out[name] = getattr(self, name)
        return out

    def source_of(self, key: str) -> str:
        return self.sources.get(key, "default")


# ── validators ──────────────────────────────────────────────────────────


def _parse_env(raw: str) -> Any:
    """Env vars are strings; read them as YAML scalars so ``10``, ``true``, ``null`` work."""
    import yaml

    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw


def _nonempty_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _local_path(value: Any) -> str | None:
    if value is None:
        return None
    path = _nonempty_str(value)
    if "://" in path and not path.startswith("file://"):
        raise ValueError(f"expected a path on this machine (the fast tier), got the URL {value!r}; "
                         f"a remote store is 'storage:'")
    return path


def _replicas(value: Any) -> int:
    if isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"expected 0 (each step only in this machine's 'local:' tier) or 1 (also in the other "
                         f"machine's; two machines under torchrun), got {value!r}")
    return int(value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    raise ValueError(f"expected true or false, got {value!r}")


def _positive_int_or_none(value: Any) -> int | None:
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a positive integer (or null/0 to disable), got {value!r}")
    return value


def _every(value: Any) -> int | str | None:
    if value == "auto":
        return "auto"
    try:
        return _positive_int_or_none(value)
    except ValueError:
        raise ValueError(f"expected a positive integer, 'auto' (from the measured cost and mtbf), or "
                         f"null/0 to disable, got {value!r}") from None


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(value: Any) -> float:
    """Seconds, or a number with a unit: ``90s``, ``30m``, ``6h``, ``2d``."""
    if isinstance(value, str) and (m := re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd])\s*", value)):
        value = float(m.group(1)) * _UNITS[m.group(2)]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"expected a duration such as 6h, 30m, 90s or a number of seconds, got {value!r}")
    return float(value)


def _overhead(value: Any) -> float:
    """A fraction of the training time: ``0.02`` or ``2%``."""
    if isinstance(value, str) and (m := re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", value)):
        value = float(m.group(1)) / 100
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"expected a share of the training time such as 2% or 0.02, got {value!r}")
    return float(value)


def _positive_float_or_none(value: Any) -> float | None:
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"expected a positive number of seconds (or null), got {value!r}")
    return float(value)


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"expected a relative tolerance between 0 and 1 (such as 1e-3), got {value!r}")
    return float(value)


def _at_least_one(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"expected an integer >= 1 (1 copies every tensor at every checkpoint), got {value!r}")
    return value


def _one_of(choices: tuple[str, ...], upper: bool = False) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = value.upper() if upper and isinstance(value, str) else value
        if text not in choices:
            raise ValueError(f"expected one of {list(choices)}, got {value!r}")
        return text

    return check


def _compression(value: Any) -> str:
    """Whatever the format's writer accepts (``none``, ``zstd``, ``zstd:3``, ``blosc``...)."""
    name = _nonempty_str(value)
    try:
        from ravex.format.objects.codecs import parse_compression
    except ImportError:  # pragma: no cover - the writer will say
        return name
    parse_compression(name)  # ValueError names the valid choices
    return name


def _signals(value: Any) -> list[str]:
    if value is True:
        return ["SIGTERM"]
    if value is False or value is None:
        return []
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise ValueError(f"expected a list of signal names like ['SIGTERM'], got {value!r}")
    out = []
    for item in value:
        name = str(item).upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        if not isinstance(getattr(signal, name, None), signal.Signals) or name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"{item!r} is not a signal that can be caught (SIGKILL and SIGSTOP cannot be)")
        out.append(name)
    return out


def _resume(value: Any) -> str | int:
    if isinstance(value, str) and value in ("auto", "never"):
        return value
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}@(0|[1-9][0-9]{0,18})", value):
        return value  # TIMELINE@STEP (spec/FORMAT.md §19)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected 'auto', 'never' or a step number (or TIMELINE@STEP), got {value!r}")
    return value


def _script_variables(value: Any) -> str | list[str]:
    if value in ("auto", "none"):
        return str(value)
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, str) and v.isidentifier() for v in value)):
        raise ValueError(f"expected 'auto', 'none' or a list of variable names like [iter_num, "
                         f"best_val_loss], got {value!r}")
    return list(value)


_VALIDATORS = {
    "checkpoint_every": _every,
    "checkpoint_every_seconds": _positive_float_or_none,
    "mtbf": _duration,
    "max_overhead": _overhead,
    "keep_last": _positive_int_or_none,
    "keep_every": _positive_int_or_none,
    "local": _local_path,
    "persist_every": _at_least_one,
    "persist_keep_last": _positive_int_or_none,
    "replicas": _replicas,
    "compression": _compression,
    "delta": _bool,
    "chunk_tables": _bool,
    "skip_unchanged": _bool,
    "full_stage_every": _at_least_one,
    "staging_max_bytes": _positive_int_or_none,
    "backend": _one_of(BACKENDS),
    "checkpoint_on_exit": _bool,
    "checkpoint_on_signal": _signals,
    "resume": _resume,
    "script_variables": _script_variables,
    "log_level": _one_of(LOG_LEVELS, upper=True),
    "witness": _one_of(WITNESS_MODES),
    "witness_tolerance": _fraction,
}


def _nearest(key: str, choices: Any, prefix: str = "", upper: bool = False) -> str:
    match = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.5)
    if not match:
        return f"; valid keys are {', '.join(prefix + c for c in choices)}"
    name = prefix + (match[0].upper() if upper else match[0])
    return f"; did you mean {name!r}?"


def find_config_file(cwd: str | None = None) -> str | None:
    """``./ravex.yaml`` if it exists. Cheap: one stat, no imports."""
    candidate = os.path.join(cwd or os.getcwd(), CONFIG_FILE)
    return candidate if os.path.isfile(candidate) else None


def _read_yaml(path: str) -> dict[str, Any]:
    import yaml

    fix = "fix the YAML at that line or delete the file"
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist (named by {CONFIG_ENV}?)") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _line_col(raw, exc.start, b"\n")
        raise ConfigError(f"{path}:{line}:{col}: not valid UTF-8 (byte 0x{raw[exc.start]:02x}); {fix}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}:{_yaml_problem(exc, text)}; {fix}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of options, got {type(data).__name__}")
    return data


def _yaml_problem(exc: Any, text: str) -> str:
    """``2:10: not valid YAML: <problem> (<context> at 1:10)``, to follow ``path:``. PyYAML's own
    message is several lines (problem, context, an excerpt with a caret) and its first line alone
    says neither where nor what; keep the 1-based line:column, the problem and its context."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None and hasattr(exc, "position"):  # ReaderError: a character YAML does not allow
        line, col = _line_col(text, exc.position, "\n")
        where = f"{line}:{col}"
        char = ord(exc.character) if isinstance(exc.character, str) else exc.character
        problem = f"unacceptable character #x{char:04x}: {exc.reason}" if isinstance(char, int) else None
    else:
        where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    what = " ".join(str(problem or exc).split())
    context = getattr(exc, "context", None)
    if context:
        cmark = getattr(exc, "context_mark", None)
        same = mark is not None and cmark is not None and (cmark.line, cmark.column) == (mark.line, mark.column)
        at = f" at {cmark.line + 1}:{cmark.column + 1}" if cmark is not None and not same else ""
        what += f" ({' '.join(str(context).split())}{at})"
    return f"{where}: not valid YAML: {what}" if where else f" not valid YAML: {what}"


def _line_col(text: AnyStr, offset: int, newline: AnyStr) -> tuple[int, int]:
    """1-based line and column of ``offset`` in ``text``."""
    start = text.rfind(newline, 0, offset) + 1
    return text.count(newline, 0, offset) + 1, offset - start + 1
