"""Every ``ddp-lab ... --help`` as a user types it (a real ``python -m ddp_lab`` process):
a description of the command, every option's default, one line per demo written for the
user, and nothing cut short with "..." or left in docstring markup. The commands are found
by walking the parser, so a command added later is held to the same rules."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from ddp_lab.tools.cli import build_parser
from ddp_lab.tools.cli.demo_lines import DEMO_LINES
from ddp_lab.tools.cli.formatting import HelpFormatter
from ddp_lab.tools.demos import DEMOS, HANGS_ON_PURPOSE

pytestmark = pytest.mark.timeout(120)

# argparse's own "..." in usage and metavars ("COMMAND ...", "[SIZES ...]") is not a cut
ARGPARSE_ELLIPSIS = re.compile(r"\b[A-Z_]+ \.\.\.\]?")


def commands(parser=None, path=()):
    """(words after ``ddp-lab``, parser, its one-line summary) for every command."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                yield path + (name,), child, summaries.get(name)
                yield from commands(child, path + (name,))


def help_of(words) -> str:
    done = subprocess.run([sys.executable, "-m", "ddp_lab", *words, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return done.stdout


def option_block(out: str, action: argparse.Action) -> str:
    """The lines argparse prints for one option: its flags, then its help, up to the next."""
    flags = ", ".join(action.option_strings)
    start = next(i for i, line in enumerate(out.splitlines())
                 if line.strip().startswith(action.option_strings[0]) and flags.split(",")[0]
                 in line)
    lines = out.splitlines()[start:]
    end = next((i for i, line in enumerate(lines[1:], 1)
                if re.match(r"^  \S", line) or not line.strip()), len(lines))
    return " ".join(" ".join(lines[:end]).split())


ALL = list(commands())


def test_every_command_is_found():
    names = {" ".join(words) for words, _, _ in ALL}
    assert {"doctor", "run", "notebooks", "progress", "bench", "bench launch",
            "bench ddp-network"} <= names, names


@pytest.mark.parametrize("words,parser,summary", [
    pytest.param(words, parser, summary, id=" ".join(words) or "ddp-lab")
    for words, parser, summary in [((), build_parser(), "")] + ALL])
def test_help_describes_the_command_and_shows_each_default(words, parser, summary):
    out = help_of(words)
    flat = " ".join(out.split())
    assert parser.description and " ".join(parser.description.split()) in flat, out
    assert words == () or summary, f"ddp-lab {' '.join(words[:-1])} --help lists no summary"
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        block = option_block(out, action)
        assert "default" in block, f"{' '.join(words)}: {block!r} does not say its default"
    text = ARGPARSE_ELLIPSIS.sub("", out)
    assert "..." not in text and "``" not in text, out


def test_run_help_gives_every_demo_one_line_written_for_it():
    assert set(DEMO_LINES) == set(DEMOS)  # a demo without a line, or a line without a demo
    out = help_of(("run",))
    listed, note = out.split("\ndemos:\n", 1)[1].rstrip("\n").split("\n\n")
    demos = listed.splitlines()
    assert [line.split()[0] for line in demos] == sorted(DEMOS)
    for line in demos:
        name = line.split()[0]
        assert re.fullmatch(rf"  {name} +{re.escape(DEMO_LINES[name])}( \*)?", line), line
        assert line.endswith(" *") == (name in HANGS_ON_PURPOSE), line
        assert len(line) <= 100, f"{line!r} wraps in a 100-column terminal"
    assert note == ("  * hangs on purpose: stopped after 5 s (--timeout changes it), with "
                    "every rank's stack"), note
    assert re.search(r"^  all_reduce +every rank adds its rank number", out, re.M)
    assert re.search(r"--timeout TIMEOUT +seconds before the ranks are stopped \(default: 60; "
                     r"5 for the demos that hang on purpose\)", " ".join(out.split()))


def test_help_never_imports_torch():
    """Help is instant: building every parser and printing a page imports no torch."""
    code = ("import sys\nfrom ddp_lab.tools.cli import main\n"
            "for words in (['run'], ['bench', 'buckets'], ['notebooks']):\n"
            "    try:\n        main(words + ['--help'])\n    except SystemExit:\n        pass\n"
            "print('torch imported:', 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip().endswith("torch imported: False"), done.stdout + done.stderr


def test_formatter_shows_defaults_as_typed():
    parser = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4], help="sizes")
    parser.add_argument("--warmup", type=int, default=2)  # no help: the default still shows
    parser.add_argument("--flag", action="store_true", help="a switch")
    parser.add_argument("--out", default=None, help="a file (default: none, no figure)")
    out = " ".join(parser.format_help().split())
    assert "sizes (default: 2 4)" in out and "--warmup WARMUP (default: 2)" in out
    assert "a switch" in out and "(default: False)" not in out
    assert "(default: none, no figure)" in out and "(default: None)" not in out
