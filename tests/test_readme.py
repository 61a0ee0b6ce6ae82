"""The README's and docs/'s Python blocks run as pasted, in order, one shell per page, in
IPython (magics included), and give the values their comments promise. A block that cannot
run as it stands (a placeholder function, a machine requirement) says so right above its
fence: ``<!-- not run: why -->``; a test keeps that list short. The pages' links lead to
pages and headings that exist, and the README keeps the test command CI runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```python\n(?P<code>.*?)```", re.S)

# Runs each block with IPython's run_cell (as a notebook cell would) and reports, after each,
# the names the pages' comments talk about.
DRIVER = r"""
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
seen = []
for i, code in enumerate(json.load(sys.stdin)):
    if not shell.run_cell(code).success:
        sys.exit(f"python block {i + 1} failed:\n{code}")
    ns = shell.user_ns
    seen.append({"res": getattr(ns.get("res"), "values", None), "total": ns.get("total")})
print("SEEN " + json.dumps(seen, default=repr))
"""


def blocks(page: Path = README) -> list[tuple[str, str | None]]:
    return [(m["code"], m["why"]) for m in BLOCK.finditer(page.read_text())]


def run_blocks(page: Path, cwd: Path) -> tuple[list[dict], str]:
    """Every runnable block of ``page`` in one fresh shell: what each left, and the output."""
    code = [c for c, why in blocks(page) if why is None]
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(code), cwd=cwd,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.split("SEEN ", 1)[1]), done.stdout


def test_only_a_few_blocks_are_marked_not_run():
    for page in PAGES:
        skipped = [why for _, why in blocks(page) if why is not None]
        assert len(skipped) <= 2, (page.name, skipped)
    assert len([why for _, why in blocks() if why is None]) >= 8


@pytest.mark.timeout(600)
def test_readme_python_blocks_run_as_pasted(tmp_path):
    seen, out = run_blocks(README, tmp_path)
    results = [s["res"] for s in seen]
    assert [10.0] * 4 in results                        # the launcher API's first block
    assert [1.0, 1.0] in results                        # train.py through run_script
    assert [12.0] * 4 in [s["total"] for s in seen]     # %%ddp --push scale
    assert "not solved yet" in out  # the exercises block (the reference itself is refused)
    # the verdict of a collective timeout: the late rank, and the ranks that waited for it
    assert "rank 2 never joined the all_reduce that ranks 0, 1 waited in; they timed out " \
           "(victims). It was still in its own code when they gave up (straggler," in out
    assert "line 7: time.sleep(4)): rank 2 is the root cause." in out
    assert "Victims (they timed out waiting for rank 2):\n  rank 0: " in out
    assert "cause: 2 victims: [0, 1]" in out


@pytest.mark.timeout(300)
def test_porting_guide_blocks_run_as_pasted(tmp_path):
    _, out = run_blocks(ROOT / "docs" / "porting.md", tmp_path)
    assert "[rank 1] Rank  1  has data  tensor(2.)" in out   # dist_tuto through spawn


def test_every_python_block_of_docs_is_run_by_a_test():
    """A page with runnable blocks has a test above; a new one needs its own."""
    tested = {"README.md", "porting.md"}
    runnable = {page.name for page in PAGES if any(why is None for _, why in blocks(page))}
    assert runnable <= tested, runnable - tested


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # '#' comments in code
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_lead_to_pages_and_headings_that_exist(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} leads nowhere"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name}: no heading #{anchor} in {path}"


def test_readme_keeps_the_command_ci_runs():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    command = ci[-1]
    assert command == "make test", ci
    assert re.search(rf"```bash\n{re.escape(command)}\n```", README.read_text())


def test_the_readme_stays_a_guide_and_the_details_live_in_docs():
    """The learner's guide first and short; what it moved out is linked from it."""
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    for page in ("launcher.md", "porting.md", "troubleshooting.md", "security.md",
                 "contributing.md"):
        assert f"(docs/{page}" in text, page
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[:3] == ["Set up", "The course", "The launcher in a page"], headings
    assert headings[-1] == "Contributing", headings
