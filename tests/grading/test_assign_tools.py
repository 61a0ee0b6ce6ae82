"""The real grading tools on `ddp-lab assign`'s exports: nbgrader releases the stubs and
autogrades a right and a wrong submission (scores read from its gradebook), `otter assign`
accepts the master notebook and `otter run` gives a right submission full points, and the
Gradescope zip's run_autograder grades a right submission in a stand-in /autograder.

nbgrader and Otter come from pyproject's `grading` extra, in their own venv (`make graders`);
the notebooks run in a kernel of this venv's Python (a kernelspec in a JUPYTER_PATH of the
test's own), where ddp_lab and torch are; the graders' packages come after this venv's on its
sys.path, since Otter's grading imports otter in the kernel. Gradescope's setup.sh installs
are skipped: this venv stands for the image it builds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from ddp_lab.grading.export import export
from ddp_lab.tools.solved import cell_source, exercise_cells, solved_copy

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
GRADERS = Path(os.environ.get("DDP_LAB_GRADERS_VENV", ROOT / "build" / "venv-graders"))
ASSIGNMENT = "02_point_to_point"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

needs_graders = pytest.mark.skipif(
    not (GRADERS / "bin" / "nbgrader").exists() or not (GRADERS / "bin" / "otter").exists(),
    reason=f"nbgrader and otter-grader are not installed in {GRADERS}: run `make graders`")


@pytest.fixture
def tool_env(tmp_path) -> dict[str, str]:
    """The graders' venv first on PATH (nbgrader calls its own `alembic`), Jupyter's folders
    the test's own, and a `python3` kernelspec that runs this venv's Python."""
    kernel = tmp_path / "jupyter" / "kernels" / "python3"
    kernel.mkdir(parents=True)
    [graders_site] = GRADERS.glob("lib/python3*/site-packages")
    start = (f"import sys; sys.path.append({str(graders_site)!r}); "
             "from ipykernel import kernelapp; kernelapp.launch_new_instance()")
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", start, "-f", "{connection_file}"],
        "display_name": "ddp-lab", "language": "python"}))
    return dict(os.environ, PATH=f"{GRADERS / 'bin'}{os.pathsep}{os.environ['PATH']}",
                JUPYTER_PATH=str(tmp_path / "jupyter"),
                JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
                JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"))


def _run(argv, cwd: Path, env: dict, timeout: float = 480) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{argv[:2]}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def _solved(nb, wrong: str | None = None):
    """``nb`` with every exercise solved by its reference solution, but exercise ``wrong``
    answered with a plausible mistake (every rank keeps its own tensor)."""
    solved = solved_copy(nb)
    for index, name in exercise_cells(solved):
        if name == wrong:
            solved.cells[index].source = "def my_shift(tensor, k):\n    return tensor.clone()\n"
    return solved


GRADEBOOK_SCORES = """
import json, sys
from nbgrader.api import Gradebook
with Gradebook("sqlite:///gradebook.db") as gradebook:
    print(json.dumps({s.student_id: {g.cell.name: [g.score, g.max_score]
                                     for g in s.notebooks[0].grades}
                      for s in gradebook.assignment_submissions(sys.argv[1])}))
