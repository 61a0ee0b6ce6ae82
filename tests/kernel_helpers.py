"""A real Jupyter kernel for tests: started with this interpreter, driven message by message."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client import KernelManager

from ddp_lab.tools.notebook_runner import OwnKernel, kernel_env


class DrivenKernel(OwnKernel, KernelManager):
    """The blocking manager tests drive message by message (OwnKernel says why)."""


def start_kernel(cwd: Path):
    """A kernel and its client; the caller stops both (``shutdown_kernel`` also removes the
    kernel's private folder, OwnKernel). A kernel that does not get ready is stopped here."""
    manager = DrivenKernel(kernel_name="python3")
    try:
        manager.start_kernel(env=kernel_env(), cwd=str(cwd),
                             extra_arguments=["--IPKernelApp.log_level=ERROR"])
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=120)
    except BaseException:
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)
        manager.cleanup_connection_file()
        raise
    return manager, client


@dataclass
class CellRun:
    reply: dict
    printed: str = ""
    displays: list = field(default_factory=list)   # display_data and update_display_data texts
    error: dict | None = None
    messages: list = field(default_factory=list)  # every IOPub message, if asked to keep them

    @property
    def ok(self) -> bool:
        return self.reply["status"] == "ok"


def _shell_reply(client, msg_id: str, timeout: float) -> dict:
    """The execute_reply to ``msg_id``: replies to earlier requests (start_kernel's own)
    may still be queued, and taking the next one made every reply the previous cell's."""
    while True:
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


def execute(client, code: str, timeout: float = 120, keep_messages: bool = False) -> CellRun:
    """Run a cell and gather what the notebook would show for it (and, with
    ``keep_messages``, the messages themselves: their headers say when each was sent)."""
    msg_id = client.execute(textwrap.dedent(code))
    run = CellRun(reply={})
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if keep_messages:
            run.messages.append(msg)
        if kind == "stream":
            run.printed += content["text"]
        elif kind in ("display_data", "update_display_data"):
            run.displays.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            run.error = content
        elif kind == "status" and content["execution_state"] == "idle":
            break
    run.reply = _shell_reply(client, msg_id, timeout)
    return run


def interrupt(manager, client, msg_id: str, timeout: float = 60) -> dict:
    """Interrupt the running request ``msg_id`` and return its execute_reply, once the kernel
    is done with it. An error reply makes ipykernel abort the execute requests that reach it
    before it has posted its "stop aborting" marker (kernelbase.py, ``_abort_queues``); the
    reply is sent before that marker, the iopub "idle" after it. So a request sent right after
    the reply can be answered "aborted" on a busy machine, and one sent after "idle" cannot:
    wait for it, as a frontend does before it runs the next cell."""
    manager.interrupt_kernel()
    reply = _shell_reply(client, msg_id, timeout)
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            return reply
