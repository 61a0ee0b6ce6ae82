"""run_script: torchrun-compatible scripts, with report() and the same errors and cleanup."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import ddp_lab
from ddp_lab.scripts import script_path

pytestmark = pytest.mark.timeout(180)


def test_script_reports_values_per_rank(capsys):
    res = ddp_lab.run_script(script_path("all_reduce_once.py"), world_size=3)
    assert res.values == [3.0, 3.0, 3.0]
    assert "[rank 2] rank 2: sum of ranks = 3" in capsys.readouterr().out


def test_script_gets_its_arguments_and_argv(tmp_path):
    script = tmp_path / "args.py"
    script.write_text(textwrap.dedent("""
        import sys, ddp_lab, torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
        ddp_lab.report({"argv": sys.argv[1:], "name": __name__, "rank": dist.get_rank()})
    """))
    res = ddp_lab.run_script(script, world_size=2, script_args=["--epochs", "1"], echo=False)
    assert res.values == [{"argv": ["--epochs", "1"], "name": "__main__", "rank": r}
                          for r in range(2)]


def test_script_without_report_returns_none(tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text("print('hi')\n")
    assert ddp_lab.run_script(script, world_size=2, echo=False).values == [None, None]


def test_script_error_and_sys_exit(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        if os.environ["RANK"] == "1":
            raise RuntimeError("bad config")
        sys.exit(0)
    """))
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run_script(script, world_size=2, echo=False)
    assert info.value.rank == 1 and "RuntimeError: bad config" in info.value.traceback
    assert 'bad.py", line 4' in info.value.traceback

    script.write_text("import sys, os\nsys.exit(3 if os.environ['RANK'] == '0' else 0)\n")
    with pytest.raises(ddp_lab.WorkerError) as info:
        ddp_lab.run_script(script, world_size=2, echo=False)
    assert info.value.rank == 0 and info.value.exitcode == 3


def test_same_script_runs_under_real_torchrun_and_report_is_harmless(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2",
                          f"--log-dir={tmp_path}",  # else a /tmp/torchelastic_* is left
                          script_path("all_reduce_once.py")],
                         capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr
    assert "sum of ranks = 1" in out.stdout
