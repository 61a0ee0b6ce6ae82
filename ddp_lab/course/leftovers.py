"""What a run may have left behind: the check every failure chapter ends with."""

from __future__ import annotations


def leftover_processes() -> list:
    """Processes this kernel started that are still alive, leaving out the two helpers that
    are meant to stay: ddp_lab's fork servers and multiprocessing's resource tracker (which
    mp.spawn starts once per kernel). After any run, this should be empty."""
    import psutil
    import ddp_lab.launch.forkserver.client
    keep = ddp_lab.launch.forkserver.client.launcher_pids()
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid not in keep and "resource_tracker" not in " ".join(_cmdline(p))]


def _cmdline(process) -> list[str]:
    import psutil
    try:
        return process.cmdline()
    except psutil.Error:
        return []
