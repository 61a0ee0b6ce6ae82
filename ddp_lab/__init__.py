"""ddp_lab: run torch.distributed code on several processes, straight from a notebook.

    import ddp_lab
    res = ddp_lab.run(fn, world_size=4)   # fn runs on 4 ranks, process group ready
    res.values, res.logs, res.seconds
    ddp_lab.spawn(demo, args=(4,), nprocs=4)   # an mp.spawn-style demo(rank, world_size)
    ddp_lab.run(fn, world_size=4, network="1gbit")   # each rank on a 1 Gbit/s link
"""

from ddp_lab.launch.errors import (DistributedRunError, ForkServerUnresponsive, HostUnreachable,
                                   UnreadableResult, WorkerError, WorkerTimeout)
from ddp_lab.launch.api import run, run_script
from ddp_lab.launch.live.handle import Ranks
from ddp_lab.launch.magic import load_ipython_extension
from ddp_lab.launch.network.setting import Network, NetworkUnavailable
from ddp_lab.launch.verdict.outcome import RunResult
from ddp_lab.launch.rank.progress import progress
from ddp_lab.launch.mp_spawn import spawn
from ddp_lab.launch.forkserver.client import shutdown
from ddp_lab.launch.rank.main import report
from ddp_lab.launch.network.isolation import IsolationUnavailable, SharedNetworkWarning

__all__ = ["run", "run_script", "spawn", "report", "Ranks", "RunResult", "DistributedRunError",
           "WorkerError", "WorkerTimeout", "UnreadableResult", "ForkServerUnresponsive",
           "HostUnreachable",
           "shutdown", "progress", "load_ipython_extension", "Network", "NetworkUnavailable",
           "IsolationUnavailable", "SharedNetworkWarning"]
__version__ = "0.1.0"
