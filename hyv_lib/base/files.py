"""Writing files safely: output folders checked up front, atomic durable writes, and the leftovers of killed writers."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import tempfile
from typing import Iterator

from .errors import HyvInputError

#: A write in progress: ``.NAME.<12 hex>.partial.EXT`` (:func:`atomic_path`) or ensure_output_dir's probe. A process
#: killed with SIGKILL leaves them (no ``finally`` runs); :func:`clean_partials` removes them.
PARTIAL_FILE = re.compile(r"^\..+\.[0-9a-f]{12}\.partial(\.[^./]+)?$|^\.hyv-write-test-")


def ensure_output_dir(path: str, argument: str = "output_dir") -> str:
    """Create ``path`` if needed and check it is writable; a HyvInputError names ``argument`` otherwise."""
    for attempt in range(3):
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path, prefix=".hyv-write-test-"):
                pass
            return path
        except FileNotFoundError:  # removed in between (an empty folder a refused run made): made again
            if attempt < 2:
                continue
            raise HyvInputError(argument, f"cannot write to {path!r}: it keeps vanishing") from None
        except OSError as err:
            raise HyvInputError(argument, f"cannot write to {path!r}: {err.strerror or err}") from None
    return path


def make_folder(path: str) -> bool:
    """Create the folder ``path`` (and its parents) if it does not exist; True when this call created it. mkdir is
    atomic: of runs racing to create the same folder, exactly one gets True. False too when it cannot be made (the
    caller's next write, or :func:`ensure_output_dir`, says why)."""
    if os.path.isdir(path):
        return False
    try:
        os.makedirs(path)
    except OSError:
        return False
    return True


def new_folder(parent: str, prefix: str) -> str:
    """Create a new folder ``parent/<prefix><12 hex>`` and return its path. Its mode is the one the umask gives new
    folders (0755 under umask 022), where :func:`tempfile.mkdtemp`'s is always 0700."""
    while True:
        path = os.path.join(parent, f"{prefix}{secrets.token_hex(6)}")
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue


def umask_modes(folder: str) -> None:
    """Give every file and folder under ``folder`` the mode the umask gives new ones (0644 and 0755 under umask 022),
    whatever their writers chose (safetensors writes 0600 files). The umask is read back from ``folder``'s own mode,
    which :func:`new_folder` made: reading it with os.umask would set it, a race with other threads."""
    folder_mode = os.stat(folder).st_mode & 0o777
    for root, dirs, names in os.walk(folder):
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), folder_mode)
        for name in names:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, folder_mode & 0o666)


def fsync_dir(directory: str) -> None:
    """Flush a folder's entries (a rename or unlink in it) to disk; a no-op where the file system cannot."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:  # some file systems (and Windows shares) do not fsync a directory
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES):
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final_path: str) -> Iterator[str]:
    """Yield a temporary path next to ``final_path``; if the block succeeds, flush it to disk and rename it into place.

    The file is fsynced before the rename and its folder after it, so after a crash or power loss ``final_path`` is
    either the old file or the whole new one. On an exception the temporary file is removed, and an OSError about
    it (ENOSPC, EIO, ...) is raised again naming ``final_path``. A process killed outright leaves the temporary file
    (``.NAME.<hex>.partial.EXT``); :func:`clean_partials` removes those. The temporary name keeps the extension, so
    tools that infer the format from it (ffmpeg) still work.
    """
    directory, base = os.path.split(os.path.abspath(final_path))
    stem, ext = os.path.splitext(base)
    # An exclusive create with mode 0666 gets the process umask applied by the kernel, as any new file does
    # (mkstemp's 0600 would need the umask read back, and reading it means setting it: a race with other threads).
    while True:
        tmp = os.path.join(directory, f".{stem}.{secrets.token_hex(6)}.partial{ext}")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            continue
        except OSError as err:
            raise OSError(err.errno, err.strerror, final_path) from None
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # flushed to disk before the rename, so a crash cannot leave a short file
            os.fsync(f.fileno())
        os.replace(tmp, final_path)
        fsync_dir(directory)  # the rename itself reaches the disk
    except OSError as err:
        if err.filename in (None, tmp):  # the writer's own failure: name the file the caller asked for
            raise OSError(err.errno, err.strerror, final_path) from err
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def clean_partials(directory: str) -> list[str]:
    """Remove the temporary files (:data:`PARTIAL_FILE`) that killed writers left in ``directory``; returns their
    paths. Call it only while no other process writes there (holding the folder's lock: :mod:`hyv_lib.base.lock`),
    or it may remove a write in progress."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        if PARTIAL_FILE.match(name):
            path = os.path.join(directory, name)
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.remove(path)
                removed.append(path)
    if removed:
        fsync_dir(directory)
    return removed
