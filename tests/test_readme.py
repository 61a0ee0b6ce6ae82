"""The README's Python blocks run as pasted, in order, in one IPython shell (magics included),
and give the values their comments promise. A block that cannot run as it stands (a
placeholder function, a machine requirement) says so right above its fence:
``<!-- not run: why -->``; a test keeps that list short."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```python\n(?P<code>.*?)```", re.S)

# Runs each block with IPython's run_cell (as a notebook cell would) and reports, after each,
# the names the README's comments talk about.
DRIVER = r"""
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
seen = []
for i, code in enumerate(json.load(sys.stdin)):
    if not shell.run_cell(code).success:
        sys.exit(f"README python block {i + 1} failed:\n{code}")
    ns = shell.user_ns
    seen.append({"res": getattr(ns.get("res"), "values", None), "total": ns.get("total")})
print("SEEN " + json.dumps(seen, default=repr))
"""


def blocks() -> list[tuple[str, str | None]]:
    return [(m["code"], m["why"]) for m in BLOCK.finditer(README.read_text())]


def test_only_a_few_blocks_are_marked_not_run():
    skipped = [why for _, why in blocks() if why is not None]
    assert len(skipped) <= 2, skipped
    assert len(blocks()) - len(skipped) >= 6


@pytest.mark.timeout(600)
def test_readme_python_blocks_run_as_pasted(tmp_path):
    code = [c for c, why in blocks() if why is None]
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(code), cwd=tmp_path,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = json.loads(done.stdout.split("SEEN ", 1)[1])
    results = [s["res"] for s in seen]
    assert [10.0] * 4 in results                        # the launcher API's first block
    assert [1.0, 1.0] in results                        # train.py through run_script
    assert [12.0] * 4 in [s["total"] for s in seen]     # %%ddp --push scale
    out = done.stdout
    assert "[rank 1] Rank  1  has data  tensor(2.)" in out   # dist_tuto through spawn
    assert "not solved yet" in out and "02.all_gather: passed" in out
