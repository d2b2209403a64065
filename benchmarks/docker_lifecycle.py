"""Docker sandbox lifecycle: start and stop time per sandbox, Harbor's docker backend as shipped vs raygrpo's.

Both arms start, use (one `exec`) and stop sandboxes of the example task `count-words` on the local Docker engine
(`make docker-dev`), one at a time, interleaved, `--repeats` each:

- **harbor**: Harbor 0.25's `DockerEnvironment` made by its `EnvironmentFactory` as raygrpo would make it without
  its additions (`stop(delete=False)`, so images are kept): `sleep infinity` is PID 1 and ignores SIGTERM, so
  `docker compose down` waits out Docker's 10 s stop timeout; every start runs `docker compose build` (cached layers)
  and tags one more `<session>-main` image.
- **raygrpo**: `HarborProvider` adapters (`raygrpo.envs.harbor.docker`): the service under an init, the image built
  once as `hb__<hash>` and reused as a prebuilt image by every later start (the first start, which builds it, is
  reported on its own).

Times are the backend's own `start` (build, `compose down` of stale containers, `up --wait`, Harbor's set-up execs)
and `stop`. Prints progress to stderr and one JSON object last; leaves no container, network or image it made.
Run: `python benchmarks/docker_lifecycle.py` (about 1.5 minutes; `--quick`: 2 repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from raygrpo.envs.harbor.provider import HarborProvider  # noqa: E402
from raygrpo.envs.harbor.tasks import list_harbor_tasks, load_task  # noqa: E402
from raygrpo.docker.engine import docker_problem, image_exists, remove_images  # noqa: E402
from raygrpo.specs.harbor import HarborSpec  # noqa: E402

TASKS = ROOT / "examples" / "harbor_local" / "tasks"
TASK = "count-words"


def log(msg: str) -> None:
    print(f"[docker_lifecycle] {msg}", file=sys.stderr, flush=True)


def stats(samples: list[float]) -> dict:
    return {"median": round(statistics.median(samples), 3), "samples": [round(s, 3) for s in samples]}


async def harbor_sandbox(n: int) -> tuple[float, float]:
    """One sandbox of Harbor's docker backend as shipped: (start seconds, stop seconds)."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    task = load_task(str(TASKS / TASK))
    with tempfile.TemporaryDirectory(prefix="bench-harbor-") as trial_dir:
        paths = TrialPaths(trial_dir=Path(trial_dir))
        paths.mkdir()
        env = EnvironmentFactory.create_environment_from_config(
            config=TrialEnvironmentConfig(type="docker", delete=False),
            environment_dir=task.paths.environment_dir, environment_name=task.short_name,
            session_id=f"{task.short_name}__bench{n:04d}__env", trial_paths=paths,
            task_env_config=task.config.environment.model_copy(deep=True),
        )
        began = time.perf_counter()
        try:
            await env.start(force_build=False)
            start = time.perf_counter() - began
            assert (await env.exec("wc -w poem.txt")).return_code == 0
        finally:
            began = time.perf_counter()
            await env.stop(delete=False)
            stop = time.perf_counter() - began
    return start, stop


async def raygrpo_sandbox(provider: HarborProvider, ref) -> tuple[float, float]:
    """One sandbox through raygrpo's Harbor adapter: (start seconds, stop seconds)."""
    adapter = provider.adapter()
    try:
        await adapter.start(ref)
        assert "exit code 0" in (await adapter.call("bash", {"command": "wc -w poem.txt"})).text
    finally:
        await adapter.close()
    return adapter.timings["start"], adapter.timings["stop"]


def session_tags() -> list[str]:
    """The per-sandbox image tags Harbor as shipped leaves (`<session>-main`)."""
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}", "--filter", f"reference={TASK}__*"],
                         capture_output=True, text=True, check=True).stdout.split()
    return sorted(set(out))


async def main(repeats: int) -> dict:
    problem = docker_problem()
    if problem:
        raise SystemExit(f"docker_lifecycle: {problem} (run `make docker-dev`)")
    spec = HarborSpec(path=str(TASKS), environment_type="docker")
    ref = next(t for t in list_harbor_tasks(spec, "bench") if t.metadata["task_dir"].endswith(TASK))
    from harbor.environments.definition import environment_content_hash

    image = f"hb__{environment_content_hash(TASKS / TASK / 'environment')}"
    had_image = image_exists(image)
    tags_before = set(session_tags())
    remove_images([image])  # the first raygrpo start builds it

    provider = HarborProvider(spec, name="bench")
    arms: dict[str, dict[str, list[float]]] = {"harbor": {"start": [], "stop": []}, "raygrpo": {"start": [], "stop": []}}
    try:
        first_start, first_stop = await raygrpo_sandbox(provider, ref)
        log(f"raygrpo first start (builds {image}): {first_start:.2f} s, stop {first_stop:.2f} s")
        for i in range(repeats):
            for arm in ("harbor", "raygrpo"):
                start, stop = await (harbor_sandbox(i) if arm == "harbor" else raygrpo_sandbox(provider, ref))
                arms[arm]["start"].append(start)
                arms[arm]["stop"].append(stop)
                log(f"{arm} #{i}: start {start:.2f} s, stop {stop:.2f} s")
    finally:
        await provider.aclose()
        left_tags = sorted(set(session_tags()) - tags_before)
        remove_images(left_tags + ([] if had_image else [image]))
    version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True).stdout.strip()
    stop_before, stop_after = (statistics.median(arms[a]["stop"]) for a in ("harbor", "raygrpo"))
    return {
        "task": TASK,
        "repeats": repeats,
        "docker": version,
        "start_s": {
            "harbor_compose_build_each_start": stats(arms["harbor"]["start"]),
            "raygrpo_first_start_builds": round(first_start, 3),
            "raygrpo_reused_image": stats(arms["raygrpo"]["start"]),
        },
        "stop_s": {"harbor_without_init": stats(arms["harbor"]["stop"]), "raygrpo_with_init": stats(arms["raygrpo"]["stop"])},
        "stop_speedup": round(stop_before / stop_after, 1),
        "harbor_session_image_tags_left": len(left_tags),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(2 if args.quick else args.repeats)), indent=2))
