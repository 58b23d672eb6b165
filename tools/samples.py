"""Regenerate samples/: small engine sessions (healthy, stale-drafter, no-rollback) for docs and tests, each
a real DFlash drafter (llama.cpp's own graph) beside the tiny target, and the README's picture of the
stale-drafter sample's positions (drawn by the system's Chromium, as `kvtrace report --png` does).

Run `python -m tools.samples` (or `make samples`). The models are generated into a temporary folder
and loaded by relative name, so no path of the machine that made the samples ends up inside them
(llama.cpp prints the model path it was given). The decodes, positions, errors and ground truth are
the same on every run; timestamps, timings and the pointers in batch dumps are whatever llama.cpp
printed that time.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kvtrace import analyze
from kvtrace.analyze.reader.session import GROUND_TRUTH, KEY_HOST, MANIFEST, RAW_LOG, Session
from kvtrace.analyze.views.figures import picture_figure
from kvtrace.analyze.views.picture import write_pictures
from kvtrace.capture.engine import EngineConfig, run_engine
from kvtrace.capture.models import ModelPair, ModelParams, _write_upstream_drafter, generate_pair

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "samples"
SEED = 0
# the README's picture: `kvtrace report samples/stale-drafter --png` of the failing sample
PICTURED = "stale-drafter"
PICTURE = "positions.png"


@dataclass(slots=True, frozen=True)
class Sample:
    name: str
    config: EngineConfig
    about: str


def samples() -> list[Sample]:
    # Small on purpose (a few hundred KB in all); n_threads=1 keeps the arithmetic, hence every
    # greedy choice, identical from run to run.
    common: dict[str, Any] = {"seed": SEED, "requests": 3, "cycles": 4, "draft": 3, "n_threads": 1,
                              "prompt_words": (6, 14)}
    return [
        Sample("healthy", EngineConfig(fault="none", **common), "correct drafter bookkeeping, new log scheme"),
        Sample(
            "stale-drafter",
            EngineConfig(fault="stale-drafter", **common),
            "drafter left behind at the first reset: X stuck, Y climbing (the seed report)",
        ),
        Sample(
            "no-rollback",
            EngineConfig(fault="no-rollback", log_prefix=False, flavor="fork-v0.2", **common),
            "rejected drafts left in the drafter's cache (X >= Y), old log scheme without prefixes",
        ),
    ]


def _scrub_manifest(session: Session) -> None:
    """Keep what describes the run; drop what only names the machine that made it."""
    data = session.read_manifest()
    host = data.get(KEY_HOST) or {}
    host.pop("hostname", None)
    data[KEY_HOST] = host
    session.manifest_path.unlink()
    session.write_manifest(data)


def write_samples(out_dir: Path = DEFAULT_DIR) -> list[Path]:
    out_dir = Path(out_dir).resolve()
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="kvtrace-samples-") as tmp:
        generate_pair(Path(tmp), SEED)
        _write_upstream_drafter(Path(tmp) / "dflash.gguf", "dflash", ModelParams(), SEED)
        # Relative names: the loader line in raw.log then reads "... from target.gguf".
        models = ModelPair(Path("target.gguf"), Path("dflash.gguf"), generated=True, seed=SEED)
        with contextlib.chdir(tmp):
            for sample in samples():
                folder = out_dir / sample.name
                if folder.exists():
                    shutil.rmtree(folder)
                folder.mkdir(parents=True)
                session = Session(folder)
                result = run_engine(sample.config, session, models)
                session.write_manifest({"sample": {"name": sample.name, "about": sample.about}})
                _scrub_manifest(session)
                written.append(folder)
                size = sum((folder / f).stat().st_size for f in (RAW_LOG, MANIFEST, GROUND_TRUTH))
                click.echo(
                    f"{sample.name:14} {result.n_decodes:4d} decodes, {result.n_failures:3d} failures, "
                    f"{size / 1024:6.1f} KiB",
                    err=True,
                )
    picture = write_picture(out_dir / PICTURED)
    click.echo(f"{PICTURED:14} {picture.name}, {picture.stat().st_size / 1024:6.1f} KiB", err=True)
    return written


def write_picture(folder: Path) -> Path:
    """The position chart of one sample as the PNG `kvtrace report --png` writes, titled by the sample's name."""
    out = folder / PICTURE
    write_pictures(picture_figure(analyze.parse(folder), title=folder.name), [(out, "png")])
    return out


@click.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default="samples/ beside capture/",
    help="Folder to write the sample sessions into.",
)
def main(out: Path) -> None:
    """Regenerate the sample sessions (healthy, stale-drafter, no-rollback)."""
    write_samples(out)


if __name__ == "__main__":
    sys.exit(main())
