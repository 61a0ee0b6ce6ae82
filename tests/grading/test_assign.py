"""`ddp-lab assign`'s exports, read back without the tools (tests/grading/test_assign_tools.py
runs nbgrader, Otter and the Gradescope script on them): every exercise of the registry once,
its points from the registry, the reference solution only between the tool's markers, after
the course's own stub, and the strict hidden check failing a stub and a wrong answer."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

import ddp_lab.exercises as ex
from ddp_lab.exercises.registry import all_exercises
from ddp_lab.grading.export import export
from ddp_lab.grading.export.in_kernel import require_pass
from ddp_lab.tools.solved import cell_source

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"

pytestmark = pytest.mark.timeout(180)


def _nbgrader_meta(nb) -> list[dict]:
    return [cell.metadata.get("nbgrader") for cell in nb.cells]


@pytest.fixture(scope="module")
def nbgrader_course(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nbgrader")
    export("nbgrader", NOTEBOOKS, out)
    return out


def test_nbgrader_layout_has_every_exercise_once_with_the_registry_s_points(nbgrader_course):
    assert (nbgrader_course / "nbgrader_config.py").is_file()
    tests = {}
    for path in sorted((nbgrader_course / "source").glob("*/*.ipynb")):
        assert path.parent.name == path.stem  # one assignment per course notebook
        for meta in _nbgrader_meta(nbformat.read(path, as_version=4)):
            if meta["grade"]:
                tests[meta["grade_id"]] = meta["points"]
    expected = {"ex_" + name.replace(".", "_") + "-check": exercise.points
                for name, exercise in all_exercises().items()}
    assert tests == expected


def test_nbgrader_cells_solution_after_the_stub_hidden_check_the_rest_locked(nbgrader_course):
    nb = nbformat.read(nbgrader_course / "source/02_point_to_point/02_point_to_point.ipynb",
                       as_version=4)
    shipped = nbformat.read(NOTEBOOKS / "02_point_to_point.ipynb", as_version=4)
    metas = _nbgrader_meta(nb)
    assert all(m and m["schema_version"] == 3 for m in metas)
    assert len({m["grade_id"] for m in metas}) == len(metas)
    solutions = [i for i, m in enumerate(metas) if m["solution"]]
    assert [nb.cells[i].metadata["exercise"] for i in solutions] == ["02.all_gather",
                                                                      "02.shift"]
    for i in solutions:
        source = cell_source(nb.cells[i])
        stub, solution = source.split("### BEGIN SOLUTION\n")
        assert stub.rstrip() == cell_source(shipped.cells[i]).rstrip()  # the learner's cell
        assert solution.rstrip().endswith("### END SOLUTION")
        reference = ex.solution(nb.cells[i].metadata["exercise"]).__name__
        assert f"def {reference}(" in solution and f"def {reference}(" not in stub
        test = cell_source(nb.cells[i + 1])
        assert cell_source(shipped.cells[i + 1]).rstrip() in test
        assert "### BEGIN HIDDEN TESTS\nfrom ddp_lab.grading.export.in_kernel" in test
        assert metas[i + 1]["grade"] and metas[i + 1]["locked"]
    rest = [m for i, m in enumerate(metas) if i not in solutions and not m["grade"]]
    assert rest and all(m["locked"] and not m["solution"] for m in rest)


def test_otter_master_questions_with_points_solution_blocks_and_tests(tmp_path):
    [master] = export("otter", NOTEBOOKS, tmp_path, "02*")
    assert master == tmp_path / "02_point_to_point" / "02_point_to_point.ipynb"
    assert "ddp-lab" in (master.parent / "requirements.txt").read_text().split()
    nb = nbformat.read(master, as_version=4)
    raws = [cell_source(c) for c in nb.cells if c.cell_type == "raw"]
    assert raws[0].startswith("# ASSIGNMENT CONFIG\nname: 02_point_to_point\n")
    questions = [r for r in raws if r.startswith("# BEGIN QUESTION")]
    assert questions == [f"# BEGIN QUESTION\nname: ex_{n}\npoints: 1\ncheck_cell: false"
                         for n in ("02_all_gather", "02_shift")]
    blocks = [r for r in raws if r.startswith(("# BEGIN", "# END")) and "QUESTION" not in r]
    assert blocks == ["# BEGIN SOLUTION", "# END SOLUTION", "# BEGIN TESTS", "# END TESTS"] * 2
    tests = [cell_source(c) for c in nb.cells if "require_pass(" in cell_source(c)]
    assert len(tests) == 2 and all("hidden: false" in t for t in tests)


def test_gradescope_zip_has_executable_scripts_and_the_course_wheel(tmp_path):
    in_tree = [ROOT / "build" / "lib", *ROOT.glob("ddp_lab.egg-info/SOURCES.txt")]
    before = {path: path.exists() and path.stat().st_mtime for path in in_tree}
    [archive] = export("gradescope", NOTEBOOKS, tmp_path)
    with zipfile.ZipFile(archive) as zipped:
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zipped.infolist()}
        run = zipped.read("run_autograder").decode()
        setup = zipped.read("setup.sh").decode()
        [wheel] = [n for n in modes if n.startswith("wheels/")]
        shipped = {n for n in modes if n.startswith("notebooks/")}
        zipped.extract(wheel, tmp_path)
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert 'ROOT="${DDP_LAB_AUTOGRADER_ROOT:-/autograder}"' in run
    assert '--results-json "$ROOT/results/results.json"' in run
    assert "torch==2" in setup and "wheels/*.whl" in setup
    assert shipped == {f"notebooks/{p.name}" for p in NOTEBOOKS.glob("*.ipynb")}
    assert '--course "$ROOT/source/notebooks"' in run
    with zipfile.ZipFile(tmp_path / wheel) as built:
        names = set(built.namelist())
    assert {"ddp_lab/exercises/registry.py", "ddp_lab/grading/export/in_kernel.py",
            "ddp_lab/course/ch02_point_to_point/exercises.py"} <= names
    after = {path: path.exists() and path.stat().st_mtime for path in in_tree}
    assert after == before  # built from a copy: nothing written in the checkout


@pytest.mark.slow  # real processes: over 5 s on 2 busy cores
def test_cli_writes_the_export_and_refuses_a_pattern_that_finds_nothing(tmp_path):
    def assign(*args):
        return subprocess.run([sys.executable, "-m", "ddp_lab", "assign", *args],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
    done = assign("--format", "otter", "--out", str(tmp_path), "--pattern", "00_*")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "00_launching_from_jupyter" /
                                       "00_launching_from_jupyter.ipynb")]
    done = assign("--format", "nbgrader", "--out", str(tmp_path), "--pattern", "99*")
    assert done.returncode == 2
    assert "no course notebook with exercises matches '99*'" in done.stderr


def _stub(value):
    """Return the maximum of value over the ranks."""
    raise NotImplementedError


def _local_max(value):
    return value


@pytest.mark.slow  # real processes: over 5 s on 2 busy cores
def test_hidden_check_fails_a_stub_and_a_wrong_answer_and_is_silent_on_a_right_one(capsys):
    with pytest.raises(AssertionError, match="not graded as solved: 00.max_over_ranks: not "
                                             "solved yet"):
        require_pass("00.max_over_ranks", _stub)
    with pytest.raises(ex.ExerciseFailed):
        require_pass("00.max_over_ranks", _local_max)
    capsys.readouterr()
    namespace = {}
    exec(compile(_solved_source(), "<cell>", "exec"), namespace)  # a solved cell
    assert require_pass("00.max_over_ranks", namespace["max_over_ranks"]) is None
    assert capsys.readouterr().out == ""  # Otter compares a test's output with none


def _solved_source() -> str:
    from ddp_lab.tools.solved import solution_source
    return solution_source("00.max_over_ranks", "max_over_ranks")
