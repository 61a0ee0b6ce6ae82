"""The files of the ssh test bed (``ssh_hosts``): keys made for one session, each host's
sshd configuration and the client's, in one private folder.

Nothing of the machine's own ssh set-up is used or touched: not /etc/ssh (``sshd -f`` and
``ssh -F`` ignore the system-wide files), not ~/.ssh, not an ssh agent. A host trusts one
client key, made now; the client trusts each host's key, made now, and nothing else
(``StrictHostKeyChecking yes`` against a known_hosts file holding exactly those keys).
https://man.openbsd.org/sshd_config  https://man.openbsd.org/ssh_config
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from ddp_lab.course.netns import Host

SSHD = Path("/usr/sbin/sshd")  # sshd re-executes itself, so it must start by absolute path
PRIVSEP = Path("/run/sshd")    # Debian's sshd chroots its pre-auth child here; systemd makes
                               # it for the machine's own sshd, which may not be running
PORT = 22                      # each host has its own ports, as a real machine has
CLIENT_KEY = "client_key"
KNOWN_HOSTS = "known_hosts"
AUTHORIZED_KEYS = "authorized_keys"
SSH_CONFIG = "ssh_config"


def write_all(folder: Path, hosts: Sequence[Host], subnet: str, user: str) -> None:
    """Every key and configuration of a session into ``folder`` (private, made by the
    caller): a key pair per host and one for the client, then the files that pair them."""
    _keygen(folder / CLIENT_KEY, "ddp_lab client")
    for host in hosts:
        (folder / host.name).mkdir(mode=0o700)
        _keygen(host_key(folder, host), f"ddp_lab {host.name}")
        sshd_config(folder, host).write_text(_sshd_config(folder, host, user))
    client = (folder / f"{CLIENT_KEY}.pub").read_text().strip()
    # from=: the key opens a session only from the test bed's own link
    (folder / AUTHORIZED_KEYS).write_text(f'from="{subnet}" {client}\n')
    (folder / KNOWN_HOSTS).write_text("".join(
        f"{host.name},{host.address} {_public_key(host_key(folder, host))}\n" for host in hosts))
    (folder / SSH_CONFIG).write_text(_ssh_config(folder, hosts, user))


def host_key(folder: Path, host: Host) -> Path:
    return folder / host.name / "host_key"


def sshd_config(folder: Path, host: Host) -> Path:
    return folder / host.name / "sshd_config"


def sshd_log(folder: Path, host: Host) -> Path:
    """Where the host's sshd writes its log (``-e``): "Server listening on" once it is
    ready, one line per login, and why a login was refused."""
    return folder / host.name / "sshd.log"


def _keygen(path: Path, comment: str) -> None:
    """An ed25519 key pair without passphrase (the session is its only user): ``path``
    (mode 0600, as ssh insists) and ``path.pub``."""
    done = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                           "-f", str(path)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ssh-keygen failed for {path}: {done.stderr.strip()}")


def _public_key(private: Path) -> str:
    """``TYPE BASE64`` of a key pair, without its comment: a known_hosts entry's key."""
    return " ".join(Path(f"{private}.pub").read_text().split()[:2])


def _sshd_config(folder: Path, host: Host, user: str) -> str:
    """A stock server's settings but for what makes it this session's alone: it listens on
    the host's own address only, knows this session's host key, lets in ``user`` with this
    session's client key and nothing else (no password; no PAM, so the machine's own login
    stack in /etc/pam.d/sshd has no say in the test bed). StrictModes stays on,
    which is why the folder lives under /run: sshd refuses keys below /tmp's mode 1777."""
    return f"""\
ListenAddress {host.address}:{PORT}
HostKey {host_key(folder, host)}
PidFile none
AuthorizedKeysFile {folder / AUTHORIZED_KEYS}
AllowUsers {user}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
PermitUserRC no
PermitUserEnvironment no
AllowAgentForwarding no
X11Forwarding no
PrintMotd no
PrintLastLog no
MaxStartups 64:30:128
"""


def _ssh_config(folder: Path, hosts: Sequence[Host], user: str) -> str:
    """``ssh -F THIS NAME``: the host's address, this session's key and only it (no agent,
    no ~/.ssh key), the hosts' real keys required, never a prompt (BatchMode: a question
    nobody can answer in a notebook would hang the cell), nothing forwarded."""
    names = "".join(f"Host {host.name}\n    HostName {host.address}\n" for host in hosts)
    return names + f"""\
Host *
    Port {PORT}
    User {user}
    IdentityFile {folder / CLIENT_KEY}
    IdentitiesOnly yes
    IdentityAgent none
    UserKnownHostsFile {folder / KNOWN_HOSTS}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    CheckHostIP no
    UpdateHostKeys no
    BatchMode yes
    ForwardAgent no
    ForwardX11 no
    ControlMaster no
    ConnectTimeout 10
    LogLevel ERROR
"""
