"""A worker of its own user: started by root, the worker drops to an unprivileged account (issue 13).

Run by root, a worker that a candidate took over could read whatever root reads: forge's own
`/proc/<pid>/environ` and memory (non-dumpable stops users, not root), keys and other users' files. So when
forge runs as root, the worker's process gives up root in its preexec, after what needs root is done (the
network namespace, the resource limits: forge.evaluate.sandbox.limits), before Python even starts:
- a mount namespace of its own, where `/proc` is mounted again with `hidepid=invisible` (the worker sees its
  own processes only) and every folder the worker cannot traverse on the way to what it needs (its Python,
  forge, its own folder: say a virtual environment under /root) is covered by an empty tmpfs in which only
  what it needs is shown again, read-only. Files of root's elsewhere stay as root made them: unreadable
  to the worker's user where root made them so;
- then its groups, group and user, and no_new_privs (no setuid program gives root back). The user is, by
  default, one of its own (`unique`): a user and group id no account and no running process has, from
  FORGE_WORKER_UIDS (`START-END`, default 2000000000-2000999999), so that a candidate in one worker cannot
  signal, trace or read another worker's processes (a shared `nobody` could: `hidepid` hides nothing of a
  process of the same user) nor write its files. FORGE_WORKER_USER names an account instead (`nobody`).
The built libraries it loads are copied into a folder of the worker's that it can read and not write
(forge.evaluate.parent.Worker.stage): the build cache is written by forge's process only (its compilers),
and its files and folders are not writable by the worker's user (forge.evaluate.build).
Where the account does not exist, or what the worker needs cannot be shown to it (no mount namespace in a
container without CAP_SYS_ADMIN), the worker runs as forge's user and the parent logs why.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import grp
import logging
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_USER = "unique"  # a user id of its own per worker (fresh_id)
_UIDS = (2_000_000_000, 2_000_999_999)  # FORGE_WORKER_UIDS' default: no distribution gives out ids this high
_claims: dict[int, tuple[int, Path]] = {}  # user id -> the locked descriptor and file that claim it (fresh_id)
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS = 38


@dataclass(frozen=True)
class Drop:
    """What a worker's preexec does to give up root: the account, the folders covered by an empty tmpfs
    (`masks`) and the paths shown again inside them, read-only (`shown`)."""

    uid: int
    gid: int
    user: str
    masks: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()


def account(setting: str | None = None) -> tuple[int, int, str] | None:
    """The (uid, gid, name) a worker runs as when forge runs as root: FORGE_WORKER_USER (`unique`, the default:
    a fresh id for each call, see fresh_id; a user name, `uid` or `uid:gid`); None when forge is not root or
    the setting is `root`. ValueError for an account that does not exist, or no fresh id left."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return None
    value = (os.environ.get("FORGE_WORKER_USER", DEFAULT_USER) if setting is None else setting).strip()
    if value in ("root", "0", "0:0"):
        return None
    if unique_ids(value):
        uid = fresh_id()
        return uid, uid, f"worker-{uid}"
    try:
        if value.replace(":", "").isdigit():
            uid, _, gid = value.partition(":")
            name = _name(int(uid))
            return int(uid), int(gid) if gid else _gid(int(uid)), name
        entry = pwd.getpwnam(value or DEFAULT_USER)
        return entry.pw_uid, entry.pw_gid, entry.pw_name
    except (KeyError, ValueError) as e:
        raise ValueError(f"Invalid FORGE_WORKER_USER: {value!r} (no such account: {e})") from e


def unique_ids(setting: str | None = None) -> bool:
    """Whether FORGE_WORKER_USER (or `setting`) asks for a user id of its own per worker (the default)."""
    value = os.environ.get("FORGE_WORKER_USER", DEFAULT_USER) if setting is None else setting
    return value.strip() in ("", DEFAULT_USER)


