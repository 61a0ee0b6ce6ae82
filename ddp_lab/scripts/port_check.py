"""The usual multi-node connectivity check without netcat: can a worker reach the master's port?

    python -m ddp_lab.scripts.port_check listen 29400           # on the master: nc -l 29400
    python -m ddp_lab.scripts.port_check connect HOST 29400     # on a worker: nc -zv HOST 29400

``connect`` also tells a refused connection (the host answered: it is reachable, nothing
listens on that port yet) from a timeout (no answer at all: wrong address, a firewall
dropping packets, no route), which is the question ``ping`` is usually asked. Plain
sockets only, no torch: it starts in a blink.
"""

from __future__ import annotations

import argparse
import socket
import sys


def listen(port: int, address: str = "0.0.0.0", timeout: float = 30.0) -> int:
    """Accept one connection, like ``nc -l PORT``; exit code 0 when one came."""
    with socket.create_server((address, port)) as server:
        server.settimeout(timeout)
        print(f"Listening on {address} {port}", flush=True)
        try:
            connection, peer = server.accept()
        except TimeoutError:
            print(f"no connection within {timeout:g} s", flush=True)
            return 1
        connection.close()
        print(f"Connection received on {peer[0]} {peer[1]}", flush=True)
        return 0


def connect(host: str, port: int, timeout: float = 5.0) -> int:
    """Open and close one connection, like ``nc -zv HOST PORT``; exit code 0 on success."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            print(f"Connection to {host} {port} port [tcp/*] succeeded!", flush=True)
            return 0
    except ConnectionRefusedError:
        why = "refused: the host is reachable, but nothing listens on that port"
    except TimeoutError:
        why = f"no answer in {timeout:g} s: wrong address, no route, or a firewall"
    except OSError as exc:
        why = f"{exc.strerror or exc}"
    print(f"connect to {host} port {port} (tcp) failed: {why}", flush=True)
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    listen_cmd = sub.add_parser("listen", help="wait for one connection (nc -l PORT)")
    listen_cmd.add_argument("port", type=int)
    listen_cmd.add_argument("--address", default="0.0.0.0")
    listen_cmd.add_argument("--timeout", type=float, default=30.0)
    connect_cmd = sub.add_parser("connect", help="try one connection (nc -zv HOST PORT)")
    connect_cmd.add_argument("host")
    connect_cmd.add_argument("port", type=int)
    connect_cmd.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.command == "listen":
        return listen(args.port, args.address, args.timeout)
    return connect(args.host, args.port, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
