"""A Gradescope autograder: ``OUT/autograder.zip`` with, at its root, ``setup.sh`` (installs
torch's CPU build and this ddp-lab, from the wheel packed in the zip), ``run_autograder``
(``ddp-lab grade`` on the submission, Gradescope's results.json out) and the course's
shipped notebooks (``ddp-lab grade --course``: an installed wheel has no notebooks/).

Gradescope's contract (https://gradescope-autograders.readthedocs.io/en/latest/specs/): the
zip is unpacked in /autograder/source, setup.sh runs once as root when the image is built,
run_autograder runs per submission with the learner's files in /autograder/submission and
must leave /autograder/results/results.json. ``DDP_LAB_AUTOGRADER_ROOT`` stands for
/autograder (tests unpack the zip into a folder of their own).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ddp_lab.tools.notebook_runner import find_notebooks

ROOT_VARIABLE = "DDP_LAB_AUTOGRADER_ROOT"
WHEELS = "wheels"
NOTEBOOKS = "notebooks"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP = f"""\
#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install --extra-index-url {CPU_INDEX} "torch=={{torch}}"
python3 -m pip install {WHEELS}/*.whl
ddp-lab doctor || true  # the image's build log then says what this machine gives the ranks
"""

RUN_AUTOGRADER = f"""\
#!/usr/bin/env bash
# Gradescope runs this for each submission: the learner's notebooks are in
# $ROOT/submission; the grade goes to $ROOT/results/results.json. ddp-lab grade runs the
# notebooks in a sandbox and checks each exercise on real ranks, within the cores there are.
set -euo pipefail
ROOT="${{{ROOT_VARIABLE}:-/autograder}}"
mkdir -p "$ROOT/results"
exec ddp-lab grade "$ROOT/submission" --course "$ROOT/source/{NOTEBOOKS}" \\
    --out "$ROOT/results/ddp-lab" --results-json "$ROOT/results/results.json"
"""


def write(out: Path, notebook_dir: Path, project: Path | None = None) -> Path:
    """Build ``out/autograder.zip`` from the course notebooks in ``notebook_dir`` and the
    project checkout ``project`` (default: the one this ddp_lab is imported from)."""
    project = project or checkout()
    notebooks = find_notebooks(notebook_dir)
    if not notebooks:
        raise ValueError(f"no notebooks in {notebook_dir}/: pass --dir, the course's notebooks/")
    out.mkdir(parents=True, exist_ok=True)
    target = out / "autograder.zip"
    with tempfile.TemporaryDirectory(prefix="ddp-lab-assign-") as scratch:
        wheel = build_wheel(project, Path(scratch))
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
            _add_script(archive, "setup.sh", SETUP.format(torch=torch_version()))
            _add_script(archive, "run_autograder", RUN_AUTOGRADER)
            archive.write(wheel, f"{WHEELS}/{wheel.name}")
            for notebook in notebooks:
                archive.write(notebook, f"{NOTEBOOKS}/{notebook.name}")
    return target


def checkout() -> Path:
    """The source checkout of this ddp_lab: the wheel is built from it."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file():
        raise ValueError(f"ddp_lab is imported from {root}, not a source checkout (no "
                         "pyproject.toml): run `ddp-lab assign` from a clone of the course")
    return root


def build_wheel(project: Path, scratch: Path) -> Path:
    """The project's wheel, built from a copy (setuptools writes build/ and egg-info beside
    the sources: not in the checkout) without network (no build isolation)."""
    source = scratch / "source"
    shutil.copytree(project / "ddp_lab", source / "ddp_lab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(project / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
               "--no-build-isolation", "-w", str(scratch / "dist"), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building ddp-lab's wheel failed:\n{done.stderr[-2000:]}")
    return next((scratch / "dist").glob("ddp_lab-*.whl"))


def torch_version() -> str:
    """This machine's torch, less its local tag (2.13.0+cpu -> 2.13.0): the autograder
    grades with the torch the course was checked on."""
    import torch
    return torch.__version__.split("+")[0]


def _add_script(archive: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o100755 << 16  # a regular file, executable: Gradescope runs it
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, text)
