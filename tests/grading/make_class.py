"""Build tests/grading/class/: a class of submissions to grade end to end, from the shipped
notebooks 00, 02 and 03 (their exercises check in seconds) and the reference solutions'
source (ddp_lab/tools/solved.py), with the score each must get in expected.json.

    python tests/grading/make_class.py      # rewrites tests/grading/class/

The class: a right one, a wrong one (plausible mistakes), a partly right one, and each
hostile or broken case of issue 45. A hostile cell that must not succeed does its harm
unguarded at the top of the exercise cell: in the sandbox it raises, so the function below
it is never defined and the exercise scores 0 with what the cell raised.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import nbformat

from ddp_lab.tools.solved import cell_source, defined_name, exercise_cells, solution_source

ROOT = Path(__file__).resolve().parents[2]
CLASS = Path(__file__).resolve().parent / "class"
NB = {"00": "00_launching_from_jupyter", "02": "02_point_to_point", "03": "03_collectives"}
# Where the hostile submissions try to write, read and delete (test_grade.py checks them).
# (not /tmp: the sandbox gives each process a private one, where a write succeeds unseen)
OUTSIDE = CLASS / "escaped.txt"
CHECKER_FILE = ROOT / "ddp_lab/course/ch00_launching/exercises.py"
OTHER = CLASS / "right" / f"{NB['00']}.ipynb"
# The hostile cells find those paths from the package they import, when they run: the
# notebooks are built once and graded from any clone (CI's is not this one).
LOCATE = "import pathlib, ddp_lab\nREPO = pathlib.Path(ddp_lab.__file__).resolve().parents[1]\n"


def from_repo(path: Path) -> str:
    """``path`` as an expression a hostile cell evaluates after ``LOCATE``."""
    return f"REPO / {str(path.relative_to(ROOT))!r}"
DELETED = "DELETE"  # a cell source that deletes the exercise cell


def right(exercise: str, name: str) -> str:
    return solution_source(exercise, name)


WRONG = {
    "00.max_over_ranks": """\
        def max_over_ranks(value):
            t = torch.tensor([float(value)])
            dist.all_reduce(t)  # forgot op=dist.ReduceOp.MAX: a sum
            return t.item()
        """,
    "02.all_gather": """\
        def my_all_gather(tensor):
            return [tensor.clone() for _ in range(dist.get_world_size())]
        """,
    "02.shift": """\
        def my_shift(tensor, k):
            rank, n = dist.get_rank(), dist.get_world_size()
            if k % n == 0:
                return tensor.clone()
            out = torch.empty_like(tensor)
            # the directions swapped: this receives the tensor of rank + k
            for request in (dist.isend(tensor, (rank - k) % n), dist.irecv(out, (rank + k) % n)):
                request.wait()
            return out
        """,
    "03.all_to_all": """\
        def my_all_to_all(chunks):
            return [c.clone() for c in chunks]  # kept its own chunks: nothing exchanged
        """,
}

HOSTILE_00 = {
    "loop_forever": "while True:\n    pass\n\n",
    "hang_in_collective": "",
    "output_flood": "for _ in range(20000):\n    print('flood ' * 50)\n\n",
    "fork_bomb": textwrap.dedent("""\
        import os, time
        children = []
        for _ in range(2000):
            pid = os.fork()
            if pid == 0:
                time.sleep(120)
                os._exit(0)
            children.append(pid)

        """),
    "write_outside": f"{LOCATE}open({from_repo(OUTSIDE)}, 'w').write('escaped')\n\n",
    "read_other": f"{LOCATE}print(open({from_repo(OTHER)}).read()[:100])\n\n",
    "patch_check": textwrap.dedent("""\
        import ddp_lab.exercises as ex
        import torch.distributed
        ex.check = lambda name, fn: "passed"
        torch.distributed.all_reduce = lambda *args, **kwargs: None

        """),
    "delete_checkers": f"{LOCATE}import os\nos.remove({from_repo(CHECKER_FILE)})\n\n",
}

# The function under each hostile cell, and the exercise's expected status.
HOSTILE_FUNCTION = {
    "hang_in_collective": ("""\
        def max_over_ranks(value):
            t = torch.tensor([float(value)])
            if dist.get_world_size() > 1 and dist.get_rank() == 0:
                dist.recv(t, src=1)  # rank 1 never sends: rank 0 waits for ever
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.item()
        """, "failed"),
    "output_flood": ("""\
        def max_over_ranks(value):
            print('flood ' * 20000)
            t = torch.tensor([float(value)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return t.item()
        """, "passed"),
    "patch_check": (WRONG["00.max_over_ranks"], "failed"),
    "import_reference": ("""\
        from ddp_lab.course.ch00_launching.exercises import max_over_ranks as reference

        def max_over_ranks(value):
            return reference(value)
        """, "failed"),
}


def exercise_source(exercise: str, name: str, kind: str) -> str:
    if kind == "right":
        return right(exercise, name)
    if kind == "wrong":
        return "import torch\nimport torch.distributed as dist\n\n" + textwrap.dedent(
            WRONG[exercise])
    return kind  # a cell source, or DELETED


def build_notebook(stem: str, sources: dict[str, str]) -> nbformat.NotebookNode:
    """The shipped notebook ``stem`` with exercise cells replaced (or deleted)."""
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    for index, exercise in reversed(exercise_cells(nb)):
        if exercise in sources and sources[exercise] == DELETED:
            del nb.cells[index]
        elif exercise in sources:
            nb.cells[index].source = sources[exercise]
    return nb


def folder_submission(kinds: dict[str, str]) -> dict[str, nbformat.NotebookNode]:
    """{file name: notebook} for a submission: each exercise 'right', 'wrong' or 'stub'."""
    notebooks = {}
    for number, stem in NB.items():
        shipped = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
        sources = {}
        for index, exercise in exercise_cells(shipped):
            kind = kinds.get(exercise, "stub")
            if kind != "stub":
                name = defined_name(cell_source(shipped.cells[index]))
                sources[exercise] = exercise_source(exercise, name, kind)
        notebooks[f"{stem}.ipynb"] = build_notebook(stem, sources)
    return notebooks


def hostile_00(case: str) -> nbformat.NotebookNode:
    prefix = HOSTILE_00.get(case, "")
    function, _ = HOSTILE_FUNCTION.get(case, (None, None))
    body = textwrap.dedent(function) if function else right("00.max_over_ranks",
                                                            "max_over_ranks")
    source = prefix + "import torch\nimport torch.distributed as dist\n\n" + body
    return build_notebook(NB["00"], {"00.max_over_ranks": source})


ALL = ("00.max_over_ranks", "02.all_gather", "02.shift", "03.all_to_all")


def expected() -> dict[str, dict]:
    """Per submission: its score and each exercise's status."""
    def statuses(**given):
        return {e: given.get(e.replace(".", "_"), "not attempted") for e in ALL}
    out = {"right": statuses(**{e.replace(".", "_"): "passed" for e in ALL}),
           "wrong": statuses(**{e.replace(".", "_"): "failed" for e in ALL}),
           "partly": statuses(**{"00_max_over_ranks": "passed", "02_all_gather": "passed",
                                 "02_shift": "failed"})}
    for case in (*HOSTILE_00, "import_reference"):
        status = HOSTILE_FUNCTION.get(case, (None, "missing"))[1]
        out[case] = {"00.max_over_ranks": status}
    out["missing_exercise"] = {"02.all_gather": "missing", "02.shift": "missing"}
    out["does_not_parse"] = {}
    out["not_a_course_notebook"] = {}
    return {name: {"statuses": s, "score": sum(v == "passed" for v in s.values())}
            for name, s in out.items()}


def write_class(folder: Path = CLASS) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, kinds in {"right": dict.fromkeys(ALL, "right"),
                        "wrong": dict.fromkeys(ALL, "wrong"),
                        "partly": {"00.max_over_ranks": "right", "02.all_gather": "right",
                                   "02.shift": "wrong"}}.items():
        (folder / name).mkdir()
        for file, nb in folder_submission(kinds).items():
            nbformat.write(nb, folder / name / file)
    for case in (*HOSTILE_00, "import_reference"):
        nbformat.write(hostile_00(case), folder / f"{case}.ipynb")
    shipped_02 = nbformat.read(ROOT / "notebooks" / f"{NB['02']}.ipynb", as_version=4)
    renamed = build_notebook(NB["02"], {"02.all_gather": DELETED, "02.shift": right(
        "02.shift", "my_shift").replace("my_shift = shift", "shifted = shift")})
    assert len(exercise_cells(shipped_02)) == 2
    nbformat.write(renamed, folder / "missing_exercise.ipynb")
    (folder / "does_not_parse.ipynb").write_text('{"cells": [ this is not json')
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]),
                   folder / "not_a_course_notebook.ipynb")
    (folder / "expected.json").write_text(json.dumps(expected(), indent=1) + "\n")


if __name__ == "__main__":
    write_class()
    print(f"wrote {CLASS}")
