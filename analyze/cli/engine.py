"""`kvtrace capture engine` and `kvtrace demo`: thin click commands over capture/engine/."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvtrace.analyze.cli.options import json_flag, progress_option, session_out_option, want_progress
from kvtrace.capture.engine.config import (
    DRAFTING,
    FAULTS,
    MAX_DEVICES,
    SPEC_TYPES,
    SPLIT_MODES,
    EngineConfig,
    EngineError,
    require_llama_cpp,
)
from kvtrace.capture.engine.lines import FLAVORS
from kvtrace.capture.engine.llama_log import LOG_FORMATS

if TYPE_CHECKING:
    from kvtrace.capture.engine.records import EngineResult


def _tensor_split(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[float, ...]:
    if not value:
        return ()
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter("a comma-separated list of numbers, e.g. 3,1") from None


def _fault_at(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[int, int | None]:
    if not value:
        return (1, None)
    request, _, cycle = value.partition(":")
    try:
        return int(request), int(cycle) if cycle else None
    except ValueError:
        raise click.BadParameter("REQUEST or REQUEST:CYCLE, both counted from 0, e.g. 1:10") from None


def _endpoints(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def _engine_options(f: Any) -> Any:
    opts = [
        click.option("--fault", type=click.Choice(FAULTS), default="none", show_default=True,
                     help="Break the drafter's bookkeeping the way a real bug does (none = healthy). "
                     "silent-stale, stops-drafting and drafter-lags are never refused where they start (their "
                     "onset is in ground_truth.parquet's `fault`): draft-simple and draft-dflash only."),
        click.option("--fault-at", callback=_fault_at, metavar="REQUEST[:CYCLE]",
                     help="Where a silent fault starts, counted from 0 (default 1, a third into the request; "
                     "stops-drafting: the request's start)."),
        click.option("--lag-cycles", type=click.IntRange(min=1), default=8, show_default=True,
                     help="drafter-lags: cycles the drafter's cache stays put before llama.cpp refuses it."),
        click.option("--spec-type", type=click.Choice(SPEC_TYPES), default="draft-dflash", show_default=True,
                     help="llama.cpp's speculative type: draft-dflash and draft-eagle3 run real DFlash / EAGLE3 "
                     "drafters on the target's layer inputs; draft-simple a plain llama drafter (see --drafting)."),
        click.option("--requests", type=click.IntRange(min=1), default=3, show_default=True,
                     help="Requests in a row on one slot (new prompt, shared-prefix reuse, clear, ...)."),
        click.option("--cycles", type=click.IntRange(min=1), default=32, show_default=True,
                     help="Draft/verify cycles per request."),
        click.option("--draft", "-k", type=click.IntRange(1, 64), default=3, show_default=True,
                     help="Tokens drafted per cycle (k; upstream's --spec-draft-n-max)."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the generated models and prompts."),
        click.option("--target", type=click.Path(dir_okay=False, path_type=Path),
                     help="A real target GGUF (with --drafter; default: the generated tiny pair)."),
        click.option("--drafter", type=click.Path(dir_okay=False, path_type=Path),
                     help="A real drafter GGUF (a dflash model for draft-dflash)."),
        click.option("--log-prefix/--no-log-prefix", default=True, show_default=True,
                     help="The new-scheme `M.SS.mmm.uuu L ` prefix on each log entry."),
        click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
                     help="raw.log as text, or as the JSON objects llama.cpp's --log-jsonl writes (one per log "
                     "call; --no-log-prefix then writes `time` 0, as --log-timestamps off does)."),
        click.option("--kv-debug/--no-kv-debug", default=True, show_default=True,
                     help="LLAMA_KV_CACHE_DEBUG=1 (find_slot lines); off to measure attribution without it."),
        click.option("--flavor", type=click.Choice(FLAVORS), default="fork", show_default=True,
                     help="Wording of the server/speculative lines: beellama fork (new or v0.2.0) or upstream."),
        click.option("--drafting", type=click.Choice(DRAFTING), default="block", show_default=True,
                     help="draft-simple only. block: one [id_last, mask x k] drafter batch per cycle; chain: k "
                     "one-token drafter decodes."),
        click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
                     help="CPU threads per context (1 is fastest for the tiny models)."),
        click.option("--n-gpu-layers", "-ngl", type=int, default=None,
                     help="Layers to offload to the devices (-1 = all; default: all with --devices or --rpc, "
                     "else 0)."),
        click.option("--split-mode", "-sm", type=click.Choice(list(SPLIT_MODES)), default="layer",
                     show_default=True, help="How the target spreads over several devices."),
        click.option("--tensor-split", "-ts", callback=_tensor_split, metavar="A,B,...",
                     help="Share of the target per device, e.g. 3,1."),
        click.option("--main-gpu", "-mg", type=click.IntRange(min=0), default=0, show_default=True,
                     help="The device used with --split-mode none (an index into the run's devices)."),
        click.option("--devices", type=click.IntRange(0, MAX_DEVICES), default=0, show_default=True,
                     help="Start N llama.cpp RPC devices on loopback (this llama.cpp's own, one CPU each), "
                     "stopped when the capture ends: a multi-GPU layout on one CPU."),
        click.option("--rpc", callback=_endpoints, metavar="HOST:PORT,...",
                     help="Your own llama.cpp RPC servers on loopback, each one more device (run one with "
                     "python -m kvtrace.capture.engine.rpc_server -p PORT: the same llama.cpp)."),
        click.option("--draft-device", "-devd", default="", metavar="DEVICE",
                     help="The drafter's device, as llama-server's -devd: RPC1 (names as llama.cpp gives "
                     "them, RPC0 first), none = the CPU; default: the target's devices."),
        click.option("--pace", "pace_s", type=click.FloatRange(0, 60), default=0.0, show_default=True,
                     metavar="SECONDS", help="Sleep this long after each cycle (the log flushed first): a "
                     "capture slow enough to follow live with kvtrace dashboard SESSION --follow."),
        session_out_option,
        progress_option,
    ]  # fmt: skip
    for opt in reversed(opts):
        f = opt(f)
    return f


def _config(kw: dict[str, Any]) -> EngineConfig:
    progress = kw.pop("progress")
    return EngineConfig(
        fault=kw["fault"],
        spec_type=kw["spec_type"],
        requests=kw["requests"],
        cycles=kw["cycles"],
        draft=kw["draft"],
        seed=kw["seed"],
        target=kw["target"],
        drafter=kw["drafter"],
        log_prefix=kw["log_prefix"],
        log_format=kw["log_format"],
        kv_debug=kw["kv_debug"],
        flavor=kw["flavor"],
        drafting=kw["drafting"],
        n_threads=kw["threads"],
        n_gpu_layers=kw["n_gpu_layers"] if kw["n_gpu_layers"] is not None else -1 if kw["devices"] or kw["rpc"] else 0,
        split_mode=kw["split_mode"],
        tensor_split=kw["tensor_split"],
        main_gpu=kw["main_gpu"],
        rpc=kw["rpc"],
        devices=kw["devices"],
        draft_device=kw["draft_device"],
        progress=want_progress(progress),
        pace_s=kw["pace_s"],
        fault_at=kw["fault_at"],
        lag_cycles=kw["lag_cycles"],
    )


def capture_engine(config: EngineConfig, out: Path | None, label: str = "") -> EngineResult:
    """Run the engine into a new session folder; bad settings exit 2 with one line. Ctrl-C, SIGTERM and SIGHUP
    stop it at its next decode: the session is written up, the RPC devices it started are stopped, and the
    exit code is 128 + the signal's number."""
    import signal
    import threading

    from kvtrace.analyze.reader.session import new_session
    from kvtrace.capture.engine import engine_models, run_engine
    from kvtrace.capture.engine.config import EngineStopped, check_stop, request_stop
    from kvtrace.capture.engine.devices import open_devices

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, request_stop) for sig in handled} if main else {}
    session = None
    try:
        require_llama_cpp()
        config.validate()
        # devices and models before the folder exists: an unusable setting leaves nothing behind
        with open_devices(config) as devices:
            check_stop()
            models = engine_models(config)
            session = new_session("engine", label or config.fault, out=out)
            result = run_engine(config, session, models, devices)
        check_stop()
        return result
    except EngineError as exc:
        click.echo(f"kvtrace: {exc}", err=True)
        raise SystemExit(2) from None
    except EngineStopped as exc:
        where = f"; {session.path} holds what it captured" if session is not None else ""
        click.echo(f"kvtrace: {exc}{where}", err=True)
        raise SystemExit(128 + exc.signum) from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def layout_text(layout: dict[str, Any]) -> str:
    """`RPC0 127.0.0.1:50152, RPC1 127.0.0.1:50153 (started here); target on RPC0, RPC1; drafter on RPC1`."""
    rpc = layout["rpc"]
    started = " (started here)" if all(d["started_here"] for d in rpc) else ""
    devices = ", ".join(f"{d['device']} {d['endpoint']}" for d in rpc)
    return f"{devices}{started}; target on {', '.join(layout['target'])}; drafter on {', '.join(layout['drafter'])}"