def fresh_id() -> int:
    """A user id (and group id) in FORGE_WORKER_UIDS, drawn at random, that no account has, no running process
    uses and no other worker holds: it is claimed by a lock this process holds until release_id (or its
    death), in a folder only root writes. ValueError for a malformed range, or none free found."""
    text = os.environ.get("FORGE_WORKER_UIDS", "").strip()
    try:
        lo, hi = (int(x) for x in text.split("-")) if text else _UIDS
    except ValueError:
        raise ValueError(f"Invalid FORGE_WORKER_UIDS: {text!r} (want START-END, e.g. 2000000000-2000999999)") from None
    if not 0 < lo <= hi < 2**31 - 1:
        raise ValueError(f"Invalid FORGE_WORKER_UIDS: {text!r} (want 0 < START <= END < 2147483647)")
    used = _running_uids()
    for _ in range(256):
        uid = lo + secrets.randbelow(hi - lo + 1)
        if uid not in used and _name(uid) == str(uid) and not _group_exists(uid) and _claim(uid):
            return uid
    raise ValueError(f"Invalid FORGE_WORKER_UIDS: {lo}-{hi} has no user id free of accounts and processes")


def _claim(uid: int) -> bool:
    """Lock `uid` for this process (False: another holds it), in a folder only forge's user (root) may write.
    ValueError when that folder cannot be made, or is not root's alone."""
    folder = Path("/run/forge-workers" if os.access("/run", os.W_OK) else "/tmp/forge-workers")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as e:
        raise ValueError(f"cannot claim worker user ids in {folder}: {e}") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ValueError(f"cannot claim worker user ids in {folder}: not a folder of forge's user alone")
    path = folder / str(uid)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:  # released and removed meanwhile
            raise OSError("claimed a file another release removed")
    except OSError:
        os.close(fd)
        return False
    _claims[uid] = (fd, path)
    return True


def release_id(uid: int) -> None:
    """Give back a user id fresh_id claimed (after its processes are gone: kill_all), with what it left in
    /dev/shm removed (_clear_shared_memory)."""
    _clear_shared_memory(uid)
    claim = _claims.pop(uid, None)
    if claim is not None:
        fd, path = claim
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still locked: whoever opened it meanwhile sees it gone (_claim)
        os.close(fd)


def kill_all(uid: int) -> None:
    """Kill every process of user `uid` (a worker's own: what a candidate left running after its worker was
    stopped, in a session of its own, would otherwise live on as the next candidate's user): a child that has
    become that user sends SIGKILL to every process it may signal (which are that user's alone, itself
    spared), then runs `true` (any program would do: the work is done before it)."""
    try:
        subprocess.run([shutil.which("true") or "/bin/true"], env={}, preexec_fn=functools.partial(_kill_as, uid),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                       timeout=30)
    except (OSError, subprocess.SubprocessError) as e:  # the program missing: the signals were sent before
        log.debug("kill_all(%d): %s", uid, e)


def _kill_as(uid: int) -> None:
    """In kill_all's child: become `uid` (groups, group, user), make sure of it, then kill(-1, SIGKILL). Never as
    root: kill(-1) there would reach every process of the machine."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if uid == 0 or os.getresuid() != (uid, uid, uid):
        raise OSError(f"kill_all: not user {uid}")
    with contextlib.suppress(ProcessLookupError):  # nothing else of that user runs
        os.kill(-1, signal.SIGKILL)


def _clear_shared_memory(uid: int) -> None:
    """Remove what user `uid` left in /dev/shm (a worker's own id, released: its files would use memory, and
    be readable by the next worker given that id)."""
    try:
        entries = list(os.scandir("/dev/shm"))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid == uid:
                os.unlink(entry.path)
        except OSError:
            continue


def process_uids(pid: int | str) -> tuple[int, int] | None:
    """The real and effective user ids of a process, from /proc (Linux); None where they cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith("Uid:"))
        real, effective = line.split()[1:3]
        return int(real), int(effective)
    except (OSError, StopIteration, ValueError):
        return None


def _running_uids() -> set[int]:
    """The real and effective user ids of every process this one sees."""
    return {u for e in os.scandir("/proc") if e.name.isdigit() for u in process_uids(e.name) or ()}