"""


@needs_graders
def test_nbgrader_releases_stubs_and_autogrades_right_and_wrong(tmp_path, tool_env):
    course = tmp_path / "course"
    export("nbgrader", NOTEBOOKS, course, f"{ASSIGNMENT}*")
    nbgrader = str(GRADERS / "bin" / "nbgrader")
    _run([nbgrader, "generate_assignment", ASSIGNMENT], course, tool_env)
    released = course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    text = released.read_text()
    assert "BEGIN SOLUTION" not in text and "ring_all_gather" not in text
    assert "require_pass" not in text  # the hidden checks stay with the instructor
    release = nbformat.read(released, as_version=4)
    shipped = nbformat.read(NOTEBOOKS / f"{ASSIGNMENT}.ipynb", as_version=4)
    for index, _ in exercise_cells(release):
        assert cell_source(release.cells[index]).startswith(
            cell_source(shipped.cells[index]).rstrip())  # the course's own stub
    for student, wrong in (("right", None), ("wrong", "02.shift")):
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        nbformat.write(_solved(release, wrong), folder / f"{ASSIGNMENT}.ipynb")
    _run([nbgrader, "autograde", ASSIGNMENT, "--create"], course, tool_env)
    scores = json.loads(_run([str(GRADERS / "bin" / "python"), "-c", GRADEBOOK_SCORES,
                              ASSIGNMENT], course, tool_env).strip().splitlines()[-1])
    assert scores == {
        "right": {"ex_02_all_gather-check": [1.0, 1.0], "ex_02_shift-check": [1.0, 1.0]},
        "wrong": {"ex_02_all_gather-check": [1.0, 1.0], "ex_02_shift-check": [0.0, 1.0]}}


@needs_graders
def test_otter_assign_accepts_the_master_and_otter_run_grades_a_right_one(tmp_path, tool_env):
    [master] = export("otter", NOTEBOOKS, tmp_path / "master", f"{ASSIGNMENT}*")
    _run([str(GRADERS / "bin" / "otter"), "assign", master.name, str(tmp_path / "dist")],
         master.parent, tool_env)
    student = (tmp_path / "dist" / "student" / master.name).read_text()
    assert "BEGIN SOLUTION" not in student and "ring_all_gather" not in student
    assert "def my_all_gather(tensor):" in student and "def my_shift(tensor, k):" in student
    [autograder] = (tmp_path / "dist" / "autograder").glob("*-autograder_*.zip")
    with zipfile.ZipFile(autograder) as zipped:
        names = set(zipped.namelist())
        tests = {n: zipped.read(n).decode() for n in names if n.startswith("tests/")}
    assert {"run_autograder", "setup.sh", "otter_config.json"} <= names
    assert sorted(tests) == ["tests/ex_02_all_gather.py", "tests/ex_02_shift.py"]
    assert "require_pass('02.shift', my_shift)" in tests["tests/ex_02_shift.py"]
    assert "'points': 1" in tests["tests/ex_02_shift.py"]
    release = nbformat.read(tmp_path / "dist" / "student" / master.name, as_version=4)
    nbformat.write(_solved(release), tmp_path / "right.ipynb")
    (tmp_path / "graded").mkdir()
    _run([str(GRADERS / "bin" / "otter"), "run", "-a", str(autograder), "-o",
          str(tmp_path / "graded"), str(tmp_path / "right.ipynb")], tmp_path, tool_env)
    results = json.loads((tmp_path / "graded" / "results.json").read_text())
    scores = {t["name"]: (t["score"], t["max_score"]) for t in results["tests"]
              if t["name"].startswith("ex_")}
    assert scores == {"ex_02_all_gather": (1.0, 1.0), "ex_02_shift": (1.0, 1.0)}, results


def _has_grade_command() -> bool:
    return importlib.util.find_spec("ddp_lab.tools.cli.grade_commands") is not None


@pytest.mark.skipif(not _has_grade_command(), reason="`ddp-lab grade` is not in this "
                    "checkout yet: run_autograder calls it")
@pytest.mark.parametrize("cores", [1, 2])
def test_gradescope_run_autograder_grades_a_right_submission(tmp_path, cores):
    """On 1 or 2 cores (taskset), as Gradescope's smaller machines give."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < cores:
        pytest.skip(f"this machine lets the test use {len(allowed)} core(s), not {cores}")
    [archive] = export("gradescope", NOTEBOOKS, tmp_path / "out")
    root = tmp_path / "autograder"
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(root / "source")
    for script in ("run_autograder", "setup.sh"):  # zipfile drops the mode bits it stored
        (root / "source" / script).chmod(0o755)
    shipped = nbformat.read(NOTEBOOKS / f"{ASSIGNMENT}.ipynb", as_version=4)
    (root / "submission").mkdir()
    nbformat.write(_solved(shipped), root / "submission" / f"{ASSIGNMENT}.ipynb")
    env = dict(os.environ, DDP_LAB_AUTOGRADER_ROOT=str(root),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    pinned = ["taskset", "-c", ",".join(map(str, allowed[:cores]))]
    _run([*pinned, str(root / "source" / "run_autograder")], root / "source", env, timeout=560)
    results = json.loads((root / "results" / "results.json").read_text())
    tests = {t["name"]: t for t in results["tests"]}
    for test in tests.values():
        assert {"name", "score", "max_score", "output", "visibility"} <= set(test)
    graded = {name: (t["score"], t["max_score"]) for name, t in tests.items()
              if t["name"].startswith("02.")}
    assert graded == {"02.all_gather": (1, 1), "02.shift": (1, 1)}, tests
    assert results["score"] == 2
