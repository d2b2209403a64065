"""`ray job submit` against a real head: the commands of cluster/README.md, run as a user runs them.

A head is started with `ray start --head` on 127.0.0.1, with token authentication and the docker hosts' custom
resource, in its own `--temp-dir` (so nothing else on the machine finds or joins it); the test stops exactly the
processes it started. Each test copies an example to a temporary folder, submits `raygrpo rollout` from there with
`--working-dir .` and `--runtime-env cluster/runtime_env.yaml`, deletes the local copy once the job runs (the job
must carry everything it needs), and checks the run folder the job wrote. Leaks are counted by the OS (local
sandboxes), docker, and the ORS server's own registry.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from raygrpo.docker.engine import find
from raygrpo.docker.owners import SANDBOX_LABEL
from raygrpo.sandbox.os_probe import process_env_marks
from tests.docker_utils import docker_ready  # noqa: F401 - a fixture
from tests.e2e_support import NapEnvironment
from tests.ors_utils import ors_server, wait_until
from tests.ray_procs import listen_ports, stop_cluster
from tests.test_e2e_harbor import os_leaks

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
FAKE_SECRET = "rgfake-" + secrets.token_hex(12)

pytestmark = [pytest.mark.cluster]


def job_state(status_output: str) -> str:
    """The state `ray job status` printed: "Status for job 'ID': RUNNING" while it runs, then "Job 'ID' succeeded"
    (or "failed", "was stopped"); the CLI colours it."""
    out = re.sub(r"\x1b\[[0-9;]*m", "", status_output)
    found = re.search(r"Status for job '[^']+': (\w+)|Job '[^']+' (succeeded|failed|was stopped)", out)
    if not found:
        return "UNKNOWN"
    return found.group(1) or {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}[found.group(2)]


def submit_job(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    """`ray job submit ARGS` from `cwd`; returns the job id. A head that has just started may answer before its
    node's job agent has registered ("No available agent to submit job"): that answer is retried for up to 2
    minutes, as Ray's message asks."""
    deadline = time.monotonic() + 120
    while True:
        proc = subprocess.run([RAY, "job", "submit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=180)
        if "No available agent" not in proc.stderr + proc.stdout or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"raysubmit_\w+", proc.stdout + proc.stderr)
    assert found, proc.stdout + proc.stderr
    return found.group(0)


#: Ports `ray start` otherwise takes at fixed defaults, which another Ray on this machine may hold.
_OWN_PORTS = ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
              "--metrics-export-port", "--node-manager-port", "--object-manager-port", "--ray-client-server-port")


