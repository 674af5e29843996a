"""One run per folder: advisory locks (flock) on output folders, naming their holder, released when a process dies."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import glob
import json
import os
import socket
import threading
import time
from typing import Any, Iterator

from .errors import HyvInputError

#: The lock file of a folder. It holds its holder (pid, host, start time) while a run holds it exclusively, and is
#: removed when the run ends; one a killed run left behind is stale (nobody holds its lock) and taken over.
LOCK_FILE = ".hyv.lock"

_held: dict[tuple[str, int], list[Any]] = {}  # (lock path, thread) -> [fd, depth]: a thread may nest its own lock
_held_guard = threading.Lock()


class FolderInUseError(HyvInputError):
    """A folder another live run holds (:func:`folder_lock`); ``holders``: what their lock files say."""

    def __init__(self, argument: str, folder: str, holders: list[dict[str, Any]]):
        self.folder, self.holders = folder, holders
        who = "; ".join(describe(h) for h in holders) or "holder unknown"
        super().__init__(argument, f"{folder!r} is in use by another run ({who}); wait for it to finish, or choose "
                                   "another folder")


def describe(holder: dict[str, Any]) -> str:
    """One line for a lock file's holder: ``pid 123 on host h since 2026-11-26T19:00:00+00:00`` (and its part)."""
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('started', '?')}"
    return f"{text}, {holder['part']}" if holder.get("part") else text


def read_holder(path: str) -> dict[str, Any]:
    """What the lock file at ``path`` says of its holder ({} if empty, absent or unreadable)."""
    try:
        with open(path) as f:
            data = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_held(path: str) -> bool:
    """Whether a live process holds the lock file at ``path`` (a probe: takes and drops a shared lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _open_locked(path: str, shared: bool, wait: bool) -> int | None:
    """The fd of ``path`` locked (created if absent, with its folder), or None if another process holds it. A lock
    file unlinked by its last holder between our open and our lock is a dead inode: retried on the new one."""
    for attempt in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # its folder was removed since (an empty one a failed run made): made again
            if attempt == 99:
                raise
            os.makedirs(os.path.dirname(path), exist_ok=True)
            continue
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise FileNotFoundError(errno.ENOENT, "the lock file keeps vanishing", path)


def _release(path: str, fd: int, shared: bool) -> None:
    """Remove the lock file if no one else holds it (an exclusive holder always; the last shared one), then unlock."""
    try:
        if shared:  # upgrade without waiting: succeeds only for the last holder (a failed upgrade drops ours anyway)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                os.remove(path)
    finally:
        os.close(fd)  # closing the last fd of the open file drops its flock


@contextlib.contextmanager
def folder_lock(folder: str, argument: str = "output_dir", name: str = LOCK_FILE, shared: bool = False,
                wait: bool = False, part: str | None = None) -> Iterator[str]:
    """Hold the lock file ``folder/name`` (created with the folder if absent) for the block; yields its path.

    Exclusive by default: the holder writes its pid, host, start time (and ``part``, e.g. ``shard 1/4``) into the
    file, and a second run gets :class:`FolderInUseError` (a HyvInputError naming ``argument``, the folder and the
    holder) at once, or with ``wait`` blocks until the lock is free. ``shared``: any number of shared holders at a
    time, none while an exclusive one holds it (they write nothing into it). The lock is fcntl's ``flock``: the
    operating system drops it when the process ends, however it ends, so a killed run never blocks the next one; it
    is advisory (only hyv_lib's runs honour it) and, on NFS, as good as the server's locking. The same thread
    taking a lock it already holds nests (a run's outer and inner steps); another thread of the same process is
    another run.
    """
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(os.path.abspath(folder), name)
    key = (path, threading.get_ident())
    with _held_guard:
        if key in _held:
            _held[key][1] += 1
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield path
        finally:
            with _held_guard:
                _held[key][1] -= 1
        return
    fd = _open_locked(path, shared, wait)
    if fd is None:  # the exclusive holder wrote itself in; shared holders (shards) are in their own lock files
        raise FolderInUseError(argument, folder, _holders(path, folder))
    try:
        if shared:
            holder = {}
        else:
            holder = dict(pid=os.getpid(), host=socket.gethostname(),
                          started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
            if part:
                holder["part"] = part
        with contextlib.suppress(OSError):  # the holder's note is for messages: a full disk does not stop the lock
            os.ftruncate(fd, 0)  # shared holders clear what a dead exclusive holder wrote
            if holder:
                os.pwrite(fd, json.dumps(holder).encode(), 0)
        with _held_guard:
            _held[key] = [fd, 1]
        try:
            yield path
        finally:
            with _held_guard:
                del _held[key]
    finally:
        _release(path, fd, shared)


def _holders(path: str, folder: str, patience_s: float = 1.0) -> list[dict[str, Any]]:
    """Who holds ``path`` (its own note, else the live lock files of ``folder``). A holder writes its note right
    after it takes the lock: a run refused in between waits up to ``patience_s`` for it, to name its pid."""
    deadline = time.monotonic() + patience_s
    while True:
        holders = [h for h in [read_holder(path)] if h] or live_holders(folder)
        if holders or time.monotonic() > deadline:
            return holders
        time.sleep(0.02)


def live_holders(folder: str, pattern: str = ".hyv*.lock") -> list[dict[str, Any]]:
    """The holders written in the lock files of ``folder`` that a live process holds."""
    paths = sorted(glob.glob(os.path.join(glob.escape(os.path.abspath(folder)), pattern)))
    return [h for h in (read_holder(p) for p in paths if is_held(p)) if h]
