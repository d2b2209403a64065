"""Harbor's file transfer for the local sandbox (`raygrpo.sandbox.local`): straight through the host directories that
back the sandbox's writable paths (`raygrpo.sandbox.layout.host_path`), else through the sandbox itself (`tar`,
`cat`, Harbor's own `empty_dirs` command). Separate from the sandbox's lifecycle and exec, which it only calls.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePath, PurePosixPath

from harbor.environments.base import ExecResult

from raygrpo.sandbox import layout as _lay
from raygrpo.sandbox import process as _proc
from raygrpo.sandbox.process import TOOL as _TOOL

_log = logging.getLogger(__name__)


class HostFileTransfer:
    """Harbor's `upload_*`, `download_*` and `empty_dirs` for a sandbox whose writable paths are host directories.

    A mixin of `raygrpo.sandbox.local.LocalSandboxEnvironment` (placed before `BaseEnvironment`), which provides what
    these methods use: `_require_running()`, `_host_path(path, writable_only=...)`, `_run(argv, ...)`,
    `_mount_table`, `workdir` and `sandbox_id`.
    """

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file into the sandbox (into `target_path` when it is a directory or ends with `/`)."""
        self._require_running()
        source = Path(source_path)
        host = self._host_path(target_path)
        if host is not None:
            await asyncio.to_thread(_lay.copy_file, source, host, into_dir=target_path.endswith("/"))
            return
        target = _lay.norm(target_path, self.workdir)
        is_dir = target_path.endswith("/") or (await self._run([_TOOL["test"], "-d", str(target)])).return_code == 0
        parent, name = (target, source.name) if is_dir else (target.parent, target.name)
        await self._untar_into(parent, _proc.tar_of([(source, name)]))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy the contents of a host directory into `target_dir` in the sandbox (created if missing)."""
        self._require_running()
        source = Path(source_dir)
        host = self._host_path(target_dir)
        if host is not None:
            await asyncio.to_thread(lambda: shutil.copytree(source, host, symlinks=True, dirs_exist_ok=True))
            return
        items = [(p, p.relative_to(source).as_posix()) for p in source.iterdir()]
        await self._untar_into(_lay.norm(target_dir, self.workdir), _proc.tar_of(items))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a file from the sandbox to a host path (parent directories are created)."""
        self._require_running()
        target = Path(target_path)
        host = self._host_path(source_path, writable_only=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        if host is not None and host.is_file():
            await asyncio.to_thread(shutil.copy2, host, target)
            return
        data = await self._read_back(source_path, [_TOOL["cat"], "--", str(_lay.norm(source_path, self.workdir))])
        await asyncio.to_thread(target.write_bytes, data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy the contents of a sandbox directory into a host directory (overwriting files)."""
        self._require_running()
        target = Path(target_dir)
        host = self._host_path(source_dir, writable_only=False)
        if host is not None and host.is_dir():
            await asyncio.to_thread(lambda: shutil.copytree(host, target, symlinks=True, dirs_exist_ok=True))
            return
        tar = [_TOOL["tar"], "-cf", "-", "-C", str(_lay.norm(source_dir, self.workdir)), "."]
        data = await self._read_back(source_dir, tar)
        await asyncio.to_thread(_proc.extract_tar, data, target)

    async def empty_dirs(self, dirs: Sequence[str | PurePath], *, chmod: bool = True) -> ExecResult | None:
        """Make each of `dirs` an empty directory (Harbor's `empty_dirs`, which every rollout's start runs on the
        verifier's directory): on the host side where the sandbox's own writable directories back them all (no
        process started), else by Harbor's command in the sandbox."""
        self._require_running()
        hosts = [_lay.emptiable_host_dir(self._mount_table, d, self.workdir) for d in dirs]
        if dirs and None not in hosts:
            try:
                await asyncio.to_thread(lambda: [_lay.empty_host_dir(h, chmod=chmod) for h in hosts])
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
