"""The host side of a local sandbox's filesystem: its mount table, and where sandbox paths live on the host.

A sandbox (`raygrpo.sandbox.local`) sees the host's system directories read-only and its own writable directories,
which are host directories under `<sandbox root>/<id>/fs/`. This module computes that mount table (`layout`), turns
it into bubblewrap's arguments (`bwrap_argv`), maps sandbox paths to the host paths backing them (`host_path`), and
writes a Dockerfile's `COPY` files straight into the host side (`copy_into`). It starts no process.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from raygrpo.sandbox import dockerfile as _df
from raygrpo.sandbox import hidden as _hidden
from raygrpo.sandbox.dockerfile_copy import CopyStep, sandbox_path

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"

#: Host directories a sandbox sees read-only.
EXPOSED_DIRS = ("usr", "etc", "opt", "var", "srv")
#: Top-level entries that are usually symlinks into /usr on merged-/usr systems.
LINK_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Directories every sandbox gets writable (Harbor's paths, the usual task dirs, the homes and /tmp).
STANDARD_WRITABLE = ("/workdir", "/app", "/logs", "/tests", "/solution", "/home/user", "/root", "/tmp")
_LOG_SUBDIRS = ("agent", "verifier", "artifacts")


class CopyError(ValueError):
    """A Dockerfile `COPY` destination that is not writable in the sandbox."""


@dataclass(frozen=True)
class Mount:
    target: PurePosixPath
    kind: str  # "ro" | "rw" | "tmpfs" | "proc" | "dev" | "symlink"
    source: Path | None = None
    link: str | None = None
    optional: bool = False  # bind only if the source still exists (entries bound back into a shadow)


def under(p: PurePosixPath, q: PurePosixPath) -> bool:
    """Whether `p` is `q` or below it (both normalized absolute paths; compared by parts: `q in p.parents` builds
    every parent path and costs a sandbox start milliseconds)."""
    qp = q.parts
    return p.parts[: len(qp)] == qp


def norm(path: str | PurePosixPath, base: str | None = None) -> PurePosixPath:
    return sandbox_path(str(path), base or "/")


def prepare_host_dir(
    d: Path,
    *,
    plan: _df.DockerfilePlan | None,
    task_workdir: str | None,
    extra_writable: list[str],
    host_mounts: list[dict[str, Any]] | None,
    workdir: str,
    hidden: Iterable[str | os.PathLike] = (),
) -> list[Mount]:
    """Fill a sandbox's fresh host directory `d` (`fs/`, the writable mounts with Harbor's log dirs and a
    sticky `/tmp`, the Dockerfile's `COPY` files) and return its mount table (see `layout`).

    Raises:
        CopyError: a `COPY` destination is not writable.
    """
    fs = d / "fs"
    fs.mkdir()
    mounts = layout(
        fs, plan=plan, task_workdir=task_workdir, extra_writable=extra_writable, host_mounts=host_mounts,
        hidden=hidden,
    )
    for sub in _LOG_SUBDIRS:
        host = host_path(mounts, PurePosixPath("/logs") / sub, workdir)
        if host is not None:
            host.mkdir(parents=True, exist_ok=True)
            os.chmod(host, 0o777)
    for path in ("/tmp",):
        host = host_path(mounts, PurePosixPath(path), workdir)
        if host is not None:
            os.chmod(host, 0o1777)
    for step in plan.copies if plan is not None else []:
        dest = host_path(mounts, step.dest, workdir)
        if dest is None:
            raise CopyError(f"{plan.path}:{step.line}: cannot write {step.dest}")
        copy_into(dest, step)
    return mounts


def layout(
    fs: Path,
    *,
    plan: _df.DockerfilePlan | None,
    task_workdir: str | None,
    extra_writable: list[str],
    host_mounts: list[dict[str, Any]] | None,
    hidden: Iterable[str | os.PathLike] = (),
) -> list[Mount]:
    """The sandbox's mount table, in the order bwrap applies it; creates the host side of writable mounts.

    Writable: `STANDARD_WRITABLE`, the plan's `WORKDIR` and `COPY` destinations, `task_workdir`, `extra_writable`
    and the targets of the (bind) `host_mounts`, whose sources are bound there. Not seen: the host's secrets in the
    exposed trees and the `hidden` folders (`raygrpo.sandbox.hidden`), covered empty; a later mount covers an
    earlier one, so the covers come before the writable directories (one inside a covered folder is the sandbox's
    own) and again after the shadows, whose entries bound back would show them.
    """
    mounts: list[Mount] = [Mount(PurePosixPath("/"), "tmpfs")]
    for name in EXPOSED_DIRS:
        if os.path.isdir(f"/{name}"):
            mounts.append(Mount(PurePosixPath(f"/{name}"), "ro", Path(f"/{name}")))
    for name in LINK_DIRS:
        p = f"/{name}"
        if os.path.islink(p):
            mounts.append(Mount(PurePosixPath(p), "symlink", link=os.readlink(p)))
        elif os.path.isdir(p):
            mounts.append(Mount(PurePosixPath(p), "ro", Path(p)))
    mounts += [
        Mount(PurePosixPath("/sys"), "ro", Path("/sys")),
        Mount(PurePosixPath("/proc"), "proc"),
        Mount(PurePosixPath("/dev"), "dev"),
        Mount(PurePosixPath("/dev/shm"), "tmpfs"),
        Mount(PurePosixPath("/run"), "tmpfs"),
    ]
    if os.path.isdir("/var/tmp"):
        mounts.append(Mount(PurePosixPath("/var/tmp"), "tmpfs"))
    covers = _hide_mounts(fs, hidden)
    mounts += covers

    user_mounts = [m for m in (host_mounts or []) if m.get("type") == "bind"]
    wanted: list[PurePosixPath] = [PurePosixPath(p) for p in STANDARD_WRITABLE]
    if plan is not None:
        wanted += plan.writable_dirs()
    if task_workdir:
        wanted.append(norm(task_workdir))
    wanted += [norm(p) for p in extra_writable]
    wanted += [norm(m["target"]) for m in user_mounts]
    wanted = [resolve_links(p, mounts) for p in wanted]
    for p in wanted:
        if p.parts[1:2] and p.parts[1] in ("proc", "sys", "dev"):
            raise ValueError(f"cannot make {p} writable in the local sandbox")
    roots: list[PurePosixPath] = []
    for p in sorted(set(wanted), key=lambda q: (len(q.parts), str(q))):
        if p != PurePosixPath("/") and not any(under(p, r) for r in roots):
            roots.append(p)

    def covering(p: PurePosixPath) -> Mount:
        best = mounts[0]
        for m in mounts:
            if m.kind != "symlink" and under(p, m.target) and len(m.target.parts) >= len(best.target.parts):
                best = m
        return best

    def host_of(p: PurePosixPath) -> Path | None:
        m = covering(p)
        if m.source is None:
            return None
        return m.source.joinpath(*p.parts[len(m.target.parts) :])

    # Writable roots inside a read-only host tree need a shadow of their deepest existing ancestor: a writable
    # copy whose existing entries are bound back read-only. Shallow shadows first, so deeper ones stack on top.
    shadows: set[PurePosixPath] = set()
    for p in roots:
        if covering(p).kind not in ("ro",):
            continue
        a = p
        while a != PurePosixPath("/"):
            h = host_of(a)
            if h is not None and h.is_dir() and not h.is_symlink():
                break
            a = a.parent
        if a == PurePosixPath("/"):
            raise ValueError(f"cannot make {p} writable in the local sandbox")
        shadows.add(a)
    for a in sorted(shadows, key=lambda q: (len(q.parts), str(q))):
        src = host_of(a)
        assert src is not None
        dst = fs.joinpath(*a.parts[1:])
        dst.mkdir(parents=True, exist_ok=True)
        children: list[Mount] = []
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            target = dst / entry.name
            if entry.is_symlink():
                if not target.is_symlink():
                    os.symlink(os.readlink(entry.path), target)
            elif entry.is_dir():
                target.mkdir(exist_ok=True)
                children.append(Mount(a / entry.name, "ro", Path(entry.path), optional=True))
            elif entry.is_file():
                target.touch(exist_ok=True)
                children.append(Mount(a / entry.name, "ro", Path(entry.path), optional=True))
        shutil.copymode(src, dst)
        mounts.append(Mount(a, "rw", dst))
        mounts.extend(children)
    if shadows:
        mounts += covers
    for p in roots:
        m = covering(p)
        if m.kind == "rw":
            host = host_of(p)
            assert host is not None
            host.mkdir(parents=True, exist_ok=True)
        elif m.kind == "tmpfs":
            host = fs.joinpath(*p.parts[1:])
            host.mkdir(parents=True, exist_ok=True)
            mounts.append(Mount(p, "rw", host))
        else:
            raise ValueError(f"cannot make {p} writable in the local sandbox (under {m.target})")
    # Wanted directories inside another writable one (a WORKDIR /app/work under /app) exist too.
    for p in set(wanted) - set(roots):
        host = host_of(p) if covering(p).kind == "rw" else None
        if host is not None:
            host.mkdir(parents=True, exist_ok=True)
    mounts += _root_files(fs, plan, mounts)
    for m in user_mounts:
        target = norm(m["target"])
        source = Path(m["source"]).absolute()
        if not source.exists():
            source.mkdir(parents=True, exist_ok=True)
        host = host_of(target)
        if host is not None and not host.exists():
            if source.is_dir():
                host.mkdir(parents=True, exist_ok=True)
            else:
                host.parent.mkdir(parents=True, exist_ok=True)
                host.touch()
        mounts.append(Mount(target, "ro" if m.get("read_only") else "rw", source))
    return mounts


def _hide_mounts(fs: Path, hidden: Iterable[str | os.PathLike]) -> list[Mount]:
    """The mounts that cover what the sandbox must not see (`raygrpo.sandbox.hidden.hidden_paths`): an empty tmpfs
    over a folder, an empty read-only file (in the sandbox's own host folder) over a file."""
    out: list[Mount] = []
    for path, is_dir in _hidden.hidden_paths(EXPOSED_DIRS, hidden):
        out.append(Mount(path, "tmpfs") if is_dir else Mount(path, "ro", _hidden.empty_file(fs.parent)))
    return out


def _root_files(fs: Path, plan: _df.DockerfilePlan | None, mounts: list[Mount]) -> list[Mount]:
    """Writable file mounts for the files the Dockerfile copies straight into `/` (`COPY entrypoint.sh
    /entrypoint.sh`): the sandbox's `/` is a tmpfs, so each gets a host file of its own under `fs/`, bound at its
    path. A name another mount already provides (`/app`, `/usr`) is left to that mount.

    Raises:
        CopyError: the name is taken on the host side by a writable directory of the sandbox.
    """
    files: list[Mount] = []
    for path in plan.root_files() if plan is not None else []:
        if any(under(path, m.target) for m in mounts if m.target != PurePosixPath("/")):
            continue
        host = fs / path.name
        if host.exists():
            raise CopyError(f"{plan.path}: cannot write {path}: a directory of the sandbox is there")
        host.touch()
        files.append(Mount(path, "rw", host))
    return files


def resolve_links(p: PurePosixPath, mounts: list[Mount]) -> PurePosixPath:
    """Resolve a path through the host's top-level symlinks (`/lib/x` -> `/usr/lib/x`)."""
    if len(p.parts) > 1:
        for m in mounts:
            if m.kind == "symlink" and m.target == PurePosixPath("/", p.parts[1]):
                link = PurePosixPath(m.link or "")
                base = link if link.is_absolute() else PurePosixPath("/") / link
                return norm(base.joinpath(*p.parts[2:]))
    return p


def bwrap_argv(mounts: list[Mount], *, hostname: str) -> list[str]:
    """bwrap's command line (up to, not including, `--info-fd` and the init) for a sandbox with this mount table:
    namespaces of its own, the network's included (`raygrpo.sandbox.network`), and an init without capabilities that
    is the PID namespace's PID 1 itself (`raygrpo.sandbox.process.INIT_LOOP`: shielded from the sandbox's signals)."""
    argv = [BWRAP]
    for m in mounts:
        t = str(m.target)
        if m.kind == "tmpfs":
            if t != "/":
                argv += ["--tmpfs", t]
        elif m.kind == "ro":
            argv += ["--ro-bind-try" if m.optional else "--ro-bind", str(m.source), t]
        elif m.kind == "rw":
            argv += ["--bind", str(m.source), t]
        elif m.kind == "symlink":
            argv += ["--symlink", str(m.link), t]
        elif m.kind == "proc":
            argv += ["--proc", t]
        elif m.kind == "dev":
            argv += ["--dev", t]
    argv += ["--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--hostname", hostname]
    argv += ["--cap-drop", "ALL"] if os.geteuid() == 0 else ["--unshare-user"]
    argv += ["--die-with-parent", "--new-session", "--chdir", "/"]
    return argv


def host_parts(
    mounts: list[Mount], sandbox_path: str | PurePosixPath, workdir: str, *, writable_only: bool = True
) -> tuple[Path, tuple[str, ...]] | None:
    """The host directory of the mount holding `sandbox_path` (relative ones are taken from `workdir`) and the
    path's components below it, or None when it is not in a (writable, unless not `writable_only`) host-backed
    mount. Nothing is looked up on the host: what the sandbox put there (links) is for the caller to refuse, with
    `raygrpo.core.nofollow`'s dir-fd walks."""
    p = resolve_links(norm(sandbox_path, workdir), mounts)
    best: Mount | None = None
    for m in mounts:
        if m.kind != "symlink" and under(p, m.target):
            if best is None or len(m.target.parts) >= len(best.target.parts):
                best = m
    if best is None or best.source is None or (writable_only and best.kind != "rw"):
        return None
    return best.source, p.parts[len(best.target.parts) :]


def host_path(
    mounts: list[Mount], sandbox_path: str | PurePosixPath, workdir: str, *, writable_only: bool = True
) -> Path | None:
    """The host path backing `sandbox_path` (see `host_parts`), or None when it is not in a writable host-backed
    mount.

    None too when a component under the mount is a symlink: the sandbox resolves it differently from the host. A
    check at lookup time only: what the sandbox can change while it runs is written with `host_parts` and
    `raygrpo.core.nofollow` instead.
    """
    found = host_parts(mounts, sandbox_path, workdir, writable_only=writable_only)
    if found is None:
        return None
    host = found[0]
    for part in found[1]:
        host = host / part
        if host.is_symlink():
            return None
    return host


def emptiable_host_dir(
    mounts: list[Mount], sandbox_path: str | PurePosixPath, workdir: str
) -> tuple[Path, tuple[str, ...]] | None:
    """Where the host can empty `sandbox_path` exactly as the sandbox would (`host_parts`): in a writable host-backed
    mount, and no other mount below it (inside the sandbox a mount point cannot be removed; on the host it is only
    a placeholder). Else None."""
    found = host_parts(mounts, sandbox_path, workdir)
    if found is None:
        return None
    p = resolve_links(norm(sandbox_path, workdir), mounts)
    if any(under(m.target, p) and len(m.target.parts) > len(p.parts) for m in mounts):
        return None
    return found


def copy_into(dest: Path, step: CopyStep) -> None:
    """Apply a Dockerfile `COPY` step whose destination is the host path `dest`."""
    many = step.dest_is_dir or len(step.sources) + len(step.inline) > 1
    created: list[Path] = []
    for src in step.sources:
        if src.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
            created.append(dest)
        else:
            target = dest / src.name if (many or dest.is_dir()) else dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            created.append(target)
    for name, content in step.inline:
        target = dest / name if (many or dest.is_dir()) else dest
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        created.append(target)
    if step.chmod is not None:
        for path in created:
            for sub in [path, *(path.rglob("*") if path.is_dir() else [])]:
                if not sub.is_symlink():
                    os.chmod(sub, step.chmod)
