"""The grading sandbox, attacked for real: each test runs a hostile command in
``run_sandboxed`` and checks that the harm did not happen, then that nothing of the
sandbox is left (no process, mount namespace, temp folder or /dev/shm entry).

Where it matters the attack also runs with the sandbox's caller as a second, throwaway
Unix user (root creates and removes it), so that both shapes are proven: root's sandbox
(the command runs as ``nobody``) and an unprivileged user's (it runs as that user).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from ddp_lab.grading.sandbox import SandboxResult, run_sandboxed

pytestmark = pytest.mark.timeout(180)
PYTHON = sys.executable
GIB = 1 << 30
BUDGET = {"wall_s": 60.0, "memory_bytes": 2 * GIB, "max_processes": 64}


@pytest.fixture
def folders(tmp_path):
    """A class of two submissions: ``mine`` (the sandbox's folder) and ``theirs`` (a
    neighbour's, with a secret in it)."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    (theirs / "secret.txt").write_text("their answers")
    return mine, theirs


def python(code: str, folder: Path, **budget) -> SandboxResult:
    """``code`` run by this venv's Python in the sandbox."""
    return run_sandboxed([PYTHON, "-c", textwrap.dedent(code)], folder,
                         **{**BUDGET, **budget})


NAMESPACE_KINDS = ("user", "mnt", "pid", "net", "ipc")
SAY_NAMESPACES = ("import os; print('NS', *(os.readlink(f'/proc/self/ns/{kind}') for kind in "
                  f"{NAMESPACE_KINDS!r}), flush=True)\n")


def namespaces_in(stdout: str) -> set[str]:
    """The namespaces a command printed with SAY_NAMESPACES (its own ones)."""
    lines = [line.split()[1:] for line in stdout.splitlines() if line.startswith("NS ")]
    assert lines, f"the command did not say its namespaces: {stdout!r}"
    return set(lines[0])


def assert_namespaces_gone(names: set[str]) -> None:
    """No process of this machine is in any of these namespaces any more (they go with
    their last process; the kernel reuses no inode while one is in use)."""
    ours = {os.readlink(f"/proc/self/ns/{kind}") for kind in NAMESPACE_KINDS}
    assert not names & ours, f"the sandbox shared a namespace with its caller: {names & ours}"
    for process in psutil.process_iter():
        for kind in NAMESPACE_KINDS:
            try:
                name = os.readlink(f"/proc/{process.pid}/ns/{kind}")
            except OSError:
                continue
            assert name not in names, f"process {process.pid} is still in {name}"


@pytest.fixture(autouse=True)
def nothing_left():
    """No process and no /dev/shm entry left by the test (a process that was there before
    it is another test's: a module's live ranks, on the same xdist worker)."""
    before_shm = set(os.listdir("/dev/shm"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    children = [p for p in psutil.Process().children(recursive=True) if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE and p.pid not in before]
    assert not children, f"left behind: {children}"
    added = {name for name in set(os.listdir("/dev/shm")) - before_shm
             if name.startswith("ddp-lab-sandbox")}
    assert not added, f"/dev/shm entries left: {added}"


def test_a_command_runs_and_its_output_comes_back(folders):
    mine, _ = folders
    done = python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)", mine)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert not done.timed_out and done.reason == ""


def test_it_writes_its_folder_and_nothing_else(folders):
    mine, theirs = folders
    target = Path(__file__).resolve().parents[2] / "ddp_lab" / "__init__.py"
    before = target.read_bytes()
    done = python(f"""
        import os, pathlib
        pathlib.Path('answer.txt').write_text('mine')
        for path in ({str(target)!r}, '/etc/ddp-lab-sandbox-probe', {str(theirs / 'x')!r}):
            try:
                open(path, 'a').close()
                print('wrote', path)
            except OSError as exc:
                print('refused', path, exc.errno)
        try:
            os.remove({str(target)!r})
            print('deleted')
        except OSError as exc:
            print('not deleted', exc.errno)
        """, mine)
    assert done.returncode == 0, done.stderr
    assert "wrote" not in done.stdout and "deleted\n" not in done.stdout, done.stdout
    assert (mine / "answer.txt").read_text() == "mine"
    assert target.read_bytes() == before
    assert not (theirs / "x").exists() and not Path("/etc/ddp-lab-sandbox-probe").exists()


def test_the_other_submissions_are_out_of_sight(folders):
    mine, theirs = folders
    done = python(f"""
        import os
        print(sorted(os.listdir('..')))
        print(os.path.exists({str(theirs / 'secret.txt')!r}))
        """, mine)
    assert done.stdout.split("\n")[:2] == ["['mine']", "False"], done.stdout + done.stderr


def test_no_network_but_its_own_loopback(folders):
    mine, _ = folders
    done = python("""
        import socket
        print(sorted(name for _, name in socket.if_nameindex()))
        server = socket.create_server(('127.0.0.1', 0))
        client = socket.create_connection(server.getsockname())
        print('loopback works')
        try:
            socket.create_connection(('1.1.1.1', 53), timeout=2)
            print('reached the world')
        except OSError as exc:
            print('unreachable', exc.errno)
        """, mine)
    assert done.stdout.startswith("['lo']\nloopback works\nunreachable"), done.stdout + done.stderr


def test_a_command_past_its_wall_clock_is_killed_with_every_descendant(folders):
    mine, _ = folders
    start = time.monotonic()
    done = python(SAY_NAMESPACES + """
import os, subprocess, sys, time
# a grandchild in a session of its own, that ignores SIGTERM and outlives its parent
subprocess.Popen([sys.executable, '-c', 'import signal, time; '
                  'signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'],
                 start_new_session=True)
print('started', flush=True)
time.sleep(600)
""", mine, wall_s=3.0)
    assert done.timed_out and done.returncode == -signal.SIGKILL
    assert done.reason == "ran past its 3 s budget"
    assert done.stdout.endswith("\nstarted\n")
    assert time.monotonic() - start < 15
    assert_namespaces_gone(namespaces_in(done.stdout))


NEIGHBOUR = """
import os, time
for _ in range(40):  # keeps forking while the bomb goes off next door (same user: nobody)
    children = []
    for _ in range(8):
        child = os.fork()
        if child == 0:
            os._exit(0)
        children.append(child)
    for child in children:
        os.waitpid(child, 0)
    time.sleep(0.05)
print('forked 320 children')
"""


def test_a_fork_bomb_fails_to_fork_and_is_stopped(folders, tmp_path):
    """The bomb's forks fail at its budget and it is stopped; a submission graded beside
    it, as the same user, forks all it wants meanwhile."""
    import threading
    mine, _ = folders
    (tmp_path / "next" / "door").mkdir(parents=True)
    beside = {}
    neighbour = threading.Thread(target=lambda: beside.update(done=python(
        NEIGHBOUR, tmp_path / "next" / "door")))
    neighbour.start()
    start = time.monotonic()
    done = python(SAY_NAMESPACES + """
import json
import os
failed = 0
while True:
    try:
        os.fork()
    except OSError:
        failed += 1
        if failed == 1:
            print('fork refused', flush=True)
""", mine, max_processes=32, wall_s=60.0)
    assert not done.timed_out and done.returncode == -signal.SIGKILL, done
    assert done.reason == "tried to start more than 32 processes (threads count)"
    assert "fork refused" in done.stdout
    assert time.monotonic() - start < 20
    assert_namespaces_gone(namespaces_in(done.stdout))
    neighbour.join(60)
    assert beside["done"].stdout == "forked 320 children\n", beside["done"]


def test_memory_past_the_budget_is_refused(folders):
    mine, _ = folders
    done = python("block = bytearray(3 << 30)", mine, memory_bytes=1 * GIB)
    assert done.returncode == 1 and "MemoryError" in done.stderr, done
    assert done.reason == "ran out of memory (1 GiB per process)"


def test_an_output_flood_is_bounded(folders):
    mine, _ = folders
    done = python("""
        import os
        os.write(1, b'first line\\n')
        chunk = b'x' * (1 << 20)
        for _ in range(64):
            os.write(1, chunk)
        os.write(1, b'\\nlast line\\n')
        """, mine)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) < (1 << 20) + 1000
    assert done.stdout.startswith("first line\n") and done.stdout.endswith("last line\n")
    written = len("first line\n") + (64 << 20) + len("\nlast line\n")
    assert f"[sandbox: {written - (1 << 20)} bytes (63.0 MB) dropped here" in done.stdout


def test_its_mounts_stay_locked_in_namespaces_it_makes(folders):
    """Code in the sandbox may make a user namespace of its own (ddp_lab.run does),
    where it holds every capability; the sandbox's mounts come into it locked, so it
    cannot make the package writable, nor lift the tmpfs that hides its neighbours."""
    mine, _ = folders
    package = str(Path(__file__).resolve().parents[2])
    done = python(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = os.getuid(), os.getgid()
        assert libc.unshare(0x10000000 | 0x20000) == 0, 'unshare'
        for name, text in (('setgroups', 'deny'), ('uid_map', f'0 {{uid}} 1'),
                           ('gid_map', f'0 {{gid}} 1')):
            with open(f'/proc/self/{{name}}', 'w') as file:
                file.write(text)
        def attempt(what, result):
            print(what, 'worked' if result == 0 else os.strerror(ctypes.get_errno()))
        attempt('remount', libc.mount(None, {package!r}.encode(), None, 32 | 4096, None))
        attempt('umount', libc.umount2(os.path.dirname(os.getcwd()).encode(), 2))
        print(sorted(os.listdir('..')))
        try:
            open({package!r} + '/ddp-lab-probe', 'w')
            print('wrote the package')
        except OSError as exc:
            print('write refused', exc.errno)
        """, mine)
    assert done.returncode == 0, done.stderr
    assert "worked" not in done.stdout and "wrote" not in done.stdout, done.stdout
    assert "['mine']" in done.stdout


def test_two_sandboxes_cannot_reach_each_other(tmp_path):
    """Two submissions graded at once, both as the same user: the second finds none of
    the first's processes, files, shared memory or ports."""
    import threading
    first, second = tmp_path / "a" / "first", tmp_path / "b" / "second"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    results = {}
    holder = threading.Thread(target=lambda: results.update(first=python("""
        import os, pathlib, socket, time
        server = socket.create_server(('127.0.0.1', 0))
        pathlib.Path('/tmp/first-secret').write_text('x')
        pathlib.Path('/dev/shm/ddp-lab-sandbox-first').write_text('x')
        pathlib.Path('port').write_text(str(server.getsockname()[1]))
        while not pathlib.Path('done').exists():
            time.sleep(0.05)
        """, first)))
    holder.start()
    try:
        deadline = time.monotonic() + 30
        while not (first / "port").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int((first / "port").read_text())
        seen = python(f"""
            import os, socket
            print(sorted(os.listdir('/tmp')), sorted(os.listdir('/dev/shm')))
            print(sorted(n for n in os.listdir('/proc') if n.isdigit()))
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=2)
                print('connected')
            except OSError as exc:
                print('refused', exc.errno)
            print(os.path.exists({str(first)!r}))
            """, second)
    finally:
        (first / "done").write_text("")
        holder.join(60)
    assert results["first"].returncode == 0, results["first"].stderr
    tmp_listing, pids, connection, reached = seen.stdout.splitlines()
    assert "first-secret" not in tmp_listing and "ddp-lab-sandbox-first" not in tmp_listing
    assert pids == "['1', '2']", pids  # init and the command itself
    assert connection.startswith("refused") and reached == "False", seen.stdout


def test_a_folder_the_sandbox_cannot_hide_around_is_refused(tmp_path):
    package_home = Path(__file__).resolve().parents[2]
    for folder, said in ((Path("/tmp"), "that is the root"),
                         (package_home / "ddp_lab", "which the command needs")):
        with pytest.raises(ValueError, match=said):
            run_sandboxed(["true"], folder, **BUDGET)
    with pytest.raises(ValueError, match="is not a folder"):
        (tmp_path / "file").write_text("")
        run_sandboxed(["true"], tmp_path / "file", **BUDGET)


# -- the caller interrupted ---------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
HOLDER = ("import os, time\n"
          "names = [os.readlink(f'/proc/self/ns/{kind}') for kind in "
          f"{NAMESPACE_KINDS!r}]\n"
          "open('ns.tmp', 'w').write(' '.join(names))\n"
          "os.rename('ns.tmp', 'ns')\n"
          "time.sleep(600)\n")
CALLER = ("import sys\nfrom pathlib import Path\n"
          "from ddp_lab.grading.sandbox import run_sandboxed\n"
          "run_sandboxed([sys.executable, '-c', sys.argv[2]], Path(sys.argv[1]), wall_s=300,"
          " memory_bytes=2 << 30, max_processes=64)\n")


def wait_for(path: Path, seconds: float = 60.0) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_grader_leaves_nothing(folders, signum):
    """The grader stopped while a submission runs (Ctrl-C, SIGTERM, or killed outright):
    every process of the sandbox, and its namespaces, go with it."""
    mine, _ = folders
    caller = subprocess.Popen([PYTHON, "-c", CALLER, str(mine), HOLDER], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        names = set(wait_for(mine / "ns").split())
        sandbox = psutil.Process(caller.pid).children(recursive=True)
        assert len(sandbox) >= 3  # the helper, init, the command
        caller.send_signal(signum)
        caller.wait(30)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        caller.stdout.close()
        caller.stderr.close()
    gone, alive = psutil.wait_procs(sandbox, timeout=10)
    assert not alive, f"the sandbox outlived its caller: {alive}"
    assert_namespaces_gone(names)


# -- as an unprivileged user --------------------------------------------------------------
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's Python lives where another user cannot go
SHIM = ("import json, sys, types\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "for name in ('ddp_lab', 'ddp_lab.grading'):  # their __init__ needs torch\n"
        "    module = types.ModuleType(name)\n"
        f"    module.__path__ = [{str(REPO)!r} + '/' + name.replace('.', '/')]\n"
        "    sys.modules[name] = module\n"
        "from pathlib import Path\n"
        "from ddp_lab.grading.sandbox import run_sandboxed\n"
        "done = run_sandboxed([sys.executable, '-c', sys.argv[2]], Path(sys.argv[1]), "
        "wall_s=60, memory_bytes=1 << 30, max_processes=16)\n"
        "print(json.dumps(done.__dict__))\n")
ATTACK = f"""
import json, os
report = {{'uid': os.getuid(), 'neighbours': sorted(os.listdir('..'))}}
for path in ('../beside.txt', '{{OUTSIDE}}', {str(REPO / 'README.md')!r}):
    try:
        open(path, 'a').close()
        report[path] = 'written'
    except OSError as exc:
        report[path] = exc.errno
report['bomb'] = 0
try:
    for _ in range(64):
        if os.fork() == 0:
            import time; time.sleep(30); os._exit(0)
        report['bomb'] += 1
except OSError:
    pass
print(json.dumps(report), flush=True)
os._exit(0)
"""


@pytest.fixture(scope="module")
def other_user():
    """A throwaway Unix user (root creates it here and always removes it)."""
    import pwd
    import secrets
    import shutil
    if os.geteuid() != 0 or not shutil.which("useradd") or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs root, useradd/userdel and /usr/bin/python3 for a throwaway user")
    name = f"ddplab-sandbox-{secrets.token_hex(4)}"
    try:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "--user-group", name], check=True, capture_output=True, timeout=60)
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


@pytest.fixture
def their_folder(other_user):
    """A folder of the other user's (pytest's own are under root's 0700 folder), outside
    /tmp (which the sandbox replaces with its own)."""
    import shutil
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="ddp-lab-sandbox-test-", dir="/var/tmp"))
    os.chown(folder, other_user.pw_uid, other_user.pw_gid)
    yield folder
    shutil.rmtree(folder)


