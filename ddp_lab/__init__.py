"""ddp_lab: run torch.distributed code on several processes, straight from a notebook.

    import ddp_lab
    res = ddp_lab.run(fn, world_size=4)   # fn runs on 4 ranks, process group ready
    res.values, res.logs, res.seconds
"""

from ddp_lab.errors import DistributedRunError, WorkerError, WorkerTimeout
from ddp_lab.launch import run, run_script
from ddp_lab.magic import load_ipython_extension
from ddp_lab.outcome import RunResult
from ddp_lab.progress import progress
from ddp_lab.spawner import shutdown
from ddp_lab.worker import report

__all__ = ["run", "run_script", "report", "RunResult", "DistributedRunError", "WorkerError",
           "WorkerTimeout", "shutdown", "progress", "load_ipython_extension"]
__version__ = "0.1.0"
