"""What kvtrace knows about a llama.cpp command line: which flags make the debug output visible and
parseable, where the server listens, the flags that matter for triage, and which values are secrets.

Flag names are data (tables below), so a fork's spelling is one more entry.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

REDACTED = "***"

# Debug switches read by libllama / the DFlash fork; each one can be overridden or turned off by the user.
DEBUG_ENV: dict[str, str] = {
    "LLAMA_BATCH_DEBUG": "1",
    "LLAMA_KV_CACHE_DEBUG": "1",
    "GGML_DFLASH_DEBUG": "1",
}

# (flags the user may already have chosen, env names that choose the same, flags we add otherwise).
# `-v` because batch dumps are DEBUG level (-lv 4 on old builds, 5 on new); `-v` works on both.
_LOG_CHOICES: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = [
    (
        ("-v", "--verbose", "--log-verbose", "-lv", "--verbosity", "--log-verbosity"),
        ("LLAMA_LOG_VERBOSITY", "LLAMA_ARG_VERBOSITY", "LLAMA_ARG_LOG_VERBOSITY"),
        ("-v",),
    ),
    (("--log-prefix", "--no-log-prefix"), ("LLAMA_LOG_PREFIX", "LLAMA_ARG_LOG_PREFIX"), ("--log-prefix",)),
    (
        ("--log-timestamps", "--no-log-timestamps"),
        ("LLAMA_LOG_TIMESTAMPS", "LLAMA_ARG_LOG_TIMESTAMPS"),
        ("--log-timestamps",),
    ),
    (("--log-colors",), ("LLAMA_LOG_COLORS", "LLAMA_ARG_LOG_COLORS"), ("--log-colors", "off")),
]

# Triage flags: canonical name -> spellings (upstream short/long, older names, beellama.cpp names).
VALUE_FLAGS: dict[str, tuple[str, ...]] = {
    "model": ("-m", "--model"),
    "hf_repo": ("-hf", "-hfr", "--hf-repo"),
    "model_draft": ("-md", "--model-draft", "--spec-draft-model"),
    "hf_repo_draft": ("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"),
    "spec_type": ("--spec-type",),
    "n_gpu_layers": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
    "n_gpu_layers_draft": ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"),
    "split_mode": ("-sm", "--split-mode"),
    "tensor_split": ("-ts", "--tensor-split"),
    "main_gpu": ("-mg", "--main-gpu"),
    "device": ("-dev", "--device"),
    "device_draft": ("-devd", "--device-draft", "--spec-draft-device"),
    "parallel": ("-np", "--parallel"),
    "ctx_size": ("-c", "--ctx-size"),
    "ctx_size_draft": ("-cd", "--ctx-size-draft"),
    "batch_size": ("-b", "--batch-size"),
    "ubatch_size": ("-ub", "--ubatch-size"),
    "cache_type_k": ("-ctk", "--cache-type-k"),
    "cache_type_v": ("-ctv", "--cache-type-v"),
    "cache_type_k_draft": ("-ctkd", "--cache-type-k-draft", "--spec-draft-type-k"),
    "cache_type_v_draft": ("-ctvd", "--cache-type-v-draft", "--spec-draft-type-v"),
    "draft_n_max": ("--spec-draft-n-max", "--draft-max", "--draft", "--draft-n"),
    "draft_n_min": ("--spec-draft-n-min", "--draft-min"),
    "draft_p_min": ("--spec-draft-p-min", "--draft-p-min"),
    "kv_unified_per_slot": ("--kv-unified-per-slot",),
    "fit_target": ("-fitt", "--fit-target"),
    "dflash_cross_ctx": ("--spec-dflash-cross-ctx",),
    "branch_budget": ("--spec-branch-budget",),
    "host": ("--host",),
    "port": ("--port",),
}
BOOL_FLAGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # name: (spellings that turn it on, spellings that turn it off)
    "kv_unified": (("-kvu", "--kv-unified"), ("--no-kv-unified",)),
    "cont_batching": (("-cb", "--cont-batching"), ("-nocb", "--no-cont-batching")),
    "mmap": ((), ("--no-mmap",)),
    "mlock": (("--mlock",), ()),
}
# --flash-attn takes on/off/auto on new builds and is a bare switch on old ones.
FLASH_ATTN = ("-fa", "--flash-attn")
_FA_VALUES = {"on", "off", "auto", "true", "false", "1", "0", "enabled", "disabled"}
# LLAMA_ARG_* environment equivalents, read when the flag is absent.
ENV_FLAGS: dict[str, str] = {
    "LLAMA_ARG_HOST": "host",
    "LLAMA_ARG_PORT": "port",
    "LLAMA_ARG_MODEL": "model",
    "LLAMA_ARG_MODEL_DRAFT": "model_draft",
    "LLAMA_ARG_N_GPU_LAYERS": "n_gpu_layers",
    "LLAMA_ARG_SPLIT_MODE": "split_mode",
    "LLAMA_ARG_N_PARALLEL": "parallel",
    "LLAMA_ARG_CTX_SIZE": "ctx_size",
    "LLAMA_ARG_FLASH_ATTN": "flash_attn",
    "LLAMA_ARG_KV_UNIFIED": "kv_unified",
}

_SECRET_FLAGS = ("--api-key", "--hf-token", "-hft", "--hf_token")
_SECRET_FLAG_WORDS = re.compile(r"token|api[-_]?key|secret|passw", re.IGNORECASE)
_SECRET_ENV = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")

_LLAMA_NAMES = re.compile(r"^(llama|beellama|ik[-_]llama)[-_][a-z0-9][-_.a-z0-9]*$", re.IGNORECASE)


def is_llama_program(argv0: str) -> bool:
    """True for llama.cpp programs (llama-server, llama-cli, a fork's build of them)."""
    name = PurePath(argv0).name
    if name.lower().endswith(".exe"):
        name = name[:-4]
    return bool(_LLAMA_NAMES.match(name))


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0] if token.startswith("--") else token


