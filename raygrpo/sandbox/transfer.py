"""Harbor's file transfer for the local sandbox (`raygrpo.sandbox.local`): straight through the host directories that
back the sandbox's writable paths (`raygrpo.sandbox.layout.host_path`), else through the sandbox itself (`tar`,
`cat`, Harbor's own `empty_dirs` command). Separate from the sandbox's lifecycle and exec, which it only calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import Sequence
from pathlib import Path, PurePath, PurePosixPath

from harbor.environments.base import ExecResult

from raygrpo.core import nofollow as _nf
from raygrpo.sandbox import layout as _lay
from raygrpo.sandbox import process as _proc
from raygrpo.sandbox.process import TOOL as _TOOL

_log = logging.getLogger(__name__)


class HostFileTransfer:
    """Harbor's `upload_*`, `download_*` and `empty_dirs` for a sandbox whose writable paths are host directories.

    A mixin of `raygrpo.sandbox.local.LocalSandboxEnvironment` (placed before `BaseEnvironment`), which provides what
    these methods use: `_require_running()`, `_host_parts(path, writable_only=...)`, `_run(argv, ...)`,
    `_mount_table`, `workdir` and `sandbox_id`.
    """

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file into the sandbox (into `target_path` when it is a directory or ends with `/`).

        Written on the host side without following a link the sandbox planted (`raygrpo.core.nofollow`): a link at
        the file's name is replaced, as `docker cp` does; one on the way sends the upload through the sandbox."""
        self._require_running()
        source = Path(source_path)
        found = self._host_parts(target_path)
        if found is not None and await asyncio.to_thread(_write_file, source, *found,
                                                         into_dir=target_path.endswith("/")):
            return
        target = _lay.norm(target_path, self.workdir)
        is_dir = target_path.endswith("/") or (await self._run([_TOOL["test"], "-d", str(target)])).return_code == 0
        parent, name = (target, source.name) if is_dir else (target.parent, target.name)
        await self._untar_into(parent, _proc.tar_of([(source, name)]))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy the contents of a host directory into `target_dir` in the sandbox (created if missing), on the host
        side without following a link the sandbox planted (a planted `/tests/test.sh -> /host/file` is replaced,
        not written through)."""
        self._require_running()
        source = Path(source_dir)
        found = self._host_parts(target_dir)
        if found is not None and await asyncio.to_thread(_copy_dir, source, *found):
            return
        items = [(p, p.relative_to(source).as_posix()) for p in source.iterdir()]
        await self._untar_into(_lay.norm(target_dir, self.workdir), _proc.tar_of(items))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a file from the sandbox to a host path (parent directories are created). A link in the sandbox is
        read as the sandbox sees it (through `cat` there), never followed on the host."""
        self._require_running()
        target = Path(target_path)
        found = self._host_parts(source_path, writable_only=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = await asyncio.to_thread(_read_file, *found) if found is not None else None
        if data is None:
            data = await self._read_back(source_path, [_TOOL["cat"], "--", str(_lay.norm(source_path, self.workdir))])
        await asyncio.to_thread(target.write_bytes, data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy the contents of a sandbox directory into a host directory (overwriting files). Links are not
        brought over (on either path): a host reader of the copy would follow them to the host's files."""
        self._require_running()
        target = Path(target_dir)
        found = self._host_parts(source_dir, writable_only=False)
        if found is not None and await asyncio.to_thread(_download_dir, *found, target):
            return
        tar = [_TOOL["tar"], "-cf", "-", "-C", str(_lay.norm(source_dir, self.workdir)), "."]
        data = await self._read_back(source_dir, tar)
        await asyncio.to_thread(_proc.extract_tar, data, target)
        await asyncio.to_thread(_nf.drop_links, target)

    async def empty_dirs(self, dirs: Sequence[str | PurePath], *, chmod: bool = True) -> ExecResult | None:
        """Make each of `dirs` an empty directory (Harbor's `empty_dirs`, which every rollout's start runs on the
        verifier's directory): on the host side where the sandbox's own writable directories back them all (no
        process started), else by Harbor's command in the sandbox."""
        self._require_running()
        hosts = [_lay.emptiable_host_dir(self._mount_table, d, self.workdir) for d in dirs]
        if dirs and None not in hosts:
            try:
                await asyncio.to_thread(lambda: [_empty_dir(*h, chmod=chmod) for h in hosts])
                return ExecResult(return_code=0)
            except OSError as exc:
                _log.debug("sandbox %s: emptying %s on the host failed (%s); in the sandbox instead",
                           self.sandbox_id, [str(d) for d in dirs], exc)
        return await super().empty_dirs(dirs, chmod=chmod)

    async def _read_back(self, what: str, argv: list[str]) -> bytes:
        """The stdout of `argv` run in the sandbox; FileNotFoundError (naming `what`) when it fails."""
        rc, data, err = await self._run(argv, binary_stdout=True)
        if rc != 0:
            raise FileNotFoundError(f"cannot download {what} from sandbox {self.sandbox_id}: {err}")
        return data

    async def _untar_into(self, parent: PurePosixPath, data: bytes) -> None:
        result = await self._run(
            [_TOOL["sh"], "-c", f"mkdir -p {shlex.quote(str(parent))} && tar -xf - -C {shlex.quote(str(parent))}"],
            stdin_data=data,
        )
        if result.return_code != 0:
            raise RuntimeError(
                f"cannot write into {parent} in sandbox {self.sandbox_id} (only the sandbox's own directories are "
                f"writable; the host's are read-only): {result.stderr or result.stdout}"
            )


def _write_file(source: Path, base: Path, parts: tuple[str, ...], *, into_dir: bool) -> bool:
    """Copy the host file `source` to `base/parts...`, or into it when that is a directory (or `into_dir`); the
    folders on the way are opened without following links (made where missing). False (nothing written) when one
    of them is a link: the caller goes through the sandbox."""
    try:
        if not parts:
            into_dir = True
        elif not into_dir:
            with contextlib.suppress(OSError):
                os.close(_nf.open_dir(base, parts))
                into_dir = True  # an existing directory (not a link to one)
        dir_parts, name = (parts, source.name) if into_dir else (parts[:-1], parts[-1])
        fd = _nf.open_dir(base, dir_parts, create=True)
    except _nf.LinkRefused:
        return False
    try:
        _nf.write_file(fd, name, source)
    finally:
        os.close(fd)
    return True


def _copy_dir(source: Path, base: Path, parts: tuple[str, ...]) -> bool:
    """Copy the contents of the host directory `source` into `base/parts...` (see `_write_file`); False when a link
    is on the way (what was copied before it is copied again through the sandbox)."""
    try:
        fd = _nf.open_dir(base, parts, create=True)
    except _nf.LinkRefused:
        return False
    try:
        _nf.copy_tree(source, fd)
    except _nf.LinkRefused:
        return False
    finally:
        os.close(fd)
    return True


def _read_file(base: Path, parts: tuple[str, ...]) -> bytes | None:
    """The bytes of the regular file `base/parts...`, None when a link (or anything but a regular file and
    directories) is on the way: the caller then reads it through the sandbox."""
    if not parts:
        return None
    try:
        fd = _nf.open_dir(base, parts[:-1])
    except OSError:
        return None
    try:
        return _nf.read_file(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def _download_dir(base: Path, parts: tuple[str, ...], target: Path) -> bool:
    """Copy the directory `base/parts...` into the host folder `target`, without its links
    (`nofollow.copy_out`); False (nothing copied) when the directory cannot be reached without following one."""
    try:
        fd = _nf.open_dir(base, parts)
    except OSError:
        return False
    try:
        _nf.copy_out(fd, target)
    finally:
        os.close(fd)
    return True


def _empty_dir(base: Path, parts: tuple[str, ...], *, chmod: bool) -> None:
    """Harbor's `empty_dirs` for `base/parts...`, on the host side, following no link (`nofollow.empty_dir`)."""
    if not parts:
        fd = _nf.open_dir(base)
        try:
            for name in os.listdir(fd):
                _nf.remove_entry(fd, name)
            if chmod:
                os.fchmod(fd, 0o777)
        finally:
            os.close(fd)
        return
    fd = _nf.open_dir(base, parts[:-1], create=True)
    try:
        _nf.empty_dir(fd, parts[-1], chmod=chmod)
    finally:
        os.close(fd)
