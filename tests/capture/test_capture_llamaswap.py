"""`kvtrace capture llama-swap CONFIG MODEL`: the seed report's config, macros, env, and bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtrace.capture.llamaswap import ConfigError, resolve
from tests.capture.capture_helpers import manifest, run_kvtrace, write_script

SEED_CONFIG = Path(__file__).parents[1] / "fixtures" / "llama-swap" / "beellama-28-seed.yaml"
SEED_BINARY = "/home/fred/workspaces/ai/beellama.cpp/build/bin/llama-server"


def test_seed_config_loads_and_expands() -> None:
    m = resolve(SEED_CONFIG, "bee_qwen3.6-27b", port=5811)
    assert m.argv[0] == SEED_BINARY
    assert m.argv[m.argv.index("--port") + 1] == "5811"
    assert m.argv[m.argv.index("--spec-draft-model") + 1] == (
        "/home/fred/.cache/huggingface/hub/Qwen3.6-27B-DFlash-Q4_K_M.gguf"
    )
    assert m.argv[
        m.argv.index("--cache-type-k") : m.argv.index("--cache-type-k") + 4
    ] == ["--cache-type-k", "turbo4", "--cache-type-v", "turbo3_tcq"]
    assert m.argv[-2:] == ["--ctx-size", "32000"]
    assert m.health_path == "/health" and m.env == {}


def test_seed_config_model_variant_brings_its_parameters() -> None:
    m = resolve(SEED_CONFIG, "bee_qwen3.6-27b:thinking-coding", port=5811)
    assert m.model_id == "bee_qwen3.6-27b"
    assert m.request_params["temperature"] == 0.6
    assert m.request_params["chat_template_kwargs"] == {"enable_thinking": True, "preserve_thinking": True}


def test_seed_config_fails_on_the_missing_program_after_loading(tmp_path: Path) -> None:
    proc = run_kvtrace("capture", "llama-swap", str(SEED_CONFIG), "bee_qwen3.6-27b", "--root",
                       str(tmp_path / "sessions"), cwd=tmp_path)
    assert proc.returncode == 2
    err = proc.stderr.decode().strip()
    assert err == (f"kvtrace: error: model 'bee_qwen3.6-27b' in {SEED_CONFIG}: program not found: {SEED_BINARY}")
    assert not (tmp_path / "sessions").exists()


CONFIG = """
macros:
  "tiny-args": "--marker ${{MODEL_ID}}"
  py: "{py}"
models:
  good:
    cmd: |
      # comment lines in a cmd are allowed
      ${{py}} {script} --port ${{PORT}} ${{tiny-args}}
    env:
      - "SWAP_VAR=from-env ${{MODEL_ID}}"
      - "HF_TOKEN=hf_secret_value"
    aliases: ["good-alias"]
  broken-quote:
    cmd: '{script} --name "unclosed'
  unknown-macro:
    cmd: '{script} --port ${{PORT}} ${{NOPE}}'
  starts-something:
    cmd: '{py} {marker_script}'
"""


@pytest.fixture
def config(tmp_path: Path, py: str) -> Path:
    script = write_script(tmp_path / "child.py", """
        import json, os, sys
        print(json.dumps({"argv": sys.argv[1:], "SWAP_VAR": os.environ.get("SWAP_VAR")}), flush=True)
    """)
    marker_script = write_script(tmp_path / "marker.py", """
        open(__file__ + ".started", "w").write("started")
    """)
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(py=py, script=script, marker_script=marker_script))
    return path


def test_macros_env_and_aliases(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "llama-swap", str(config), "good-alias", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    seen = json.loads((out / "raw.log").read_text())
    port = seen["argv"][seen["argv"].index("--port") + 1]
    assert port.isdigit() and int(port) > 0
    assert seen["argv"][-2:] == ["--marker", "good"]
    assert seen["SWAP_VAR"] == "from-env good"
    m = manifest(out)
    assert m["kind"] == "llama-swap"
    assert m["llama_swap"]["model_id"] == "good" and m["llama_swap"]["port"] == int(port)
    assert "hf_secret_value" not in (out / "manifest.json").read_text()
    assert m["llama_swap"]["env"]["HF_TOKEN"] == "***"


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("missing", "model 'missing' is not in the config (models: broken-quote, good, starts-something, "
                    "unknown-macro)"),
        ("broken-quote", "model 'broken-quote': cmd cannot be split into arguments: No closing quotation"),
        ("unknown-macro", "model 'unknown-macro' cmd: unknown macro ${NOPE}"),
    ],
)
def test_bad_entries_are_one_line_errors_and_start_nothing(config: Path, tmp_path: Path, model: str,
                                                           message: str) -> None:
    proc = run_kvtrace("capture", "llama-swap", str(config), model, "--root", str(tmp_path / "sessions"),
                       cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == f"kvtrace: error: {message}"
    assert not (tmp_path / "sessions").exists()
    assert not (tmp_path / "marker.py.started").exists()


def test_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  a: [unclosed\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML \(line \d+\)"):
        resolve(bad, "a", port=1)
    empty = tmp_path / "empty.yaml"
    empty.write_text("healthCheckTimeout: 60\n")
    with pytest.raises(ConfigError, match="has no `models:` section"):
        resolve(empty, "a", port=1)
    with pytest.raises(ConfigError, match="cannot read llama-swap config"):
        resolve(tmp_path / "absent.yaml", "a", port=1)


SERVER = """
import http.server, json, sys
port, record = int(sys.argv[sys.argv.index("--port") + 1]), sys.argv[sys.argv.index("--record") + 1]

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/ready" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(record, "a") as f:
            f.write(json.dumps({"path": self.path, "body": body}) + "\\n")
        out = json.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                          "timings": {"draft_n": 4, "draft_n_accepted": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, fmt, *args):
        sys.stderr.write("srv  log_server_r: " + (fmt % args) + "\\n")

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_ping_uses_the_models_own_parameters(tmp_path: Path, py: str) -> None:
    server = write_script(tmp_path / "server.py", SERVER)
    record = tmp_path / "requests.jsonl"
    config = tmp_path / "config.yaml"
    config.write_text(f"""
models:
  qwen-dflash:
    cmd: {py} {server} --port ${{PORT}} --record {record}
    checkEndpoint: /ready
    filters:
      setParams:
        top_k: 20
      setParamsByID:
        "${{MODEL_ID}}:coding":
          temperature: 0.6
""")
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "llama-swap", str(config), "qwen-dflash:coding", "--ping", "2",
                       "--max-tokens", "5", "--out", str(out), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    assert [s["path"] for s in sent] == ["/v1/chat/completions"] * 2
    body = sent[0]["body"]
    assert body["model"] == "qwen-dflash:coding" and body["max_tokens"] == 5
    assert body["top_k"] == 20 and body["temperature"] == 0.6
    m = manifest(out)
    assert m["ping"]["answered"] == 2 and m["ping"]["draft_n"] == 8
    assert m["ping_config"]["health_path"] == "/ready"
    assert b"POST /v1/chat/completions" in (out / "raw.log").read_bytes()
