"""The file system a sandboxed command sees (stdlib only: imported by sandbox_helper.py,
which runs as ``python -I -S``): the machine's, read-only, with a private /proc, /tmp and
/dev/shm, and its ``folder`` as the one writable place, alone in a parent that hides the
other submissions.

Made in a mount namespace of the sandbox's own, by its init process, which holds every
capability in the sandbox's user namespace until the command is executed (the command has
none). The command can still make namespaces of its own (ddp_lab.run does), but the kernel
copies our mounts into them locked: read-only stays read-only and a mount cannot be
removed to show what lies beneath it ("Restrictions on mount namespaces",
https://man7.org/linux/man-pages/man7/mount_namespaces.7.html).
"""

from __future__ import annotations

import ctypes
import errno
import os

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32  # <sys/mount.h>
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
# The options of a mount that a remount must repeat: in a user namespace the kernel
# refuses a remount that would drop one of them (they are locked).
KEPT_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME,
                "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
FRESH = ("/tmp", "/dev/shm", "/run")  # empty tmpfs mounts of the sandbox's own
# /run holds the machine's Unix sockets (D-Bus, systemd's user managers, Docker's): a
# read-only mount does not stop a connect(), and a service behind one may act for us.
COVER_SIZE = "1m"  # a tmpfs that hides a folder holds only the names of the paths put back

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]


class MountRefused(OSError):
    """A step of building the sandbox's file system failed; the message says which."""


def build(folder: str, kept: int, scratch_bytes: int, needed: dict[str, int],
          hidden: list[str]) -> None:
    """Give this process's (new) mount namespace the sandbox's view. ``folder`` is an
    absolute, resolved path and ``kept`` a descriptor of it, opened in this namespace
    before the change of user (nobody may not reach it by its path); ``needed``: the
    folders the command needs (the Python, the package), with descriptors opened alike;
    ``hidden``: paths to cover; ``scratch_bytes``: the size of each private tmpfs. Runs
    in the new PID namespace (its /proc shows that one)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do reaches the machine's
    for point, options in _mount_points():
        _read_only_at(point, options)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for place in FRESH:
        if os.path.isdir(place):
            tmpfs(place, f"size={scratch_bytes},mode=1777")
    if os.path.isdir("/dev/pts"):  # the machine's terminals, the grader's among them
        mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=620")
    covers = [bind_back(path, descriptor, writable=False)
              for path, descriptor in needed.items()
              if not os.access(path, os.R_OK | os.X_OK)]
    for path in hidden:  # after the binds: a needed folder bound back (the package's
        conceal(path)    # checkout under /tmp) brings back what lies inside it
    covers.append(bind_back(folder, kept, writable=True, alone=True))
    for cover in covers:  # last: folders were made in them until now
        if cover is not None:
            read_only(cover)


def conceal(path: str) -> None:
    """Cover ``path``: a folder with an empty read-only tmpfs, a file with /dev/null;
    nothing where it is not there to be reached (in a fresh tmpfs, unless a needed folder
    was bound back around it)."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path):
        tmpfs(path, "size=4k,mode=755")
    else:
        mount("/dev/null", path, None, MS_BIND)
    read_only(path)


def bind_back(path: str, kept: int, writable: bool, alone: bool = False) -> str | None:
    """Mount the folder open as ``kept`` at ``path`` again, for the sandbox's user to
    reach: under an empty tmpfs over the first of its parents that user cannot enter
    (root's Python under /root, which is 0700), or, if ``alone``, over its own parent
    (other submissions live beside the folder; not needed in a fresh tmpfs). Returns
    that tmpfs's place, to be made read-only once every folder is in."""
    parent = os.path.dirname(path)
    cover = _first_blocked(path) or (parent if alone and not _fresh(parent) else None)
    if cover is not None:
        os.makedirs(cover, exist_ok=True)  # only in a tmpfs of ours: it exists outside
        tmpfs(cover, f"size={COVER_SIZE},mode=755")
    os.makedirs(path, exist_ok=True)
    mount(f"/proc/self/fd/{kept}", path, None, MS_BIND | MS_REC)
    mount(None, path, None,
          MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY))
    return cover


def _first_blocked(path: str) -> str | None:
    """The first folder on the way to ``path`` that this user cannot enter; None if
    there is none, or if the way leads into a tmpfs of ours where it does not exist yet."""
    parts = path.strip("/").split("/")[:-1]
    for place in ("/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)):
        if not os.path.exists(place):
            return None
        if not os.access(place, os.X_OK):
            return place
    return None


def _fresh(path: str) -> bool:
    """Whether ``path`` lies in one of the sandbox's own empty tmpfs mounts."""
    return any(path == place or path.startswith(place + "/") for place in FRESH)


def _read_only_at(point: str, options: int) -> None:
    """Remount the mount at ``point`` read-only; skip one the sandbox's user cannot
    reach by its path (it lies under a folder that user cannot enter, or under another
    mount): the command cannot reach it either."""
    try:
        mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | options)
    except MountRefused as exc:
        if exc.errno not in (errno.EACCES, errno.ENOENT):
            raise


def tmpfs(place: str, options: str) -> None:
    mount("tmpfs", place, "tmpfs", MS_NOSUID | MS_NODEV, options)


def read_only(place: str) -> None:
    """The mount at ``place`` made read-only (the mounts on top of it keep their own)."""
    mount(None, place, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def mount(source: str | None, target: str, kind: str | None, flags: int,
          options: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    if _libc.mount(encode(source), encode(target), encode(kind), flags, encode(options)):
        errno = ctypes.get_errno()
        raise MountRefused(errno, f"mount of {target} ({kind or 'remount/bind'}) failed: "
                                  f"{os.strerror(errno)}")


def _mount_points() -> list[tuple[str, int]]:
    """Each mount point of this namespace once (the top mount of a stack is listed last:
    its options win), with the options a remount must keep."""
    points: dict[str, int] = {}
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            point = _unescape(fields[4])
            points[point] = sum(KEPT_OPTIONS.get(o, 0) for o in fields[5].split(","))
    return list(points.items())


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040...)."""
    for code in ("040", "011", "012", "134"):
        path = path.replace("\\" + code, chr(int(code, 8)))
    return path
