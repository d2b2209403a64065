"""Host-side reads and writes of folders a sandbox controls, without ever following a link in them.

A sandbox's writable folders (the local backend's `<sandbox root>/<id>/fs/...`) and what is downloaded from a sandbox
(Harbor's trial dirs, `/logs` kept for a rollout) hold whatever the model put there, symlinks included. A host process
that writes or reads through such a link acts on a host path of the model's choosing: uploading the task's tests
through a planted `/tests/test.sh -> /host/file` overwrote that host file (and left the model's script to be run as
the test), and reading a downloaded `agent/env.txt -> /proc/self/environ` put the env pool's own environment (its API
keys) into the trajectory.

So every step here is relative to an open directory and refuses links (`O_NOFOLLOW`, `dir_fd=`, `lstat`): a
component is opened, never looked up again by path, so a process in the sandbox that swaps a directory for a link
between the host's check and its write gains nothing. A link where a folder is on the way raises `LinkRefused` (the
caller then goes through the sandbox, which sees it as the sandbox's own link); a file written over a link replaces
the link, as `docker cp` does. Only the base directory (the mount's source, a folder the
host made and the sandbox cannot rename: it is a mount point there) is opened by path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: How often a write retries when the sandbox puts something back at its name between removal and creation.
_RETRIES = 8


class LinkRefused(OSError):
    """A path that a host read would have to follow a link (or a non-directory) to reach."""


def open_dir(base: str | os.PathLike, parts: Sequence[str] = (), *, create: bool = False) -> int:
    """An fd of the directory `base/parts...`, each component opened without following a link.

    With `create`, a missing component is made (mode 0755). A component that is a link or not a directory raises
    `LinkRefused` (the caller goes through the sandbox instead, which resolves it as the sandbox sees it); a missing
    one without `create`, FileNotFoundError. The caller closes the fd.
    """
    fd = os.open(base, _DIR_FLAGS)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise LinkRefused(errno.EINVAL, f"refusing path component {part!r} under {base}")
            child = _open_child_dir(fd, part, create=create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child_dir(fd: int, name: str, *, create: bool) -> int:
    for _ in range(_RETRIES):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise LinkRefused(exc.errno, f"{name} is a link or not a directory") from None
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=fd)
    raise LinkRefused(errno.EAGAIN, f"{name} kept changing while the host made it a directory")


def remove_entry(fd: int, name: str) -> None:
    """Remove `name` in the directory `fd` whatever it is (a directory with its contents; a link itself, never what
    it points at). Missing is fine."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=fd)  # fd-based on Linux: never follows a link below it
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)


def write_file(fd: int, name: str, source: str | os.PathLike) -> None:
    """Copy the host file `source` to `name` in the directory `fd` (mode and times as `shutil.copy2`); what is at
    `name` is removed first, and the new file is created exclusively, so no link the sandbox puts there is
    followed."""
    with open(source, "rb") as src:
        st = os.fstat(src.fileno())
        for _ in range(_RETRIES):
            remove_entry(fd, name)
            try:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o600, dir_fd=fd)
                break
            except FileExistsError:
                continue
        else:
            raise LinkRefused(errno.EAGAIN, f"{name} kept reappearing while the host wrote it")
        try:
            with open(out, "wb", closefd=False) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)


def copy_tree(source: str | os.PathLike, fd: int) -> None:
    """Copy the contents of the host directory `source` into the directory `fd` (merging, files overwritten; links
    in `source` copied as links, as `copytree(symlinks=True)`), never following a link in the target: a file's
    name taken by a link is replaced; a folder's raises `LinkRefused`."""
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.is_symlink():
                for _ in range(_RETRIES):
                    remove_entry(fd, entry.name)
                    with contextlib.suppress(FileExistsError):
                        os.symlink(os.readlink(entry.path), entry.name, dir_fd=fd)
                        break
            elif entry.is_dir():
                child = _open_child_dir(fd, entry.name, create=True)
                try:
                    copy_tree(entry.path, child)
                    os.fchmod(child, stat.S_IMODE(entry.stat().st_mode))
                finally:
                    os.close(child)
            else:
                write_file(fd, entry.name, entry.path)


def empty_dir(fd: int, name: str, *, chmod: bool) -> None:
    """Make `name` in the directory `fd` an empty directory (a file there removed; the links inside removed, not
    followed), with `chmod` of mode 0777: what Harbor's `empty_dirs` command does in a sandbox. A link at `name`
    raises `LinkRefused`."""
    try:
        child = _open_child_dir(fd, name, create=True)
    except LinkRefused:
        if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            raise  # the sandbox's link: the caller empties it there, as the sandbox sees it
        remove_entry(fd, name)  # a file where the folder goes
        child = _open_child_dir(fd, name, create=True)
    try:
        for entry in os.listdir(child):
            remove_entry(child, entry)
        if chmod:
            os.fchmod(child, 0o777)
    finally:
        os.close(child)


def read_file(path: str | os.PathLike, *, dir_fd: int | None = None, max_bytes: int | None = None,
              tail: bool = False) -> bytes | None:
    """The bytes of the regular file `path` (relative to `dir_fd` when given), or None when it is missing, a link,
    or not a regular file (a fifo, a device). The last component is opened with `O_NOFOLLOW`; the folders above it
    are the caller's (see `regular_files`, `open_dir`). With `max_bytes`, at most that many bytes: the first, or
    with `tail` the last."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if max_bytes is not None and tail and st.st_size > max_bytes:
            f.seek(st.st_size - max_bytes)
        return f.read() if max_bytes is None else f.read(max_bytes)


def copy_out(fd: int, target: Path) -> None:
    """Copy the directory `fd` (a sandbox's) into the host folder `target` (made if missing; files overwritten):
    regular files and folders only, each opened relative to its parent without following a link; links and
    special files are left out, so no reader of the copy can be led to a host path."""
    target.mkdir(parents=True, exist_ok=True)
    with os.scandir(fd) as entries:
        listed = list(entries)
    for entry in listed:
        name = entry.name
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # swapped for a link (or removed) since it was listed
            try:
                copy_out(child, target / name)
            finally:
                os.close(child)
        else:
            data = read_file(name, dir_fd=fd)
            if data is not None:
                dest = target / name
                if dest.is_symlink() or dest.is_dir():
                    _remove_path(dest)
                dest.write_bytes(data)


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def regular_files(root: str | os.PathLike) -> Iterator[Path]:
    """The regular files under `root` (not following links, neither to files nor to folders), sorted per folder."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    yield path


def drop_links(root: str | os.PathLike) -> list[str]:
    """Remove every symlink under `root` (what a download from a sandbox brought, which a later reader would follow
    to a host path); the paths removed, relative to `root`."""
    removed: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                os.unlink(path)
                removed.append(os.path.relpath(path, root))
    return removed
