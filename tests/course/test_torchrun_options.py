"""Notebook 09, section 1: the table of torchrun's options is read from this torch's own
parser, not written by hand (an earlier hand-written "new since torch 2.4" list was wrong,
docs/reviews/09.md IP-09-1). No processes."""

from __future__ import annotations

import json
from pathlib import Path

from ddp_lab.course.ch09_torchrun import torchrun as torchrun_demo

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "09_torchrun_and_multinode.ipynb"


def test_options_are_this_torchs_parser():
    from torch.distributed.run import get_args_parser
    dests = [a.dest for a in get_args_parser()._actions
             if a.option_strings and a.dest != "help"]
    options = torchrun_demo.torchrun_options()
    assert [o.dest for o in options] == dests
    flags = {o.dest: o.flags for o in options}
    assert "--local-addr" in flags["local_addr"] and "--local_addr" in flags["local_addr"]
    assert "training_script" not in flags and "help" not in flags


def test_env_var_column_is_what_the_parser_reads(monkeypatch):
    """``PET_<DEST>`` sets an option's default (T/distributed/argparse_util.py); the column
    names it only for the options whose action reads it."""
    options = {o.dest: o for o in torchrun_demo.torchrun_options()}
    assert options["nproc_per_node"].env_var == "PET_NPROC_PER_NODE"
    assert options["logs_specs"].env_var is None          # a plain store action
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_STANDALONE", "1")
    monkeypatch.setenv("PET_LOGS_SPECS", "ignored")
    options = {o.dest: o for o in torchrun_demo.torchrun_options()}
    assert options["nproc_per_node"].default == "3" and options["standalone"].default is True
    assert options["logs_specs"].default is None


def test_table_has_one_line_per_option():
    options = torchrun_demo.torchrun_options()
    lines = torchrun_demo.options_table(options).splitlines()
    assert len(lines) == len(options) + 1
    assert any(line.startswith("--signals-to-handle ") and "SIGTERM,SIGINT,SIGHUP,SIGQUIT" in line
               for line in lines)


def test_notebook_makes_no_claim_about_an_older_torchs_options():
    text = " ".join("".join(cell["source"]) for cell in json.loads(NOTEBOOK.read_text())["cells"])
    assert "2.4's `torchrun -h`" not in text and "options_since" not in text