def has_flag(argv: Sequence[str], spellings: Sequence[str]) -> bool:
    return any(_flag_name(t) in spellings for t in argv[1:])


@dataclass(slots=True)
class Augmented:
    argv: list[str]
    added: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # wanted, but this build's --help does not list it


def _lists(help_text: str, flag: str) -> bool:
    return bool(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text))


def add_log_flags(argv: Sequence[str], env: Mapping[str, str], help_text: str | None) -> Augmented:
    """Append the flags that make batch dumps visible and lines parseable, unless the user chose already.

    `help_text` is the program's `--help` output when available: a flag it does not list is left out, so
    an older or newer build is never handed an option it rejects.
    """
    out = Augmented(list(argv))
    for chosen, env_names, ours in _LOG_CHOICES:
        if has_flag(argv, chosen) or any(name in env for name in env_names):
            continue
        if help_text is not None and not _lists(help_text, ours[0]):
            out.skipped.append(ours[0])
            continue
        out.argv.extend(ours)
        out.added.extend(ours)
    return out


# llama-server's /metrics (the server's own draft counters): off unless `--metrics` or its environment name.
METRICS_FLAG = "--metrics"
_METRICS_ENV = ("LLAMA_ARG_ENDPOINT_METRICS",)
_FALSE = {"0", "false", "off", "no", "disabled", ""}


