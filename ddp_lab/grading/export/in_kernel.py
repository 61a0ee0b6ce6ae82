"""The hidden check of an nbgrader or Otter export, run in the submission's kernel by the
tool: the course's checker, strict.

``ex.check`` says "not solved yet" on a stub and returns, so that a shipped notebook runs
top to bottom; a grade must count that as a fail. Silent on a pass: Otter's tests compare
what a test cell prints with what it printed in the master notebook (nothing).
These tools grade inside the submission's kernel, where the learner's code ran first and
could have patched anything; ``ddp-lab grade`` (and the Gradescope export, which calls it)
checks outside it.
"""

from __future__ import annotations

import contextlib
import io


def require_pass(name: str, fn) -> None:
    """Run exercise ``name``'s checker on ``fn``; raise AssertionError unless it passes."""
    import ddp_lab.exercises as ex
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report = ex.check(name, fn)
    if not report.startswith(f"{name}: passed"):
        raise AssertionError(f"{name} not graded as solved: {report}")
