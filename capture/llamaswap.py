"""Read a llama-swap YAML config and turn one model's entry into the command `capture run` wraps.

Accepts a whole config (`models:` at the top) or just the model entries pasted from one (as in a bug
report). Everything is checked before anything starts: a missing model or a cmd that cannot be split is a
one-line error.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

_MACRO = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")
_MACRO_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
DEFAULT_HEALTH = "/health"


class ConfigError(Exception):
    """The config cannot give a command to run (one-line message, exit 2)."""


@dataclass(slots=True)
class SwapModel:
    config: Path
    model_id: str  # the entry's id in `models:`
    requested: str  # what the user asked for (an id, an alias, or a setParamsByID name)
    argv: list[str]
    env: dict[str, str]
    port: int | None
    health_path: str | None  # None when checkEndpoint is "none"
    request_params: dict[str, Any] = field(default_factory=dict)
    raw_cmd: str = ""


def load_config(path: Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read llama-swap config {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path} is not valid YAML{where}: {problem}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a llama-swap config (expected a mapping at the top)")
    if "models" not in data:
        # Just the entries, as pasted from a config: the top level is the models mapping.
        if data and all(isinstance(v, dict) and "cmd" in v for v in data.values()):
            data = {"models": data}
        else:
            raise ConfigError(f"{path} has no `models:` section")
    if not isinstance(data["models"], dict) or not data["models"]:
        raise ConfigError(f"{path}: `models:` is empty or not a mapping")
    return data


def _find_model(models: dict[str, Any], requested: str) -> tuple[str, dict[str, Any]]:
    if requested in models:
        return requested, models[requested]
    for mid, entry in models.items():
        if isinstance(entry, dict) and requested in (entry.get("aliases") or []):
            return mid, entry
    # "<id>:<variant>" names a setParamsByID entry of model <id>.
    base = requested.split(":", 1)[0]
    if ":" in requested and base in models:
        return base, models[base]
    names = ", ".join(sorted(str(m) for m in models))
    raise ConfigError(f"model {requested!r} is not in the config (models: {names})")


def _macros(config: dict[str, Any], entry: dict[str, Any], model_id: str, port: int | None) -> dict[str, str]:
    macros: dict[str, str] = {}
    for scope in (config.get("macros") or {}, entry.get("macros") or {}):
        if not isinstance(scope, dict):
            raise ConfigError("`macros` must be a mapping of name: value")
        for k, v in scope.items():
            if not _MACRO_NAME.match(str(k)):
                raise ConfigError(f"macro name {k!r} is not valid")
            macros[str(k)] = str(v)
    macros["MODEL_ID"] = model_id
    if port is not None:
        macros["PORT"] = str(port)
    return macros


def expand(text: str, macros: dict[str, str], *, what: str) -> str:
    """Replace ${NAME}; macros may use earlier macros. An unknown name is an error, as in llama-swap."""
    for _ in range(10):
        new = _MACRO.sub(lambda m: macros.get(m.group(1), m.group(0)), text)
        if new == text:
            break
        text = new
    unknown = sorted({m.group(1) for m in _MACRO.finditer(text)})
    if unknown:
        raise ConfigError(f"{what}: unknown macro {', '.join('${' + u + '}' for u in unknown)}")
    return text


def _strip_comments(cmd: str) -> str:
    # llama-swap allows comment lines inside a multi-line cmd.
    return "\n".join(line for line in cmd.splitlines() if not line.lstrip().startswith("#"))


def resolve(config_path: Path, requested: str, *, port: int | None) -> SwapModel:
    config = load_config(config_path)
    models = config["models"]
    model_id, entry = _find_model(models, requested)
    if not isinstance(entry, dict):
        raise ConfigError(f"model {model_id!r}: entry is not a mapping")
    cmd = entry.get("cmd")
    if not isinstance(cmd, str) or not cmd.strip():
        raise ConfigError(f"model {model_id!r}: `cmd` is missing or empty")
    macros = _macros(config, entry, model_id, port)
    expanded = expand(_strip_comments(cmd), macros, what=f"model {model_id!r} cmd")
    try:
        argv = shlex.split(expanded)
    except ValueError as exc:
        raise ConfigError(f"model {model_id!r}: cmd cannot be split into arguments: {exc}") from exc
    if not argv:
        raise ConfigError(f"model {model_id!r}: `cmd` is empty after macro expansion")

    env: dict[str, str] = {}
    raw_env = entry.get("env") or []
    if not isinstance(raw_env, list):
        raise ConfigError(f"model {model_id!r}: `env` must be a list of NAME=VALUE strings")
    for item in raw_env:
        name, eq, value = str(item).partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"model {model_id!r}: env entry {item!r} is not NAME=VALUE")
        env[name.strip()] = expand(value, macros, what=f"model {model_id!r} env {name.strip()}")

    check = entry.get("checkEndpoint", DEFAULT_HEALTH)
    health = None if str(check).strip().lower() == "none" else str(check or DEFAULT_HEALTH)

    params: dict[str, Any] = {}
    filters = entry.get("filters") or {}
    if isinstance(filters, dict):
        if isinstance(filters.get("setParams"), dict):
            params.update(filters["setParams"])
        by_id = filters.get("setParamsByID") or {}
        if isinstance(by_id, dict):
            for key, value in by_id.items():
                if expand(
                    str(key), macros, what=f"model {model_id!r} setParamsByID"
                ) == requested and isinstance(value, dict):
                    params.update(value)
    return SwapModel(
        config=Path(config_path),
        model_id=model_id,
        requested=requested,
        argv=argv,
        env=env,
        port=port,
        health_path=health,
        request_params=params,
        raw_cmd=cmd,
    )