def serves_metrics(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether this command line turns llama-server's /metrics on."""
    value = next((env[name] for name in _METRICS_ENV if name in env), None)
    return has_flag(argv, (METRICS_FLAG,)) or (value is not None and value.strip().lower() not in _FALSE)


def add_metrics_flag(argv: Sequence[str], env: Mapping[str, str], help_text: str | None) -> list[str]:
    """The command line with `--metrics` appended when this build's --help lists it and the server does not
    serve /metrics already (a build whose --help is unknown, or a program that is no server, is never handed
    it)."""
    if help_text is None or serves_metrics(argv, env) or not _lists(help_text, METRICS_FLAG):
        return list(argv)
    return [*argv, METRICS_FLAG]


def _values(argv: Sequence[str]) -> dict[str, object]:
    """Read the triage flags; the last occurrence wins, as in llama.cpp."""
    found: dict[str, object] = {}
    lookup = {s: name for name, spellings in VALUE_FLAGS.items() for s in spellings}
    i = 1
    while i < len(argv):
        tok = argv[i]
        name_part, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        if name_part in lookup:
            if eq:
                found[lookup[name_part]] = inline
            elif i + 1 < len(argv):
                found[lookup[name_part]] = argv[i + 1]
                i += 1
        elif name_part in FLASH_ATTN:
            if eq:
                found["flash_attn"] = inline
            elif i + 1 < len(argv) and argv[i + 1].lower() in _FA_VALUES:
                found["flash_attn"] = argv[i + 1]
                i += 1
            else:
                found["flash_attn"] = "on"
        else:
            for bname, (on, off) in BOOL_FLAGS.items():
                if name_part in on:
                    found[bname] = True
                elif name_part in off:
                    found[bname] = False
        i += 1
    return found


def triage_flags(argv: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, object]:
    """The flags that matter for triage, from the command line, then LLAMA_ARG_* environment variables."""
    found = _values(argv)
    for env_name, name in ENV_FLAGS.items():
        if env is not None and env_name in env and name not in found:
            found[name] = env[env_name]
    return found


def endpoint(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Where llama-server listens (its defaults: 127.0.0.1:8080); a wildcard host is reached via loopback."""
    flags = triage_flags(argv, env)
    host = str(flags.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    try:
        port = int(str(flags.get("port") or 8080))
    except ValueError:
        port = 8080
    return host, port


def listen_address(argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """Where the server binds, as its command line says (a wildcard host stays one): where `--record` listens
    in its place."""
    host = str(triage_flags(argv, env).get("host") or "127.0.0.1")
    return (host.strip("[]") or "127.0.0.1"), endpoint(argv, env)[1]


def listening_at(argv: Sequence[str], host: str, port: int) -> list[str]:
    """The command line with the server moved to host:port: each --host/--port value replaced (all spellings,
    `--port=N` too), or the flags appended where it had none (they outrank LLAMA_ARG_HOST/PORT)."""
    out = [argv[0]]
    seen: set[str] = set()
    values = {"host": host, "port": str(port)}
    i = 1
    while i < len(argv):
        tok = argv[i]
        name_part, eq, _ = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        which = next((k for k in values if name_part in VALUE_FLAGS[k]), None)
        if which is None:
            out.append(tok)
        elif eq:
            out.append(f"{name_part}={values[which]}")
            seen.add(which)
        else:
            out += [tok, values[which]]
            seen.add(which)
            i += 1
        i += 1
    for which in ("host", "port"):
        if which not in seen:
            out += [VALUE_FLAGS[which][0], values[which]]
    return out


def base_url(host: str, port: int) -> str:
    """The server's HTTP address (an IPv6 host in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def api_key(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    key: str | None = None
    for i, tok in enumerate(argv):
        if tok == "--api-key" and i + 1 < len(argv):
            key = argv[i + 1]
        elif tok.startswith("--api-key="):
            key = tok.split("=", 1)[1]
    if key is None and env is not None:
        key = env.get("LLAMA_API_KEY") or None
    return key.split(",")[0] if key else None


def _is_secret_flag(name: str) -> bool:
    if name in _SECRET_FLAGS:
        return True
    # A file path to a secret is not itself a secret (and says where the user keeps it: useful).
    return name.startswith("-") and bool(_SECRET_FLAG_WORDS.search(name)) and not name.endswith("-file")


def redact_text(text: str) -> str:
    return _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + REDACTED + "@", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with secret values replaced, for the manifest and the screen."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if tok.startswith("-") and "=" in tok and _is_secret_flag(tok.split("=", 1)[0]):
            out.append(tok.split("=", 1)[0] + "=" + REDACTED)
        elif _is_secret_flag(tok):
            out.append(tok)
            hide_next = True
        else:
            out.append(redact_text(tok))
    return out


def is_secret_env(name: str) -> bool:
    return bool(_SECRET_ENV.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_env(k) else redact_text(v)) for k, v in env.items()}


# Environment variables worth recording (never the whole environment: it is full of unrelated secrets).
_RELEVANT_ENV = re.compile(r"^(LLAMA_|GGML_|CUDA_|HIP_|ROCR_|GPU_|HSA_|VK_|ONEAPI_|ZES_|OMP_|NVIDIA_)")


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    return redact_env({k: v for k, v in sorted(env.items()) if _RELEVANT_ENV.match(k)})


def shell_join(argv: Sequence[str]) -> str:
    return shlex.join(list(argv))


def environ_with(overrides: Mapping[str, str | None]) -> dict[str, str]:
    """os.environ with overrides applied; None removes a variable."""
    env = dict(os.environ)
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
