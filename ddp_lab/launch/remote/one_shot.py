"""``ddp_lab.run(fn, hosts=[...])``: a one-shot run on several hosts, as live ranks that
make one call and close (remote/session.py): the same agents, output, errors and cleanup,
and the error a one-shot run raises (verdict/outcome.py), with nothing said of live ranks.
"""

from __future__ import annotations

from ddp_lab.launch.live.outcome import verdict
from ddp_lab.launch.remote.session import RemoteSession
from ddp_lab.launch.verdict.outcome import RunResult, conclude


def run_on_hosts(config, payload: bytes) -> RunResult:
    """Start the hosts' ranks, call ``fn`` (``payload``: api.pickle_payload's) on every one,
    close: the values, or the error of the first thing that failed."""
    __tracebackhide__ = True
    with RemoteSession(config) as session:
        session.start()
        _raise_if_failed(session, session.wait())
        session.call("run", dict.fromkeys(range(config.world_size), payload), config.timeout)
        call = session.wait()
        _raise_if_failed(session, call)
        return verdict(session, call)


def _raise_if_failed(session: RemoteSession, call) -> None:
    __tracebackhide__ = True
    if call.died or call.stuck or any(r.status != "ok" for r in call.replies.values()):
        conclude(session.record())  # raises the one-shot run's error