def test_an_unprivileged_grader_sandboxes_as_itself(their_folder, other_user):
    """Run by a user who is not root, the sandbox runs the command as that user, with
    the same walls: its own files outside the folder are read-only to it, the package
    too, the neighbours hidden, and its processes bounded."""
    uid, gid = other_user.pw_uid, other_user.pw_gid
    base = their_folder / "class"
    (base / "mine").mkdir(parents=True)
    outside = their_folder / "outside.txt"
    outside.write_text("the user's own file, outside the folder")
    for path in (base, base / "mine", outside):
        os.chown(path, uid, gid)
    attack = ATTACK.replace("{OUTSIDE}", str(outside))
    done = subprocess.run([SYSTEM_PYTHON, "-I", "-c", SHIM, str(base / "mine"), attack],
                          user=uid, group=gid, extra_groups=[], cwd="/",
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=120)
    if "unshare" in done.stderr and "refuses" in done.stderr:
        pytest.skip(f"no unprivileged user namespaces here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    report = json.loads(result["stdout"])
    assert report["uid"] == uid and report["neighbours"] == ["mine"], report
    # EROFS (read-only file system) where the user may write, EACCES where it never could
    assert (report["../beside.txt"], report[str(outside)]) == (30, 30), report
    assert report[str(REPO / "README.md")] in (13, 30), report
    assert 10 <= report["bomb"] < 16, report  # its own processes: at most 16, init's aside
    assert outside.read_text().startswith("the user's own file")


# -- where the kernel refuses ------------------------------------------------------------
REFUSING = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
unshared_read, unshared_write = os.pipe()
mapped_read, mapped_write = os.pipe()
child = os.fork()
if child == 0:  # a user namespace (root and nobody mapped) where no further one may be made
    assert libc.unshare(0x10000000) == 0
    os.write(unshared_write, b'u')
    os.read(mapped_read, 1)
    with open('/proc/sys/user/max_user_namespaces', 'w') as setting:
        setting.write('0')
    os.execv({PYTHON!r}, [{PYTHON!r}, '-c', sys.argv[1], sys.argv[2], 'true'])
os.read(unshared_read, 1)
for table in ('uid_map', 'gid_map'):
    with open(f'/proc/{{child}}/{{table}}', 'w') as rows:
        rows.write('0 0 1\\n65534 65534 1\\n')
os.write(mapped_write, b'm')
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


def test_where_user_namespaces_are_refused_the_error_names_the_setting(folders):
    if os.geteuid() != 0:
        pytest.skip("needs root: the refusing user namespace is made by root's maps")
    mine, _ = folders
    done = subprocess.run([PYTHON, "-c", REFUSING, CALLER, str(mine)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith("ddp_lab.grading.sandbox.SandboxUnavailable: unshare() failed"), said
    assert "(the setting user.max_user_namespaces = 0 refuses it)" in said
    assert "kernel.apparmor_restrict_unprivileged_userns=0" in said


# -- ddp_lab inside ----------------------------------------------------------------------
def test_ddp_lab_runs_its_ranks_inside(folders):
    """The launcher nests its own namespaces (user + network) inside the sandbox's: the
    fork server and two gloo ranks run and reduce."""
    mine, _ = folders
    done = python("""
        import torch, torch.distributed as dist
        import ddp_lab

        def total():
            value = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(value)
            return value.item()

        print(ddp_lab.run(total, world_size=2, echo=False).values)
        """, mine, memory_bytes=2 * GIB, max_processes=256)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[3.0, 3.0]", done.stdout


def test_a_daemon_left_behind_dies_with_the_command(folders):
    """The command ends at once, leaving a daemon (a new session, SIGTERM and SIGHUP
    ignored, its output closed): the run ends with the command, and the daemon with it."""
    mine, _ = folders
    start = time.monotonic()
    done = python(SAY_NAMESPACES + """
import os, signal, subprocess, sys
daemon = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "signal.signal(signal.SIGHUP, signal.SIG_IGN); os.close(1); os.close(2); "
          "open('daemon-started', 'w').close(); time.sleep(600)")
subprocess.Popen([sys.executable, '-c', daemon], start_new_session=True)
while not os.path.exists('daemon-started'):
    pass
""", mine)
    assert done.returncode == 0 and not done.timed_out, done
    assert time.monotonic() - start < 20
    assert_namespaces_gone(namespaces_in(done.stdout))


def test_hidden_paths_are_out_of_sight(folders):
    """The grader hides what the world may read but a submission must not: the class's
    other notebooks, the grades (here in a folder under /var/tmp, which the sandbox
    keeps, read-only, unlike /tmp)."""
    import shutil
    import tempfile
    mine, _ = folders
    grades = Path(tempfile.mkdtemp(prefix="ddp-lab-sandbox-test-", dir="/var/tmp"))
    try:
        os.chmod(grades, 0o755)
        (grades / "grades.csv").write_text("someone,10")
        (grades / "other.ipynb").write_text("{}")
        os.chmod(grades / "grades.csv", 0o644)
        done = python(f"""
            import os
            folder = {str(grades)!r}
            print(os.path.isdir(folder), sorted(os.listdir(folder)))
            """, mine, hidden=(grades / "missing",))
        assert done.stdout.strip() == "True ['grades.csv', 'other.ipynb']", done
        done = python(f"print(open({str(grades / 'grades.csv')!r}).read())", mine,
                      hidden=(grades / "grades.csv",))  # covered by /dev/null, unopenable
        assert "PermissionError" in done.stderr and "someone" not in done.stdout, done
        done = python(f"print(sorted(__import__('os').listdir({str(grades)!r})))", mine,
                      hidden=(grades,))
        assert done.stdout.strip() == "[]", done
        with pytest.raises(ValueError, match="it holds"):
            run_sandboxed(["true"], mine, hidden=(mine.parent,), **BUDGET)
    finally:
        shutil.rmtree(grades)


@pytest.mark.parametrize("writer", ["python", "head"])
def test_a_file_past_the_budget_is_stopped(folders, writer):
    """A file may not grow past the memory budget: Python (which ignores SIGXFSZ) is told
    EFBIG, another program is killed by SIGXFSZ."""
    mine, _ = folders
    if writer == "python":
        done = python("""
            with open('big', 'wb') as big:
                for _ in range(512):
                    big.write(bytes(1 << 20))
            """, mine, memory_bytes=256 << 20)
        assert done.returncode == 1 and "File too large" in done.stderr, done
    else:
        done = run_sandboxed(["head", "-c", str(512 << 20), "/dev/zero"], mine,
                             **{**BUDGET, "memory_bytes": 256 << 20})
        assert done.returncode == 0 and len(done.stdout) < 2 << 20  # to stdout: no file
        done = run_sandboxed(["dd", "if=/dev/zero", "of=big", "bs=1M", "count=512"], mine,
                             **{**BUDGET, "memory_bytes": 256 << 20})
        assert done.returncode == -signal.SIGXFSZ, done
    assert done.reason == "wrote a file larger than 256 MiB"
    assert (mine / "big").stat().st_size <= 256 << 20


def test_a_folder_inside_a_folder_only_root_may_enter(folders):
    """Root's grader keeps its work in folders of mode 0700 (mkdtemp's): the sandbox,
    running as nobody, still gets its folder, and nothing else of that private folder."""
    import shutil
    import tempfile
    if os.geteuid() != 0:
        pytest.skip("root's sandbox runs as nobody: that is the case to prove")
    private = Path(tempfile.mkdtemp(prefix="ddp-lab-sandbox-test-", dir="/var/tmp"))
    try:
        (private / "key").write_text("the grader's secret")
        mine = private / "work" / "mine"
        mine.mkdir(parents=True)
        done = python(f"""
            import os
            open('answer', 'w').write('42')
            print(sorted(os.listdir({str(private)!r})), sorted(os.listdir('..')))
            """, mine)
        assert done.stdout.strip() == "['work'] ['mine']", done
        assert (mine / "answer").read_text() == "42"
    finally:
        shutil.rmtree(private)


UNDUMPABLE_PARENT = """
import os, sys
from ddp_lab.grading.checking import undumpable
if sys.argv[1] == "undumpable":
    undumpable()
pid = os.fork()
if pid == 0:  # a rank: the same user, below the checker
    said = []
    for look in (lambda: open(f"/proc/{os.getppid()}/mem", "rb").close(),
                 lambda: os.listdir(f"/proc/{os.getppid()}/fd")):
        try:
            look()
            said.append("opened")
        except PermissionError:
            said.append("denied")
    print(*said, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("mode, said", [("undumpable", "denied denied"),
                                        ("as_is", "opened opened")])
def test_the_checkers_memory_and_output_are_closed_to_its_ranks(folders, mode, said):
    """The grade's checker holds the key that signs results; its ranks run as the same
    user. Made undumpable, its /proc/PID/mem and fd/ are closed to them (the control
    case shows that they are open otherwise)."""
    mine, _ = folders
    done = run_sandboxed([PYTHON, "-c", UNDUMPABLE_PARENT, mode], mine, **BUDGET)
    assert done.stdout.strip() == said, (done.stdout, done.stderr)


def test_a_hidden_path_inside_the_package_checkout_is_out_of_sight(folders):
    """The class lives in the checkout the sandbox needs (it holds ddp_lab). Wherever the
    checkout is (under /tmp, the sandbox binds it back into its fresh /tmp), what the
    grader hides inside it stays hidden."""
    from ddp_lab.grading.sandbox_orders import PACKAGE_HOME
    mine, _ = folders
    inside = PACKAGE_HOME / "tests" / "grading" / "class" / "right"
    done = python(f"import os; print(os.listdir({str(inside)!r}))", mine, hidden=(inside,))
    assert done.stdout.strip() == "[]", done
