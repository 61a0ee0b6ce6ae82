"""Cell 38: "by default [controller] is the address this machine's routes would use towards
the first host. Here that is the bed's .254." What does the default give with the bed up?
(launchers._controller resolves the first host's name with getaddrinfo: this machine's
resolver, not ssh's configuration.) Needs root and openssh-server."""
import socket

import ddp_lab
from ddp_lab.course import ssh_hosts

with ssh_hosts.ssh_hosts(2) as bed:
    names = [h.name for h in bed.hosts]
    try:
        socket.getaddrinfo(names[0], 22)
        print(names[0], "resolves on this machine")
    except OSError as exc:
        print(f"getaddrinfo({names[0]!r}) on this machine: {exc}")
    print("ssh knows it from", bed.config, ":",
          [line.strip() for line in bed.config.read_text().splitlines()
           if line.strip().startswith(("Host ", "HostName"))][:2])
    try:
        ddp_lab.Ranks(4, hosts=names, nproc_per_node=2, via=bed.via)  # no controller=
        print("started without controller=")
    except ValueError as exc:
        print("ValueError:", exc)
