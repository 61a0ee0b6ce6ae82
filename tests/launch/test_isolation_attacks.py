"""Another user of this machine attacks each kind of run while it runs, and reaches nothing.

Before isolation, every TCP port of a run (the rendezvous store, each rank's gloo listeners,
torchrun's store, on all interfaces) was reachable, without authentication, by any local
user: /proc/net/tcp lists each listening port next to its owner's uid. Through the store
another user could read and change a run's tensors, and through torchrun's (which unpickles
what it holds) run code as its owner. Runs now live in a private user + network namespace
(launch/network/isolation.py), so none of their ports exists in the machine's network namespace.

Real processes, no mocks: a throwaway Unix user, created here and always removed, runs
tests/attacker.py (stdlib only) with the system's Python while a run of ours (root) holds
still. Two views must agree that the run is private:

- ours, the strongest: no socket of the run's processes (the fork server and its ranks,
  torchrun's agents and workers, and this process's own sockets opened since the run
  began) appears in the machine's /proc/net/tcp{,6}. A socket's inode is listed only in
  the table of the namespace it lives in (``sockets_in_machine_netns``);
- the attacker's: /proc/net/tcp{,6} shows it none of the run's listening sockets; it
  connects to none (on loopback and on the machine's own addresses, to what it sees and to
  the run's real port numbers, which we hand it as if it had guessed them), runs no store
  command, and cannot open the network namespace of the run's processes.

``test_the_attack_finds_a_store_in_the_machines_namespace`` proves the attack and both
checks work: a plain TCPStore opened here is found, connected to, read and written.

The attacker connects only to the run's sockets and port numbers, never to the machine's
other services. The tests are ``alone`` (tests/conftest.py): each namespace picks its port
numbers on its own, so a port of another test's run could carry the number of one of ours
and answer the attacker in our place.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

import attacker
import ddp_lab
from ddp_lab.launch.network import isolation
from ddp_lab.launch.torchrun.command import torchrun

pytestmark = [pytest.mark.timeout(120), pytest.mark.alone]
# Where the system refuses user namespaces, runs fall back to the machine's loopback and ARE
# reachable (README, "Who can reach a run"); the victims' tests then have nothing to prove.
PRIVATE = pytest.mark.skipif(isolation.probe() is not None,
                             reason=f"no private namespaces here: {isolation.probe()}")

SYSTEM_PYTHON = "/usr/bin/python3"  # the attacker's: the venv may sit in a folder it cannot read
ATTACKER_S = 60.0  # the attacker's whole run (each connection gives up after 1 s)
HOLD_S = 60.0  # a rank waits this long at most for the test to let it go


# -- the other user -----------------------------------------------------------------------
@dataclass
class OtherUser:
    """A throwaway user with a copy of tests/attacker.py it can read."""

    name: str
    uid: int
    gid: int
    script: str

    def attack(self, victim_uid: int, only_inodes=(), ports=(), ns_pids=()) -> dict:
        """Run the attacker as this user (no groups, a minimal environment, in /) and
        return its JSON report."""
        joined = lambda numbers: ",".join(str(n) for n in sorted(numbers))  # noqa: E731
        return self._run("--uid", str(victim_uid), "--only-inodes", joined(only_inodes),
                         "--ports", joined(ports), "--ns-pids", joined(ns_pids))

    def squat(self, folder: str) -> dict:
        """The attacker's try at a kernel's socket folder (attacker.try_squat)."""
        return self._run("--uid", str(os.getuid()), "--squat", folder)["squat"]

    def _run(self, *args: str) -> dict:
        done = subprocess.run(
            [SYSTEM_PYTHON, "-I", self.script, *args],
            user=self.uid, group=self.gid, extra_groups=[], cwd="/",
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
            capture_output=True, text=True, timeout=ATTACKER_S)
        assert done.returncode == 0, f"the attacker failed: {done.stderr}"
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def other_user():
    if os.geteuid() != 0:
        pytest.skip("needs root: the attacker runs as a throwaway user that root creates "
                    "(useradd) and removes (userdel)")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if useradd is None or userdel is None:
        pytest.skip("useradd/userdel not found: no throwaway user for the attacker")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} not found: the attacker needs a Python it can run")
    name = f"ddplab-attacker-{secrets.token_hex(4)}"
    folder = tempfile.mkdtemp(prefix="ddp-lab-attacker-")
    try:
        subprocess.run([useradd, "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "--user-group", name], check=True, capture_output=True, timeout=60)
        os.chmod(folder, 0o755)
        script = shutil.copy(Path(__file__).parents[1] / "attacker.py", folder)
        os.chmod(script, 0o644)
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid, script)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if _user_exists(name):  # even if useradd failed half way
            done = subprocess.run([userdel, name], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"userdel {name} failed: {done.stderr}"
            assert not _user_exists(name), f"the throwaway user {name} is still there"


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# -- which sockets are the run's, and where they live -------------------------------------
def socket_inodes(pid: int) -> set[int]:
    """The inodes of every socket process ``pid`` holds (``socket:[N]`` in /proc/PID/fd)."""
    found = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[len("socket:["):-1]))
    return found


@dataclass
class Before:
    """This process's sockets before the run started (the run's are those it opens)."""

    own: set[int] = field(default_factory=lambda: socket_inodes(os.getpid()))


@dataclass
class RunSockets:
    """The run's processes (every descendant of this process, and this process itself,
    which hosts the store of a one-shot run) and the socket inodes each holds (this
    process's: only those opened since ``Before``)."""

    by_pid: dict[int, set[int]]
    cmdlines: dict[int, str]

    @classmethod
    def now(cls, before: Before) -> "RunSockets":
        by_pid = {os.getpid(): socket_inodes(os.getpid()) - before.own}
        cmdlines = {os.getpid(): "this test process"}
        for child in psutil.Process().children(recursive=True):
            try:
                cmdlines[child.pid] = " ".join(child.cmdline())[:160]
            except psutil.Error:
                continue
            by_pid[child.pid] = socket_inodes(child.pid)
        return cls(by_pid, cmdlines)

    @property
    def inodes(self) -> set[int]:
        return set().union(*self.by_pid.values())

    def __or__(self, other: "RunSockets") -> "RunSockets":
        pids = self.by_pid.keys() | other.by_pid.keys()
        return RunSockets({pid: self.by_pid.get(pid, set()) | other.by_pid.get(pid, set())
                           for pid in pids}, {**self.cmdlines, **other.cmdlines})

    def owner(self, inode: int) -> str:
        pid = next((pid for pid, inodes in self.by_pid.items() if inode in inodes), None)
        return f"pid {pid}: {self.cmdlines.get(pid)[:90]}" if pid else "not the run's"

    def listening_ports(self) -> set[int]:
        """The ports the run listens on, each read in its own process's namespace
        (/proc/PID/net: the private one once runs are isolated)."""
        ports = set()
        for pid, inodes in self.by_pid.items():
            ports |= {row["port"] for row in attacker.tcp_table(f"/proc/{pid}/net")
                      if row["state"] == attacker.LISTEN and row["inode"] in inodes}
        return ports


def sockets_in_machine_netns(run: RunSockets) -> list[dict]:
    """The run's sockets that the machine's network namespace holds (rows of its TCP
    table): each inode of the run looked up in /proc/self/net/tcp{,6} (this test process
    lives in the machine's namespace, the one every other user sees). A socket of a private
    namespace is listed only in that namespace's table, so an isolated run leaves this
    empty."""
    machine = {row["inode"]: row for row in attacker.tcp_table("/proc/self/net")
               if row["inode"]}
    return [machine[inode] for inode in sorted(run.inodes & machine.keys())]


@dataclass
class Findings:
    exposed: list[dict]  # our view: rows of the machine's TCP table
    report: dict  # the attacker's
    run: RunSockets

    def problems(self) -> list[str]:
        """Everything that shows the run is not private (empty: it is), one line each."""
        problems = []
        listening = [row for row in self.exposed if row["state"] == attacker.LISTEN]
        if self.exposed:
            problems.append(
                f"the machine's network namespace holds {len(listening)} listening sockets "
                f"of the run: " + "; ".join(f"{row['proto']} {row['address']}:{row['port']} "
                                            f"({self.run.owner(row['inode'])})"
                                            for row in listening)
                + f"; and {len(self.exposed) - len(listening)} of its other TCP sockets")
        listed = [f"{row['address']}:{row['port']} uid {row['uid']}"
                  for row in self.report["listening"] if row["inode"] in self.run.inodes]
        if listed:
            problems.append(f"the attacker lists {len(listed)} of them in /proc/net/tcp"
                            f"{{,6}}: {', '.join(listed)}")
        if self.report["connections"]:
            problems.append(f"the attacker connected to {len(self.report['connections'])}: "
                            + ", ".join(self.report["connections"]))
        by_port: dict = {}
        for store in self.report["stores"]:
            by_port.setdefault(store["port"], []).append(store)
        for port, stores in by_port.items():
            done = [name for name in ("validate", "list_keys", "set")
                    if any(store[name] for store in stores)]
            problems.append(
                f"the attacker ran TCPStore commands ({', '.join(done)}) on port {port} via "
                f"{', '.join(store['via'] for store in stores)}: {stores[0]['key_count']} "
                f"keys, e.g. {stores[0]['keys'][:3]}")
        problems += [f"the attacker opened /proc/{ns['pid']}/ns/net (setns: {ns['setns']})"
                     for ns in self.report["namespaces"] if ns["open"] == "ok"]
        return problems


def attack_the_run(other_user: OtherUser, before: Before) -> Findings:
    """While the run holds still: our check, the attack, and our check again (a connection
    the run accepted from the attacker is a socket of the run too).

    The attacker lists every listening socket of our uid but connects only to the run's
    (by inode: those it can see) and to the run's port numbers (as if it had guessed
    them); the machine's other services, and the ports they hold, are left alone."""
    run = RunSockets.now(before)
    exposed = sockets_in_machine_netns(run)
    ports = run.listening_ports()
    taken = {row["port"] for row in attacker.listening() if row["inode"] not in run.inodes}
    report = other_user.attack(os.getuid(), only_inodes=run.inodes, ports=ports - taken,
                               ns_pids=[pid for pid in run.by_pid if pid != os.getpid()])
    run |= RunSockets.now(before)
    exposed += [row for row in sockets_in_machine_netns(run) if row not in exposed]
    assert ports, "the run listens on no port at all: nothing was attacked"
    assert report["probes"], f"the attacker tried no connection: {report}"
    return Findings(exposed, report, run)


def assert_private(findings: Findings) -> None:
    assert findings.report["namespaces"], "the run has no process of its own to attack"
    problems = findings.problems()
    assert not problems, ("another user reaches this run:\n  " + "\n  ".join(problems))


# -- holding a run still while it is attacked --------------------------------------------
def wait_for_release(folder: str, seconds: float = HOLD_S) -> None:
    deadline = time.monotonic() + seconds
    while not Path(folder, "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def hold(folder: str) -> float:
    """A rank of ``ddp_lab.run``: an all-reduce, then ready, then wait to be let go."""
    total = torch.ones(1)
    dist.all_reduce(total)
    Path(folder, f"rank{dist.get_rank()}.ready").write_text(str(os.getpid()))
    wait_for_release(folder)
    dist.barrier()
    return total.item()


def hold_spawned(rank: int, world_size: int, folder: str) -> float:
    """The same for ``ddp_lab.spawn``, written as for ``torch.multiprocessing.spawn``."""
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        return hold(folder)
    finally:
        dist.destroy_process_group()


HOLD_SCRIPT = textwrap.dedent("""\
    import os, sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    folder = Path(sys.argv[1])
    (folder / f"rank{dist.get_rank()}.ready").write_text(str(os.getpid()))
    deadline = time.monotonic() + float(sys.argv[2])
    while not (folder / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    print(f"held, all_reduce {total.item()}", flush=True)
    dist.destroy_process_group()
""")


def attacked_while_held(run, folder: Path, ranks: int, other_user: OtherUser,
                        before: Before):
    """``run()`` in this thread (ddp_lab's launchers expect the main thread); once its
    ``ranks`` ranks are ready in ``folder``, another thread attacks them, then lets them go.
    Returns what ``run()`` returned or raised, and the findings."""
    finished = threading.Event()
    found: dict = {}

    def attack_when_ready() -> None:
        try:
            while len(list(folder.glob("rank*.ready"))) < ranks:
                if finished.wait(0.05):
                    raise AssertionError("the run ended before its ranks were ready")
            found["findings"] = attack_the_run(other_user, before)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            found["error"] = exc
        finally:
            (folder / "release").touch()

    thread = threading.Thread(target=attack_when_ready, daemon=True)
    thread.start()
    try:
        outcome = run()
    except Exception as exc:  # noqa: BLE001 - judged after the findings
        outcome = exc
    finally:
        finished.set()
        (folder / "release").touch()
        thread.join(ATTACKER_S + 30)
    if "error" in found:
        if isinstance(outcome, BaseException):  # the run's own failure says more
            raise outcome from found["error"]
        raise found["error"]
    assert "findings" in found, "the attack did not finish"
    return outcome, found["findings"]


def succeeded(outcome):
    """``outcome`` itself, or the run's exception raised (after the isolation verdict)."""
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


# -- the proof that the attack works ------------------------------------------------------
def test_the_attack_finds_a_store_in_the_machines_namespace(other_user):
    """A TCPStore opened here the way torchrun's agent opens its own (``is_master``, no
    listening socket handed in: it binds every interface) is found by the other user in
    /proc/net/tcp, reached on loopback and on the machine's own address, read (the key set
    here) and written; and our inode check names its socket. The isolation tests below
    fail this way when a run is reachable."""
    before = Before()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        store.set("secret", "the victim's")
        port = store.port
        findings = attack_the_run(other_user, before)
        report = findings.report
        assert port in {row["port"] for row in report["listening"]}
        assert f"127.0.0.1:{port}" in report["connections"]
        non_loopback = [a for a in report["addresses"] if a not in ("127.0.0.1", "::1")]
        if non_loopback:  # a machine without a network still has the loopback
            assert any(via in non_loopback for via in
                       (store_["via"] for store_ in report["stores"]))
        on_loopback = next(s for s in report["stores"] if s["via"] == "127.0.0.1")
        assert on_loopback["validate"] and on_loopback["set"]
        assert "/secret" in on_loopback["keys"]  # torch's client puts "/" before each key
        assert all(ns["open"] != "ok" for ns in report["namespaces"])  # root's: EACCES
        assert any(row["port"] == port and row["state"] == attacker.LISTEN
                   and "this test process" in findings.run.owner(row["inode"])
                   for row in findings.exposed)
        assert findings.problems()
        assert store.get("secret") == b"the victim's"
    finally:
        del store  # the listening socket closes with it (the leak check looks)


# -- every kind of run, attacked while it runs --------------------------------------------
@PRIVATE
def test_a_live_session_is_out_of_reach(other_user):
    """``ddp_lab.Ranks``: its store and gloo listeners live as long as the session."""
    before = Before()
    with ddp_lab.Ranks(world_size=2, timeout=30, echo=False) as ranks:
        ranks.exec("secret = torch.tensor([3.25, -1.5, 1000.0 + rank])")
        summed = ranks.exec("total = secret.clone()\ndist.all_reduce(total)\ntotal.tolist()")
        findings = attack_the_run(other_user, before)
        after = ranks.exec("total.tolist()")
    assert_private(findings)
    assert summed.values == [[6.5, -3.0, 2001.0]] * 2
    assert after.values == summed.values  # the session and its state went on


ONE_SHOT = {  # a run of each kind that holds still in its folder
    "run": lambda folder: ddp_lab.run(hold, world_size=2, args=(folder,), timeout=90,
                                      echo=False),
    "spawn": lambda folder: ddp_lab.spawn(hold_spawned, args=(2, folder), nprocs=2, timeout=90,
                                          echo=False),
}


@PRIVATE
@pytest.mark.parametrize("launch", sorted(ONE_SHOT))
def test_a_one_shot_run_is_out_of_reach(other_user, tmp_path, launch):
    before = Before()
    outcome, findings = attacked_while_held(lambda: ONE_SHOT[launch](str(tmp_path)),
                                            tmp_path, 2, other_user, before)
    assert_private(findings)
    assert succeeded(outcome).values == [2.0, 2.0]


@PRIVATE
def test_run_script_under_torchrun_is_out_of_reach(other_user, tmp_path):
    """torchrun's agent: its store listens on every interface and unpickles what it holds
    (a pickle written there by another user runs in the agent)."""
    script = tmp_path / "hold.py"
    script.write_text(HOLD_SCRIPT)
    before = Before()
    outcome, findings = attacked_while_held(
        lambda: ddp_lab.run_script(script, world_size=2, script_args=(str(tmp_path), str(HOLD_S)),
                                   launcher="torchrun", timeout=90, echo=False),
        tmp_path, 2, other_user, before)
    assert_private(findings)
    assert all("held, all_reduce 2.0" in log for log in succeeded(outcome).logs)


@PRIVATE
def test_the_courses_torchrun_agent_is_out_of_reach(other_user, tmp_path):
    """``torchrun([...])``: the course's ``torchrun --standalone`` (notebooks 06, 08, 09),
    an ``agents.run_agents`` run of one agent on ``ThisMachine``."""
    script = tmp_path / "hold.py"
    script.write_text(HOLD_SCRIPT)
    before = Before()
    outcome, findings = attacked_while_held(
        lambda: torchrun([str(script), str(tmp_path), str(HOLD_S)], nproc=2, timeout=90),
        tmp_path, 2, other_user, before)
    assert_private(findings)
    result = succeeded(outcome)
    assert result.returncode == 0, result.output
    assert result.output.count("held, all_reduce 2.0") == 2


def test_the_notebook_runners_kernel_sockets_cannot_be_squatted(other_user, tmp_path):
    """The runner's kernel keeps its connection file and ipc sockets in a private
    folder; another user can neither list it, nor bind a name there, nor connect, and the
    kernel goes on answering."""
    from kernel_helpers import execute, start_kernel
    manager, client = start_kernel(tmp_path)
    try:
        folder = os.path.dirname(manager.connection_file)
        seen = other_user.squat(folder)
        assert execute(client, "print(6 * 7)").printed.strip() == "42"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert seen == {"list": "EACCES", "bind": "EACCES", "connect": "EACCES"}, seen
    assert not os.path.exists(folder)
