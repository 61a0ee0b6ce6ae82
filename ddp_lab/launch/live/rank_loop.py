"""What a live rank does: wait for a call, run it in the rank's namespace, reply, again,
until its call pipe closes (the session closed, or the kernel died).

It runs inside a rank forked by the fork server, after the one-shot rank's set-up (output,
lifeline, stack dump: rank/main.py), as that rank's body; it stays here, with the rest of
live/, rather than in rank/. The stop button reaches it as SIGINT: a ``KeyboardInterrupt``
in the call's Python code, and an ``interrupted`` reply; between calls SIGINT is ignored,
so a late one never kills an idle rank.
"""

from __future__ import annotations

import ast
import linecache
import pickle
import signal

import cloudpickle

from ddp_lab.launch.config import RunFiles
from ddp_lab.launch.live.frames import Call, Reply, receive, send
from ddp_lab.launch.payload import remember_source
from ddp_lab.launch.rank.main import (destroy_group, error_record, flush_streams, init_group,
                                      to_cpu, write_error)

NEVER = float("inf")


class _CallGuard:
    """SIGINT raises KeyboardInterrupt only while a call's code runs, and only the call the
    kernel meant: its SIGINT travels through the fork server and may land after that call
    has replied, in the next one; the kernel writes the call's number first
    (``RunFiles.interrupted_call``). A SIGINT with no number written (``kill -INT``) counts."""

    def __init__(self, files: RunFiles):
        self.busy = False
        self.seq = None
        self.files = files
        signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        if self.busy and self._meant_for_this_call():
            self.busy = False  # once: the handler's own clean-up must not be interrupted
            raise KeyboardInterrupt

    def _meant_for_this_call(self) -> bool:
        try:
            return int(self.files.interrupted_call.read_text()) == self.seq
        except (OSError, ValueError):
            return True


def serve_calls(spec, calls_fd: int, replies_fd: int) -> int:
    """A live rank's body (``rank_main``'s ``body``): the group once, then every call the
    kernel sends until it closes the call pipe."""
    try:
        init_group(spec)
        code = serve(spec, calls_fd, replies_fd)
        destroy_group()
        return code
    except BaseException as exc:  # noqa: BLE001 - e.g. the group's set-up failed
        write_error(RunFiles(spec.run_dir).error(spec.rank), exc)
        return 1


def serve(spec, calls_fd: int, replies_fd: int) -> int:
    """Answer calls until the pipe closes; the exit code of the rank. Errors, values and
    streams are handled as the one-shot rank's (rank/main.py: one home for each); the
    first reply says the group is ready."""
    namespace = fresh_namespace()
    guard = _CallGuard(RunFiles(spec.run_dir))
    send(replies_fd, Reply(0, spec.rank, "ok", cloudpickle.dumps(None)), NEVER)
    while True:
        try:
            call = receive(calls_fd)
            if call is None:
                return 0
            reply = _answer(call, spec.rank, namespace, guard)
        except KeyboardInterrupt:  # between the call's end and the reply: it is done
            continue
        # all the call printed is in the output pipe before the reply: the kernel reads
        # the output to its end once every reply is in
        flush_streams()
        send(replies_fd, reply, NEVER)


def fresh_namespace() -> dict:
    """What ``ranks.exec`` code finds ready: torch, dist, rank, world_size (the group's:
    across hosts, the global numbers, where the session's own count is the host's)."""
    import torch
    import torch.distributed as dist
    return {"__name__": "__ddp_rank__", "torch": torch, "dist": dist,
            "rank": dist.get_rank(), "world_size": dist.get_world_size()}


def _answer(call: Call, rank: int, namespace: dict, guard: _CallGuard) -> Reply:
    try:
        guard.seq, guard.busy = call.seq, True
        value = HANDLERS[call.kind](call.body, namespace, rank)
        guard.busy = False
        return Reply(call.seq, rank, "ok", _dumps_value(to_cpu(value)))
    except KeyboardInterrupt as exc:
        guard.busy = False
        return Reply(call.seq, rank, "interrupted", error_record(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back as a reply
        guard.busy = False
        return Reply(call.seq, rank, "error", error_record(exc))


def _run(body: bytes, namespace: dict, rank: int):
    fn, args, kwargs, sources = cloudpickle.loads(body)
    linecache.cache.update(sources)  # tracebacks quote the notebook's lines
    return fn(*args, **kwargs)


def _exec(body: tuple, namespace: dict, rank: int):
    """Run the source like a notebook cell: the value of a last bare expression is the
    call's value (None otherwise)."""
    source, filename = body
    remember_source(filename, source)
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec"), namespace)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), filename, "eval"), namespace)


def _pull(name: str, namespace: dict, rank: int):
    if name not in namespace:
        raise NameError(f"name {name!r} is not defined on rank {rank}: define it with "
                        f"ranks.exec(...) or ranks.run(...), or send it with "
                        f"ranks.push({name}=...)")
    return namespace[name]


def _push(body: bytes, namespace: dict, rank: int):
    namespace.update(cloudpickle.loads(body))


HANDLERS = {"run": _run, "exec": _exec, "pull": _pull, "push": _push}


def _dumps_value(value) -> bytes:
    """Plain pickle first: several times cheaper than cloudpickle for the numbers, tensors
    and containers calls return, and a call's round trip is the point of live ranks. What
    only cloudpickle can send (a class or function defined in a cell, or on the rank) makes
    plain pickle fail, never misread: it pickles by reference, and those names do not
    resolve in the rank's ``__main__`` (the fork server) or as a module."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - pickling by reference fails in many ways
        pass
    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - pickling fails in many ways
        raise TypeError(f"this rank's value cannot be sent back to the kernel "
                        f"({type(exc).__name__}: {exc}); return plain data: numbers, "
                        "strings, lists, dicts, CPU tensors") from None


