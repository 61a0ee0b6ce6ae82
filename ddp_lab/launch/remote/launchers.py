"""How an agent gets onto a host: ``via="ssh"`` (the user's own ssh, keys and config),
``via="slurm"`` (a step of the allocation the kernel runs in), or a template of the user's
with ``{host}`` and ``{command}`` in it.

The agent's command is one shell string (what ssh hands the remote shell): this Python,
this ddp_lab on its import path, the controller's address and the host's index. The
secret never appears in it: it goes down the launcher's stdin (secret.py).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from ddp_lab.launch.config import PACKAGE_ROOT

SSH = "ssh -o BatchMode=yes -T {host} {command}"
# A step inside the allocation (``--overlap``: the kernel's own step holds its cpus), one
# task on that one node, killed with its agent; srun passes its stdin to task 0.
SLURM = ("srun --overlap --nodes=1 --ntasks=1 --nodelist={host} --kill-on-bad-exit=1 "
         "--quiet /bin/sh -c {command}")
NAMED = {"ssh": SSH, "slurm": SLURM}
INSTALL = {"ssh": " (install OpenSSH's client: apt-get install openssh-client)",
           "srun": " (via='slurm' runs inside a SLURM allocation: salloc, then start Jupyter "
                   "there, or run from a node of the job)"}


def check_via(via) -> str:
    """The template ``via`` names or is; a clear error before anything starts."""
    if not isinstance(via, str) or not via.strip():
        raise TypeError(f"via must be 'ssh', 'slurm' or a command template string, got {via!r}")
    template = NAMED.get(via, via)
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"via={via!r} is not a command line ({exc})") from None
    if "{command}" not in words or not any("{host}" in word for word in words):
        raise ValueError(f"via={via!r}: use 'ssh', 'slurm', or a command line with {{host}} "
                         "and {command} as words of their own, e.g. "
                         "'ssh -p 2222 {host} {command}'")
    if shutil.which(words[0]) is None:
        raise FileNotFoundError(f"via={via!r} starts `{words[0]}`, which is not on this "
                                "machine's PATH" + INSTALL.get(words[0], ""))
    return template


def agent_command(controller: tuple[str, int], index: int, python: str | None = None) -> str:
    """The agent's command line on a host that shares this machine's files (a cluster's
    home and software), as one shell string."""
    address = f"[{controller[0]}]" if ":" in controller[0] else controller[0]
    argv = ["env", f"PYTHONPATH={PACKAGE_ROOT}", python or sys.executable, "-m",
            "ddp_lab.launch.remote.agent", "--connect", f"{address}:{controller[1]}",
            "--index", str(index)]
    return shlex.join(argv)


def launcher_argv(template: str, host: str, command: str) -> list[str]:
    """The template's words with the host's name in and the agent's command as one word."""
    return [command if word == "{command}" else word.replace("{host}", host)
            for word in shlex.split(template)]


def checked_hosts(hosts, nproc_per_node, via, controller, world_size: int):
    """``hosts=`` and its companions as a placement (``OnHosts``), each checked with an
    error that says what to pass, before anything starts."""
    from ddp_lab.launch.network.placement import OnHosts
    if isinstance(hosts, str) or not all(isinstance(h, str) and h.strip() for h in hosts):
        raise TypeError(f"hosts must be a list of host names, got {hosts!r}")
    names = tuple(h.strip() for h in hosts)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"hosts={list(hosts)!r}: name each host once (at least one)")
    nproc = _nproc(nproc_per_node, world_size, len(names))
    template = check_via(via)
    return OnHosts(names, nproc, template, _controller(controller, names[0], template),
                   os.getcwd())


def _nproc(nproc_per_node, world_size: int, host_count: int) -> int:
    if nproc_per_node is None:
        nproc_per_node, rest = divmod(world_size, host_count)
        if rest or not nproc_per_node:
            raise ValueError(f"world_size={world_size} does not split evenly over "
                             f"{host_count} hosts: give nproc_per_node= (ranks per host)")
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) \
            or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive int, got {nproc_per_node!r}")
    if nproc_per_node * host_count != world_size:
        raise ValueError(f"world_size={world_size} but {host_count} hosts x "
                         f"nproc_per_node={nproc_per_node} make {nproc_per_node * host_count} "
                         "ranks: make them agree")
    return nproc_per_node


def _controller(controller, first_host: str, template: str) -> str:
    """The address the hosts reach this machine at: given, or the one this machine's
    routing table would send from towards the first host (an ssh alias looked up as ssh
    itself would: ``ssh -G``)."""
    import ipaddress
    import socket
    if controller is not None:
        try:
            return str(ipaddress.ip_address(controller))
        except ValueError:
            raise ValueError(f"controller={controller!r} must be this machine's IP address "
                             "as the hosts reach it, e.g. '10.0.0.1'") from None
    try:
        target = socket.getaddrinfo(_ssh_hostname(template, first_host), 22,
                                    type=socket.SOCK_DGRAM)[0][4]
        with socket.socket(socket.AF_INET6 if ":" in target[0] else socket.AF_INET,
                           socket.SOCK_DGRAM) as probe:
            probe.connect(target)  # a UDP connect sends nothing: it only picks a route
            return probe.getsockname()[0]
    except OSError as exc:
        raise ValueError(f"cannot tell which address of this machine host {first_host!r} "
                         f"reaches ({exc}): pass controller='ADDRESS' (this machine's IP "
                         "address on the hosts' network)") from None


def _ssh_hostname(template: str, host: str) -> str:
    """The name ssh connects to for ``host`` (its config's ``HostName``: an alias in
    ~/.ssh/config, or the template's own ``-F`` file), or ``host`` where the launcher is not
    ssh or ssh cannot say."""
    import subprocess
    words = shlex.split(template)
    if os.path.basename(words[0]) != "ssh":
        return host
    options = [word for word in words[1:] if "{host}" not in word and word != "{command}"]
    try:
        shown = subprocess.run([words[0], "-G", *options, host], capture_output=True,
                               text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return host
    names = [line.split(None, 1)[1] for line in shown.splitlines()
             if line.startswith("hostname ")]
    return names[0].strip() if names else host
