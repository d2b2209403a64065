"""Putting a task's build-context files into a started sandbox, for backends whose image builds drop them."""

from __future__ import annotations

import logging
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from raygrpo.sandbox.dockerfile import DockerfileError, load_plan

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment

logger = logging.getLogger(__name__)


async def upload_copied_files(env: BaseEnvironment, environment_dir: Path) -> int:
    """Upload what `environment/Dockerfile` `COPY`s / `ADD`s from the build context into a started sandbox; returns
    how many sources were uploaded.

    For backends whose image builds drop build-context files (e2b, as TRL found). Each source is staged under
    `/tmp` (uploads may run as the sandbox's unprivileged user) and moved into place as root, so root-owned
    destinations work; a directory's contents go into the destination, as `COPY dir /dest` does. A Dockerfile the
    parser cannot read is skipped with a warning (the backend's own build may still have honoured it).

    Raises:
        RuntimeError: Moving a file into place failed (the adapter reports it as a failed start).
    """
    from shlex import quote

    try:
        plan = load_plan(environment_dir)
    except DockerfileError as exc:
        logger.warning("not re-uploading COPY'd files: %s", exc)
        return 0
    if plan is None:
        return 0
    count = 0
    for step in plan.copies:
        many = step.dest_is_dir or len(step.sources) + len(step.inline) > 1
        items: list[tuple[Path, str, bool]] = []
        for source in step.sources:
            if source.is_dir():
                items.append((source, str(step.dest), True))
            else:
                items.append((source, str(step.dest / source.name) if many else str(step.dest), False))
        with tempfile.TemporaryDirectory(prefix="raygrpo-heredoc-") as scratch:
            for name, content in step.inline:
                path = Path(scratch) / Path(name).name
                path.write_text(content)
                items.append((path, str(step.dest / path.name) if many else str(step.dest), False))
            for source, dest, is_dir in items:
                tmp = f"/tmp/raygrpo-upload-{uuid.uuid4().hex}"
                parent = dest.rsplit("/", 1)[0] or "/"
                if is_dir:
                    await env.upload_dir(source, tmp)
                    command = f"mkdir -p {quote(dest)} && cp -a {quote(tmp)}/. {quote(dest)}/ && rm -rf {quote(tmp)}"
                else:
                    await env.upload_file(source, tmp)
                    command = f"mkdir -p {quote(parent)} && mv -f {quote(tmp)} {quote(dest)}"
                if step.chmod is not None:
                    command += f" && chmod -R {step.chmod:o} {quote(dest)}"
                result = await env.exec(command, user="root")
                if result.return_code != 0:
                    raise RuntimeError(f"could not put {source.name} at {dest} in the sandbox: "
                                           f"{(result.stderr or result.stdout or '').strip()[:200]}")
                count += 1
    return count
