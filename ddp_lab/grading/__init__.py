"""Instructor mode: grading a class's notebooks with the course's own checkers.

Reading order: ``grade`` (the orchestrator: one submission after another, in parallel
within the machine's cores) -> ``submission`` (which notebooks, which exercises, which cells
run) -> ``harvest`` (in a sandboxed kernel: the cells run, each exercise's function written
as a payload) -> ``checking`` (a second sandboxed process: each payload checked on real
ranks, sealed, with a grading seed) -> ``results`` and ``class_report`` (results.json,
report.md, grades.csv, summary.html). ``sandbox`` runs each of the two processes isolated;
``assign*`` exports the course to nbgrader, Otter and Gradescope.
"""