@click.command(name="engine")
@_engine_options
@json_flag("Print the capture's summary as JSON on stdout.")
def engine_cmd(as_json: bool, out: Path | None, **kw: Any) -> None:
    """Run real target + drafter speculative decoding (llama.cpp via llama-cpp-python) and capture it.

    With --spec-type draft-dflash (the default) the drafter is a real upstream `dflash` model run by
    llama.cpp's own DFlash graph: each cycle the target verifies the draft in one batch, its layer inputs
    go into the drafter's KV at the same positions (one embedding batch), the drafter decodes the noise
    block [id_last, <mask> x k] non-causally, and the block is removed after drafting.

    Writes SESSION/raw.log (every llama.cpp line, batch dumps and find_slot lines included, plus the
    server lines a real slot prints), SESSION/ground_truth.parquet (one row per decode call, from the
    API, with what it was: prompt, verify, inject, noise, draft, commit) and SESSION/manifest.json.
    Without --target/--drafter it generates a tiny model pair once (cached under $KVTRACE_CACHE or
    ~/.cache/kvtrace/models): no download, no GPU needed.

    With --devices N the target is split over N llama.cpp RPC devices started on loopback (this
    llama.cpp's own, stopped when the capture ends), the drafter on the one --draft-device names.

    With --spec-type draft-simple the generated drafter shares the target's weights (its later layers
    scaled down), so most drafts are accepted and a collapse stands out.

    Exit code: 0 captured (injected failures included); 1 a healthy run (--fault none) hit a decode
    failure; 2 bad settings, models or devices; 128 + N stopped by signal N (Ctrl-C: 130), the session
    written up to there.

    \b
    Examples:
      kvtrace capture engine --fault stale-drafter
      kvtrace capture engine --fault no-rollback --draft 8 --out ./repro
      kvtrace capture engine --spec-type draft-simple --fault silent-stale --fault-at 1:10
      kvtrace capture engine --fault stops-drafting --requests 4 --devices 2
      kvtrace capture engine --spec-type draft-eagle3 --fault stale-drafter
      kvtrace capture engine --spec-type draft-simple --drafting chain --flavor upstream
      kvtrace capture engine --requests 4 --cycles 250 --json          # 1,000 cycles
      kvtrace capture engine --no-kv-debug --no-log-prefix --flavor fork-v0.2
      kvtrace capture engine --fault stale-drafter --log-format jsonl
      kvtrace capture engine --devices 2 --tensor-split 1,1 --draft-device RPC1
      kvtrace capture engine --target t.gguf --drafter d.gguf -ngl 99 --tensor-split 1,1
    """
    config = _config(kw)
    result = capture_engine(config, out)
    summary = result.summary()
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"session:  {result.session}")
        click.echo(
            f"engine:   {config.spec_type} fault={config.fault} requests={result.n_requests} "
            f"cycles={len(result.cycles)} draft={config.draft} in {result.duration_s:.2f} s"
        )
        click.echo(
            f"decodes:  {result.n_decodes} ({result.n_failures} refused by llama.cpp); "
            f"drafts accepted {result.accepted}/{result.drafted} ({result.acceptance:.1%})"
        )
        if result.layout:
            click.echo(f"devices:  {layout_text(result.layout)}")
        click.echo(f"next:     kvtrace triage {result.session}")
    if config.fault == "none" and result.n_failures:
        raise SystemExit(1)