def _group_exists(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def drop_for(want: bool, root: Path, scratch: Path, needs: list[str]) -> tuple[Drop | str, int | None]:
    """A worker's Drop (its folder `root` made reachable, its `scratch` made its user's, what it `needs` shown
    to it: plan), or why it keeps forge's user ("" where forge is not root); with the user id of its own it
    claimed (fresh_id), which the caller gives back with release_id, or None."""
    who = account() if want else None
    if who is None:
        return ("forge runs as root and the worker keeps it (FORGE_WORKER_USER=root, or a CUDA worker with "
                "FORGE_CUDA_SANDBOX=0)" if os.geteuid() == 0 else ""), None
    uid, gid, user = who
    own = uid if unique_ids() else None
    try:
        os.chmod(root, 0o711)  # the worker reaches its folders, lists none of forge's (worker.log)
        os.chown(scratch, uid, gid)
        found = plan(uid, gid, user, needed_paths(needs))
    except BaseException:
        if own is not None:
            release_id(own)
        raise
    if isinstance(found, str):
        log.warning("a worker keeps root: %s", found)
        if own is not None:
            release_id(own)
            own = None
    return found, own


def needed_paths(extra: Iterable[str] = ()) -> list[str]:
    """What a worker reads to start and run: its interpreter, the prefixes, every folder on sys.path and
    PYTHONPATH, CUDA's home, LD_LIBRARY_PATH, and `extra` (forge's checkout, the worker's folder)."""
    found = [sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path,
             *os.environ.get("PYTHONPATH", "").split(os.pathsep), *os.environ.get("LD_LIBRARY_PATH", "").split(
                 os.pathsep), os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), *extra]
    paths = []
    for p in found:
        if p and os.path.exists(p):
            real = os.path.realpath(p)
            if real not in paths:
                paths.append(real)
    return paths


def _may(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Whether (uid, gid) has `bits` (0o4 read, 0o1 search) on a file, by its owner, group and other bits."""
    shift = 6 if st.st_uid == uid else 3 if st.st_gid == gid else 0
    return (st.st_mode >> shift) & bits == bits


def plan(uid: int, gid: int, user: str, paths: Iterable[str]) -> Drop | str:
    """The Drop that shows every path to (uid, gid): each folder it cannot traverse above a path is masked
    and the path shown again inside; a reason (a string) when a path cannot be shown so."""
    masks: list[str] = []
    shown: list[str] = []
    for path in paths:
        parts = Path(path).parts
        blocked = None
        for i in range(1, len(parts)):
            above = str(Path(*parts[:i]))
            if not _may(os.stat(above), uid, gid, 0o1):
                blocked = above
                break
        st = os.stat(path)
        if not _may(st, uid, gid, 0o5 if stat.S_ISDIR(st.st_mode) else 0o4):
            return f"{path} is not readable by {user}"
        if blocked is None:
            continue
        if blocked == "/":
            return f"/ is not searchable by {user}"
        if not any(_inside(blocked, m) for m in masks):
            masks = [m for m in masks if not _inside(m, blocked)] + [blocked]
        shown.append(path)
    kept = sorted({p for p in shown if not any(q != p and _inside(p, q) for q in shown)})
    for p in shown:  # a path inside one shown again is reached through that one's own folders
        outer = next((q for q in kept if _inside(p, q)), p)
        for i in range(len(Path(outer).parts) + 1, len(Path(p).parts)):
            if not _may(os.stat(Path(*Path(p).parts[:i])), uid, gid, 0o1):
                return f"{Path(*Path(p).parts[:i])} is not searchable by {user}"
    return Drop(uid, gid, user, tuple(sorted(masks)), tuple(kept))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _enc(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc().mount(_enc(source), _enc(target), _enc(fstype), ctypes.c_ulong(flags), _enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def apply(drop: Drop) -> None:
    """In a worker's preexec, as root: a mount namespace with the masks and shown paths (see the module doc),
    /proc again with hidepid, then the account and no_new_privs. Raises OSError where a step fails (the
    parent starts the worker again without the drop)."""
    if _libc().unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing of this namespace reaches forge's
    try:  # other processes out of sight (best effort: some containers refuse a new procfs)
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=invisible")
    except OSError:
        pass
    fds = [os.open(p, os.O_PATH) for p in drop.shown]  # reached before the masks hide them
    for m in drop.masks:
        _mount("tmpfs", m, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    for p, fd in zip(drop.shown, fds, strict=True):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(p, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o444))
        _mount(f"/proc/self/fd/{fd}", p, None, _MS_BIND | _MS_REC)
        _mount(None, p, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        os.close(fd)
    os.setgroups([])
    os.setresgid(drop.gid, drop.gid, drop.gid)
    os.setresuid(drop.uid, drop.uid, drop.uid)
    if _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
