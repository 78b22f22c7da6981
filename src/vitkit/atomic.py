"""Atomic file writes (DESIGN.md "Our checkpoint", "A run"): every file vitkit writes goes to a temporary
file in the same directory and is renamed into place, so a crash at any moment leaves either the old
file or the new one, never a torn one; directories made for work that failed are removed again
(`removed_if_left_empty`).  The lowest layer: it imports nothing else of vitkit."""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Call `write(tmp_path)`, then rename the temporary file onto `path` (same directory, so atomic).

    The file gets the permissions `open()` would give it (0o666 less the umask), not mkstemp's private 0o600,
    also where `write` re-creates the file with its own (safetensors writes 0o600).  Its contents reach the disk
    before the rename (a power cut after it could otherwise leave the new name on an empty file).  A full disk
    is an OSError naming `path`, whoever raised it (safetensors' own error names no file).
    """
    path = Path(path)
    tmp = _create_temporary(path)
    try:
        mode = stat.S_IMODE(os.stat(tmp).st_mode)
        write(Path(tmp))
        os.chmod(tmp, mode)
        _flush(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if "No space left on device" in str(error) and not getattr(error, "filename", None):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from error
        raise


NO_FSYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}  # a file system that cannot: no error


def _flush(file: str) -> None:
    """The file's contents written to the disk (fsync), where the platform allows."""
    try:
        fd = os.open(file, os.O_RDWR)  # Windows flushes only a file open for writing
    except PermissionError:  # a umask that leaves the owner no write: POSIX flushes a read-only descriptor too
        fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:  # a full disk or a failed device is an error; a file system without fsync is not
        if error.errno not in NO_FSYNC:
            raise
    finally:
        os.close(fd)


def _create_temporary(path: Path) -> str:
    """A new empty file beside `path`, created exclusively with mode 0o666 (the kernel applies the umask)."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


# The names of the temporaries of atomic_write (.NAME.HEX.tmp) and of a safetensors write (.tmpXXXXXX, Rust's
# tempfile crate): a hidden file of a user's by another name is not vitkit's.
TORN_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp|\.tmp[A-Za-z0-9]{6}")


def remove_torn(directory: str | os.PathLike) -> None:
    """Remove the temporary files writes cut short by a kill left in `directory`: atomic_write's
    (.NAME.HEX.tmp) and those safetensors makes while it writes (.tmpXXXXXX)."""
    directory = Path(directory)
    for torn in list(directory.iterdir()) if directory.is_dir() else []:
        if _torn(torn):
            torn.unlink(missing_ok=True)


def remove_torn_beside(path: str | os.PathLike) -> None:
    """Remove the temporaries of `path` (.NAME.HEX.tmp beside it) that writes of it cut short by a kill left,
    and where `path` is a directory that holds nothing else, those inside it: a re-run then meets what it
    began with (a directory of other files is left as it is)."""
    path = Path(path)
    for torn in path.parent.glob(f".{path.name}.*.tmp") if path.parent.is_dir() else []:
        if _torn(torn):
            torn.unlink(missing_ok=True)
    if path.is_dir() and all(_torn(entry) for entry in path.iterdir()):
        remove_torn(path)


def _torn(entry: Path) -> bool:
    """Whether `entry` is a temporary file of an atomic or a safetensors write, by its name (TORN_NAME)."""
    return TORN_NAME.fullmatch(entry.name) is not None and entry.is_file()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def check_writable(directory: str | os.PathLike) -> None:
    """The OSError that creating a file in `directory` raises (read-only, no permission, not a directory), if
    any: a probe file named as a torn temporary (TORN_NAME), created and removed."""
    probe = Path(directory) / f".write-probe.{secrets.token_hex(6)}.tmp"
    probe.open("x").close()
    probe.unlink()


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (a rename inside it) to disk where the platform allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_HELD: set[int] = set()  # the descriptors of the directory locks this process holds


def _drop_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close its copies of the parent's directory locks, so that a lock
    goes with the process that took it; a killed run's workers had held it for the seconds they outlived it."""
    for descriptor in _HELD:
        with suppress(OSError):
            os.close(descriptor)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def lock_directory(path: str | os.PathLike) -> int | None:
    """An exclusive lock on a directory (flock on the directory itself: no file is left behind, and a killed
    process's lock goes with it): the descriptor that holds it, or None where the platform or the file system
    has no flock.  BlockingIOError where another process holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock
        return None
    descriptor = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise
    except OSError:  # a file system without flock (some network ones): no lock
        os.close(descriptor)
        return None
    _HELD.add(descriptor)
    return descriptor


def unlock_directory(descriptor: int | None) -> None:
    if descriptor in _HELD:  # not in a forked child, which closed its copy and may have reused the number
        _HELD.discard(descriptor)
        os.close(descriptor)  # closing the descriptor releases its flock


@contextmanager
def removed_if_left_empty(path: str | os.PathLike) -> Iterator[None]:
    """Around work that creates the run directory `path`: when the work fails, the directories it created on
    the way to `path` that are still empty are removed, so a run that wrote nothing leaves nothing behind.
    Directories that existed before are left alone, empty or not."""
    target = Path(path).absolute()
    created = [folder for folder in (target, *target.parents) if not folder.exists()]  # deepest first
    try:
        yield
    except BaseException:
        for folder in created:
            with suppress(OSError):  # written to meanwhile, or already gone: keep it, and raise the real error
                if not any(folder.iterdir()):
                    folder.rmdir()
        raise
