"""Host paths a local sandbox does not see, though they lie in the host trees it gets read-only.

The sandbox sees the host's `/usr`, `/etc`, `/opt`, `/var` and `/srv` (`raygrpo.sandbox.layout.EXPOSED_DIRS`), and
runs as uid 0 in them, so without this it could read what only the host's root may: `/etc/shadow`, SSH host keys,
TLS private keys, the environment of every Docker container (`/var/lib/docker/containers/*/config.v2.json`). And when
the sandbox root, a task suite or a run's folders lie in one of those trees, another rollout's sandbox, the task's
own tests and solution.

Each such path that exists is covered: a folder by an empty tmpfs, a file by an empty read-only file. What a task
legitimately reads there (`/etc/passwd`, `/etc/ssl/certs`, `/etc/alternatives`, `/usr`) stays.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

#: Secret files of a usual Linux host (only those that exist are covered).
SECRET_FILES = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/security/opasswd",
    "/etc/krb5.keytab", "/var/run/docker.sock",
)
#: Patterns of secret files (SSH host private keys; the public keys stay).
SECRET_GLOBS = ("/etc/ssh/ssh_host_*_key",)
#: Folders whose contents are secret, or other tenants' (containers, pods, backups of the password files, logs).
SECRET_DIRS = (
    "/etc/sudoers.d", "/etc/ssl/private", "/etc/kubernetes", "/var/lib/docker", "/var/lib/containerd",
    "/var/lib/kubelet", "/var/lib/private", "/var/backups", "/var/log", "/var/spool/cron",
)


def hidden_paths(exposed: Iterable[str], extra: Iterable[str | os.PathLike]) -> list[tuple[PurePosixPath, bool]]:
    """The paths to cover, as `(sandbox path, is a directory)`, shallow first: the secret paths above and the
    folders `extra` (the sandbox root, the task's folders: anything the host knows is not the sandbox's), each where
    it exists and lies in one of the `exposed` top-level folders. A path is taken as the host resolves it (its
    links followed), which is where the sandbox sees it: an exposed tree is bound at its own path."""
    tops = tuple(PurePosixPath("/", name) for name in exposed)
    found: dict[PurePosixPath, bool] = {}
    candidates = [*SECRET_FILES, *SECRET_DIRS, *(p for pattern in SECRET_GLOBS for p in glob.glob(pattern))]
    for path in [*candidates, *(os.fspath(p) for p in extra)]:
        real = PurePosixPath(os.path.realpath(path))
        if not os.path.lexists(real) or real in tops or not any(top in real.parents for top in tops):
            continue
        found[real] = os.path.isdir(real)
    # A path inside another hidden folder is covered already.
    out = [(p, d) for p, d in found.items() if not any(q in p.parents and found[q] for q in found)]
    return sorted(out, key=lambda item: (len(item[0].parts), str(item[0])))


def empty_file(folder: Path) -> Path:
    """A read-only empty file in the sandbox's own host folder, bound over the secret files."""
    path = folder / "hidden-empty"
    if not path.exists():
        path.touch()
        os.chmod(path, 0o444)
    return path


def sandbox_hidden(root: Path, environment_dir: str | os.PathLike, trial_paths: object,
                   extra: Iterable[str | os.PathLike] = ()) -> list[Path]:
    """The host folders a local sandbox must not see besides the host's secrets: the sandbox root (every sandbox's
    files), the task's folder and its suite's (the tests and the solution), the folder of the trial's folders, and
    `extra` (a run's output folder, say). Only those in a tree the sandbox sees get covered (`hidden_paths`)."""
    task_dir = Path(environment_dir).absolute().parent
    out = [Path(root).absolute(), task_dir, *map(Path, extra)]
    if len(task_dir.parent.parts) > 2:  # a suite's folder, not an exposed tree (`/srv`) itself
        out.append(task_dir.parent)
    trial_dir = getattr(trial_paths, "trial_dir", None)
    if trial_dir is not None:
        out.append(Path(trial_dir).absolute().parent)
    return out
