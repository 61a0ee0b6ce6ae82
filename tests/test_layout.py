"""The architecture, as rules a change cannot break quietly: the package's rooms, which room
may import which, module size, no import cycles, and no citation of notes readers lack."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ddp_lab"
MAX_LINES = 300
# Who may import whom: the launcher stands alone; the from-scratch implementations need only
# torch (a reader follows each one without the rest of the package); the course uses the
# launcher, the scratch code and the exercises, and runs the worker scripts (which train with
# the course's code); the exercises check the learner against the course's runs and the
# scratch references; grading (instructor mode) runs the exercises' checkers on submissions;
# tools may use all. Only grading imports tools (it runs notebooks as the runner does).
ALLOWED = {
    "launch": {"launch"},
    "scratch": {"scratch"},
    "course": {"launch", "course", "scripts", "scratch", "exercises"},
    "exercises": {"launch", "course", "scratch", "exercises"},
    "scripts": {"launch", "course", "scripts"},
    "grading": {"launch", "course", "exercises", "tools", "grading"},
    "tools": {"launch", "course", "scripts", "scratch", "exercises", "tools", "grading"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, top_level_only: bool = False) -> set[str]:
    """Every ``ddp_lab`` module a file imports (``from ddp_lab.x import y`` counts ``y`` when
    ``ddp_lab.x.y`` is a module), at module level only if asked."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ddp_lab")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddp_lab"):
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules()
                      else node.module for a in node.names}
    return found


def room(module: str) -> str | None:
    """The room of a module (launch, scratch, course, ...); None for the package's own
    __init__/__main__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def chapter(module: str) -> str | None:
    parts = module.split(".")
    is_chapter = len(parts) > 2 and parts[1] == "course" and re.fullmatch(r"ch\d\d_\w+", parts[2])
    return parts[2] if is_chapter else None


def test_top_level_holds_only_the_rooms():
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py", "__main__.py", *ALLOWED}, entries


def test_every_chapter_folder_is_named_after_its_notebook():
    notebooks = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    chapters = {p.name[2:4] for p in (PACKAGE / "course").glob("ch[0-9][0-9]_*")}
    assert chapters == notebooks
    for folder in (PACKAGE / "course").glob("ch[0-9][0-9]_*"):
        assert (folder / "__init__.py").exists(), folder


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_imports_only_what_its_room_allows(name):
    own_room, own_chapter = room(name), chapter(name)
    for imported in imports_of(modules()[name]):
        if own_room is None or room(imported) is None:
            continue
        assert room(imported) in ALLOWED[own_room], f"{name} imports {imported}"
        if own_chapter and chapter(imported):
            assert chapter(imported) == own_chapter, f"chapter {name} imports {imported}"


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_small(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name}: {lines} lines; split it by concept"


LAUNCH = PACKAGE / "launch"
MAX_LAUNCH_TOP = 12  # the entry points and what they share; everything else is in a room
LAUNCH_ROOMS = {"forkserver", "rank", "output", "verdict", "network", "torchrun", "live",
                "remote"}
# What runs inside a rank stays light and readable on its own: of the launcher, only what the
# kernel and the ranks share (config) and the errors.
RANK_MAY_IMPORT = {"ddp_lab.launch.config", "ddp_lab.launch.errors"}
# Module names the launcher holds more than once, each for the same part in its own folder.
SAME_PART = {
    "session": {"ddp_lab.launch.session", "ddp_lab.launch.live.session",
                "ddp_lab.launch.torchrun.session",
                "ddp_lab.launch.remote.session"},  # one run: fork server, live, torchrun, hosts
    "agent": {"ddp_lab.launch.torchrun.agent",
              "ddp_lab.launch.remote.agent"},  # a host's: torchrun's elastic agent, ddp_lab's
    "outcome": {"ddp_lab.launch.verdict.outcome",
                "ddp_lab.launch.live.outcome"},  # a run's, a live call's
}


def launch_modules() -> dict[str, Path]:
    return {name: path for name, path in modules().items()
            if name.startswith("ddp_lab.launch.") and path.name != "__init__.py"}


def test_launch_top_level_holds_the_entry_points_and_rooms():
    top = sorted(p.name for p in LAUNCH.glob("*.py"))
    assert len(top) <= MAX_LAUNCH_TOP, top
    folders = {p.name for p in LAUNCH.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == LAUNCH_ROOMS
    for folder in folders:
        assert (LAUNCH / folder / "__init__.py").exists(), folder


@pytest.mark.parametrize("name", sorted(n for n in launch_modules()
                                        if n.startswith("ddp_lab.launch.rank.")))
def test_rank_room_imports_only_config_and_errors(name):
    for imported in imports_of(modules()[name]):
        if imported.startswith("ddp_lab.launch.rank.") or imported == "ddp_lab.launch.rank":
            continue
        assert imported in RANK_MAY_IMPORT, f"{name} imports {imported}"


def test_launch_module_names_are_unique_but_for_the_same_part():
    by_name: dict[str, set[str]] = {}
    for name in launch_modules():
        by_name.setdefault(name.rsplit(".", 1)[-1], set()).add(name)
    shared = {short: names for short, names in by_name.items() if len(names) > 1}
    assert shared == SAME_PART


def test_launch_reading_order_names_every_room():
    order = (LAUNCH / "__init__.py").read_text()
    for folder in LAUNCH_ROOMS:
        assert f"{folder}/" in order, folder
    for path in LAUNCH.glob("*.py"):
        if path.name != "__init__.py":
            assert f"``{path.stem}``" in order, path.stem


# Imports inside functions count: a lazy import only defers the other module, so A -> B
# -> A through one still ties the two together (neither is read, tested or moved without the
# other, and which half-built module the other sees depends on who was imported first). A
# lazy import with no way back (e.g. one that keeps what a rank imports light) is no cycle.


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, function-level imports included."""
    return {name: {i for i in imports_of(path) if i in modules()}
            for name, path in modules().items()}


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_imports_inside_functions_count(tmp_path):
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from ddp_lab.launch import magic\n")
    assert imports_of(lazy) == {"ddp_lab.launch.magic"}
    assert imports_of(lazy, top_level_only=True) == set()


def test_the_magics_share_their_options_without_importing_each_other():
    """%%ddp registers the live magics (``%load_ext`` loads all three); the options both
    parse live in one module that imports neither."""
    graph = import_graph()
    options = "ddp_lab.launch.live.magic_options"
    assert "ddp_lab.launch.magic" not in graph["ddp_lab.launch.live.magics"]
    assert options in graph["ddp_lab.launch.magic"] & graph["ddp_lab.launch.live.magics"]
    assert not {i for i in graph[options] if "magic" in i}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that returns to its start, or None (depth-first)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


CITATION = re.compile(r"\bseeds? 0\d\d|\bseed's\b|\bthe seeds?\b(?! (of|for|that|value))", re.I)


def texts():
    for path in sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py")):
        if path != Path(__file__):
            yield path, path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(cell["source"]) for cell in cells)
    yield ROOT / "README.md", (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "docs").rglob("*.md")):
        yield path, path.read_text()


@pytest.mark.parametrize("path,text", list(texts()), ids=lambda v: getattr(v, "name", ""))
def test_no_citation_of_the_source_notes(path, text):
    """Readers have no copy of the notes the course was written from: describe the situation
    and link upstream instead of "seed 001"."""
    hits = [m.group(0) for m in CITATION.finditer(text)]
    assert not hits, f"{path.name}: {hits}"