def _dashboard_ready() -> bool:
    """`kvtrace demo` opens the dashboard only once the app exists (an empty placeholder does not count)."""
    try:
        from kvtrace.analyze.dashboard.launch import app_path
    except ImportError:
        return False
    app = app_path()
    return app.is_file() and app.stat().st_size > 0


@click.command(name="demo")
@click.option("--no-dashboard", is_flag=True, help="Stop after printing the triage.")
@session_out_option
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated models and prompts.")
@click.option("--port", type=click.IntRange(1, 65535), help="Dashboard port (default: the first free from 8501).")
@click.option("--devices", type=click.IntRange(0, MAX_DEVICES), default=0, show_default=True,
              help="Run on N llama.cpp RPC devices on loopback: the target split by layer over all of them, the "
              "drafter on the last (the seed report's multi-GPU layout on one CPU).")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              help="raw.log as text, or as the JSON objects llama.cpp's --log-jsonl writes.")
def demo_command(no_dashboard: bool, out: Path | None, seed: int, port: int | None, devices: int,
                 log_format: str) -> None:
    """See the drafter-KV failure for real in a minute: no GPU, no download.

    Generates a tiny target and a tiny DFlash drafter, runs real llama.cpp speculative decoding
    (upstream's DFlash graph) with a drafter that goes stale at a request reset (`--fault
    stale-drafter`), reads the captured log and prints
    the triage, then opens the dashboard on it at http://127.0.0.1:PORT (Ctrl-C to stop).
    With --devices 2: on two RPC devices started on loopback, target split by layer over RPC0 and
    RPC1 (-ngl all -sm layer -ts 1,1), the drafter on RPC1 (-devd RPC1).

    \b
    Examples:
      kvtrace demo
      kvtrace demo --no-dashboard
      kvtrace demo --devices 2
      kvtrace demo --no-dashboard --log-format jsonl
      kvtrace demo --out ./demo-session --port 8600
    """
    from kvtrace.capture.models import ensure_upstream_drafter

    try:
        require_llama_cpp()
    except EngineError as exc:
        click.echo(f"kvtrace: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo("1/3 models: generating (or reusing) the tiny target and its DFlash drafter ...", err=True)
    try:
        dflash = ensure_upstream_drafter("dflash", seed=seed)
    except (OSError, ValueError) as exc:
        click.echo(f"kvtrace: cannot write the models: {exc}", err=True)
        raise SystemExit(2) from None
    click.echo(f"    {dflash.parent}", err=True)
    click.echo("2/3 capture: real llama.cpp and its DFlash graph, drafter left stale after a reset ...", err=True)
    config = EngineConfig(fault="stale-drafter", seed=seed, progress=want_progress(None), log_format=log_format)
    if devices:  # a command's own process names its devices RPC0, RPC1, ... in the order they are registered
        config = replace(config, devices=devices, n_gpu_layers=-1, split_mode="layer", tensor_split=(1.0,) * devices,
                         draft_device=f"RPC{devices - 1}")
    result = capture_engine(config, out, label="demo-stale-drafter")
    click.echo(
        f"    {result.session}: {result.n_decodes} decodes, {result.n_failures} refused by llama.cpp",
        err=True,
    )
    if result.layout:
        click.echo(f"    devices: {layout_text(result.layout)}", err=True)
    click.echo("3/3 triage:", err=True)
    try:
        from kvtrace import analyze
        from kvtrace.analyze.cli.read import format_verdict
        from kvtrace.analyze.reader.session import log_of
    except ImportError:  # the reader is not installed: the capture is still there to read later
        click.echo(f"    the log reader is not available; read the session later: kvtrace triage {result.session}")
        return
    try:
        parsed = analyze.parse(log_of(result.session))
    except analyze.InputError as exc:
        click.echo(f"kvtrace: {exc}", err=True)
        raise SystemExit(1) from None
    verdict = parsed.verdict
    verdict.source = str(result.session)
    click.echo(format_verdict(verdict))
    if no_dashboard or not _dashboard_ready():
        return
    from kvtrace.analyze.cli.dashboard import dashboard_missing, serve, start_dashboard

    missing = dashboard_missing()
    if missing is not None:
        click.echo(f"\nkvtrace: {missing}; then: kvtrace dashboard {result.session}", err=True)
        return

    dash = start_dashboard(result.session, port=port)
    click.echo(f"\nkvtrace dashboard: {dash.url}  (Ctrl-C to stop)")
    serve(dash)