@dataclass
class Head:
    """A running head: where to reach it and the environment every client needs (the token)."""

    dashboard: str
    gcs: str
    temp_dir: Path
    sandbox_base: Path
    env: dict[str, str]

    def ray(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Run a `ray` CLI command against this head (from the current directory)."""
        return subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=check)

    def submit(self, workdir: Path, runtime_env: Path, entrypoint: list[str]) -> str:
        """`ray job submit --no-wait` from `workdir`, as cluster/README.md shows; returns the job id."""
        return submit_job(["--address", self.dashboard, "--working-dir", ".", "--runtime-env", str(runtime_env),
                           "--no-wait", "--", *entrypoint], workdir, self.env)

    def status(self, job_id: str) -> str:
        proc = self.ray("job", "status", "--address", self.dashboard, job_id, check=False)
        return job_state(proc.stdout + proc.stderr)

    def wait(self, job_id: str, states: set[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.status(job_id)
            if state in states:
                return state
            time.sleep(1.0)
        raise AssertionError(f"job {job_id} still {state} after {timeout_s:g} s:\n{self.logs(job_id)[-4000:]}")

    def logs(self, job_id: str) -> str:
        proc = self.ray("job", "logs", "--address", self.dashboard, job_id, check=False)
        return proc.stdout + proc.stderr


def _start_head(env: dict[str, str], sandbox_base: Path) -> tuple[subprocess.Popen, Head, Path]:
    """`ray start --head --block` with every port of its own picked free outside the ephemeral range; its output goes
    to a log file beside its temp dir, for the message of a head that does not come up."""
    temp_dir = Path(f"/tmp/rgh-{secrets.token_hex(3)}")
    log = Path(f"{temp_dir}.log")
    gcs_port, dash_port, *own = listen_ports(2 + len(_OWN_PORTS))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs_port),
             "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port),
             "--num-cpus", "4", "--resources", json.dumps({"docker_host": 2}), "--temp-dir", str(temp_dir),
             "--disable-usage-stats", *(arg for flag, port in zip(_OWN_PORTS, own) for arg in (flag, str(port)))],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    head = Head(dashboard=f"http://127.0.0.1:{dash_port}", gcs=f"127.0.0.1:{gcs_port}", temp_dir=temp_dir,
                sandbox_base=sandbox_base, env=env)
    return proc, head, log


def _why_not_up(proc: subprocess.Popen, head: Head, log: Path) -> str:
    """What a head that did not answer left behind: `ray start`'s exit status and output, the dashboard's log."""
    parts = [f"the head did not answer at {head.dashboard} (ray start: "
             f"{'running' if proc.poll() is None else f'exited {proc.returncode}'})",
             "--- ray start output ---", log.read_text(errors="replace")[-3000:] if log.exists() else "(none)"]
    for name in ("dashboard.log", "dashboard_agent.log", "gcs_server.err"):
        found = sorted(head.temp_dir.glob(f"session_*/logs/{name}"))
        if found:
            parts += [f"--- {name} ---", found[-1].read_text(errors="replace")[-2000:]]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> Iterator[Head]:
    """`ray start --head --block` on 127.0.0.1 with token auth and `docker_host: 2`; stopped by pid at the end. Every
    port of its own is a free one: the session's local Ray (`ray_local`) may already hold Ray's defaults (the job
    agent's 52365 among them), and a head whose agent cannot bind refuses every job.

    A head that does not answer within 90 s is reported (its output and logs on stderr) and started once more on
    other ports; the second failure fails the tests with the same report."""
    sandbox_base = tmp_path_factory.mktemp("job-sandboxes")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep the single-node head on loopback
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAYGRPO_SANDBOX_ROOT": str(sandbox_base),
        "RAY_USAGE_STATS_ENABLED": "0",
    })
    for attempt in (1, 2):
        proc, head, log = _start_head(env, sandbox_base)
        try:
            up = wait_until(lambda: head.ray("job", "list", "--address", head.dashboard, timeout=30,
                                             check=False).returncode == 0, 90)
            if up:
                yield head
                return
            report = _why_not_up(proc, head, log)
            assert attempt == 1, report
            print(f"[test_cluster_job] first head failed to start; starting another\n{report}", file=sys.stderr)
        finally:
            _stop_head(proc, head.temp_dir)
            log.unlink(missing_ok=True)


def _stop_head(proc: subprocess.Popen, temp_dir: Path) -> None:
    """Stop the head's processes: its `ray start --block` process group, then anything else that names its temp dir
    (workers run in sessions of their own), by pid."""
    stop_cluster(proc, temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _copy_example(name: str, dest: Path) -> Path:
    return Path(shutil.copytree(REPO / "examples" / name, dest / name))


def _runtime_env(tmp_path: Path, **env_vars: str) -> Path:
    """cluster/runtime_env.yaml, plus `env_vars` (the test's fake secret) when given."""
    if not env_vars:
        return REPO / "cluster" / "runtime_env.yaml"
    data = yaml.safe_load((REPO / "cluster" / "runtime_env.yaml").read_text())
    data["env_vars"] = {**data.get("env_vars", {}), **env_vars}
    path = tmp_path / "runtime_env.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run_and_delete_copy(head: Head, workdir: Path, runtime_env: Path, entrypoint: list[str],
                         timeout_s: float = 300) -> tuple[str, str]:
    job = head.submit(workdir, runtime_env, entrypoint)
    head.wait(job, {"RUNNING", "SUCCEEDED", "FAILED"}, 120)
    shutil.rmtree(workdir)  # the job must have carried everything it needs
    state = head.wait(job, {"SUCCEEDED", "FAILED", "STOPPED"}, timeout_s)
    return job, state


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]


@pytest.mark.timeout(420)
def test_echo_rollout_as_a_job_and_a_secret_left_nowhere(head, tmp_path):
    """The echo example submitted from a copy: rewards as on one machine (the right answer: 1.0 everywhere); a fake
    secret given through the runtime_env reaches the environment's sessions but appears nowhere in the run folder,
    the job's driver log or the workers' logs."""
    workdir = _copy_example("echo", tmp_path)
    out = tmp_path / "out"
    runtime_env = _runtime_env(tmp_path, RAYGRPO_TEST_TOKEN=FAKE_SECRET)
    job, state = _run_and_delete_copy(head, workdir, runtime_env, [
        "raygrpo", "rollout", "rollout.yaml", "--out", str(out),
        "--set", 'envs.echo.secrets={"api_token": "RAYGRPO_TEST_TOKEN"}'])
    logs = head.logs(job)
    assert state == "SUCCEEDED", logs[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requested"] == summary["completed"] == 32 and summary["leaked_envs"] == 0
    assert summary["reward_mean"] == 1.0 and summary["status_counts"] == {"ok": 32}
    assert {t["node"] for t in _lines(out)} == {"127.0.0.1"}
    assert "ray.num_cpus=4 sizes a local Ray only" in logs  # the example's setting is reported, not dropped
    assert re.search(r"rollouts 32/32", logs)  # progress lines in `ray job logs`
    worker_logs = [p for p in (head.temp_dir / "session_latest" / "logs").glob("*")
                   if p.is_file() and p.name.startswith(("worker-", "python-core-worker"))]
    assert worker_logs
    places = [*(p for p in out.rglob("*") if p.is_file()), *worker_logs]
    leaked = [str(p) for p in places if FAKE_SECRET in p.read_text(errors="replace")]
    assert leaked == [] and FAKE_SECRET not in logs


@pytest.mark.timeout(300)
def test_address_joins_the_cluster_from_outside_a_job(head, tmp_path):
    """`raygrpo rollout --address HOST:PORT` from a shell, not a job: it joins the head (the example's `ray.num_cpus`
    is reported as not applied, which only a joined run does) and the driver's folder travels as the working_dir."""
    workdir = _copy_example("echo", tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run([str(Path(sys.executable).with_name("raygrpo")), "rollout", "rollout.yaml", "--address",
                           head.gcs, "--out", str(out), "--no-progress"],
                          cwd=workdir, env=head.env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"joining the cluster at {head.gcs}" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 32 and summary["reward_mean"] == 1.0 and summary["leaked_envs"] == 0


@pytest.mark.timeout(600)
@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
def test_harbor_rollout_on_docker_as_a_job(head, tmp_path):
    """The Harbor example on the docker backend, its env pool actors asking for the docker hosts' resource."""
    from tests.docker_utils import sandbox_objects

    workdir = _copy_example("harbor_local", tmp_path)
    out = tmp_path / "out"
    job, state = _run_and_delete_copy(head, workdir, _runtime_env(tmp_path), [
        "raygrpo", "rollout", "rollout.yaml", "--out", str(out), "--no-progress",
        "--set", "envs.local.environment_type=docker", "--set", "rollout.group_size=1",
        "--set", 'envs.local.pool={"num_actors": 2, "max_concurrent_per_actor": 4, "resources": {"docker_host": 1}}'],
        timeout_s=480)
    assert state == "SUCCEEDED", head.logs(job)[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requested"] == summary["completed"] == 9 and summary["leaked_envs"] == 0
    assert summary["reward_mean"] == 1.0
    assert {t["worker"] for t in _lines(out)} <= {"raygrpo-envpool-local-0", "raygrpo-envpool-local-1"}
    assert sandbox_objects() == []


BUSY = '''
from raygrpo.agent.toolcalls import format_tool_call


def busy(ctx):
    """Keep every rollout busy: Harbor sandboxes sleep, ORS sessions nap (the job is stopped meanwhile)."""
    if any(m.get("role") == "tool" for m in ctx.messages):
        return "Done."
    if ctx.task.env == "nap":
        return format_tool_call("nap", {"seconds": 120})
    return format_tool_call("bash", {"command": "sleep 300 & sleep 300"})
'''


def live_sandboxes(base: Path) -> int:
    """Sandboxes under `base` with a live process, as the OS shows them (each sandbox's processes carry its id)."""
    return len({sid for _, (root, sid) in process_env_marks().items() if root and root.startswith(str(base))})


@pytest.mark.timeout(480)
@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
def test_job_stop_mid_batch_leaves_nothing(head, tmp_path):
    """72 Harbor sandboxes on the local backend, 16 on docker and 16 ORS sessions busy, then `ray job stop`: the job
    stops within Ray's wait (raised to 60 s by cluster/runtime_env.yaml), writes a partial summary with
    `interrupted: true`, and the OS, docker and the ORS server hold nothing of it."""
    from tests.docker_utils import sandbox_objects

    NapEnvironment.reset_counters()
    workdir = _copy_example("harbor_local", tmp_path)
    (workdir / "busy.py").write_text(BUSY)
    out = tmp_path / "out"
    with ors_server(NapEnvironment) as server:
        job = head.submit(workdir, _runtime_env(tmp_path), [
            "raygrpo", "rollout", "rollout.yaml", "--out", str(out), "--no-progress",
            "--set", "policy.kind=scripted", "--set", "policy.script=busy.py:busy",
            "--set", "rollout.group_size=8", "--set", "envs.local.exec_timeout_s=600",
            "--set", "envs.local.max_concurrent_starts=16",
            "--set", "workers.num_env_actors=2", "--set", "workers.max_concurrent_per_actor=48",
            "--set", f'envs.nap={{"kind": "ors", "url": "{server.url}", "num_tasks": 2}}',
            "--set", 'envs.dock={"kind": "harbor", "path": "tasks", "environment_type": "docker", "num_tasks": 2, '
                     '"exec_timeout_s": 600, "pool": {"num_actors": 1, "max_concurrent_per_actor": 16, '
                     '"resources": {"docker_host": 1}}}'])

        def containers() -> int:
            return len(find([SANDBOX_LABEL], kinds=("container",)))  # the busy sleeps keep them running

        busy = wait_until(lambda: live_sandboxes(head.sandbox_base) >= 64 and NapEnvironment.napping >= 16
                          and containers() >= 16, 300)
        live = live_sandboxes(head.sandbox_base) + containers()
        began = time.monotonic()
        stopped = head.ray("job", "stop", "--address", head.dashboard, job, timeout=120, check=False)
        state = head.wait(job, {"STOPPED", "FAILED", "SUCCEEDED"}, 90)
        took = time.monotonic() - began
        print(f"\nray job stop with {live} live sandboxes (local and docker) and {NapEnvironment.napping} ORS naps: "
              f"{took:.1f} s")
        assert busy, (os_leaks(head.sandbox_base), NapEnvironment.napping, head.logs(job)[-3000:])
        assert state == "STOPPED", stopped.stdout + stopped.stderr
        assert wait_until(lambda: server.live_sessions() == 0, 30), server.live_sessions()
    assert wait_until(lambda: os_leaks(head.sandbox_base) == ([], []), 30), os_leaks(head.sandbox_base)
    assert wait_until(lambda: sandbox_objects() == [], 30), sandbox_objects()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["leaked_envs"] == 0
    assert summary["requested"] == 72 + 16 + 16 and summary["completed"] < summary["requested"]
    assert took < 60, took
