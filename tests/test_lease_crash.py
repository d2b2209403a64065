"""The lease ledger's acceptance: what a `kill -9`'d run leaves at a remote provider is stopped by `raygrpo reap`, and
a concurrent run is never touched.

Each run is a real `raygrpo rollout` process (its own local Ray) on a Harbor suite whose backend is the fake provider
(`import_path: raygrpo.testing.fake_provider.backend:FakeProviderEnvironment`), with a scripted policy. The verdicts
come from the provider's side: its listing (labels `io.raygrpo.run`, and `test.run` set per run in the config) and its
call log (`raygrpo.testing.fake_provider.audit`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from raygrpo.testing.fake_provider.audit import audit
from raygrpo.testing.fake_provider.backend import RUN_LABEL
from raygrpo.testing.fake_provider.service import FakeProviderProcess
from raygrpo.testing.fake_provider.state import Limits
from raygrpo.leases.ledger import LEASE_DIR_ENV, LEASE_LABEL, LeaseLedger
from tests.harbor_utils import make_task

pytestmark = [pytest.mark.timeout(240), pytest.mark.ray]

POLICY = '''
from raygrpo.agent.toolcalls import format_tool_call


def busy(ctx):
    """Two bash calls, then stop."""
    done = sum(1 for m in ctx.messages if m.get("role") == "tool")
    return format_tool_call("bash", {"command": "true"}) if done < 2 else "Done."
'''

CONFIG = """
envs:
  remote:
    kind: harbor
    path: suite
    import_path: raygrpo.testing.fake_provider.backend:FakeProviderEnvironment
    environment_kwargs: {{url: "{url}", reward: 1.0, labels: {{test.run: "{name}"}}}}
    probe_verifier: false
    start_timeout_s: 120
model: tiny
policy: {{kind: scripted, script: policies.py:busy}}
rollout: {{group_size: {group_size}, max_turns: 4}}
workers: {{num_env_actors: 1, max_concurrent_per_actor: 2}}
ray: {{num_cpus: 2}}
"""


def _folder(tmp_path: Path, name: str, url: str, group_size: int) -> Path:
    folder = tmp_path / name
    for task in ("t0", "t1"):
        make_task(folder / "suite", task)
    (folder / "policies.py").write_text(POLICY)
    (folder / "rollout.yaml").write_text(CONFIG.format(url=url, name=name, group_size=group_size))
    return folder


class Run:
    """`raygrpo rollout` in a process group of its own (its local Ray's processes are in it too)."""

    def __init__(self, folder: Path, lease_dir: Path, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.log = open(folder / "driver.log", "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, LEASE_DIR_ENV: str(lease_dir), "PYTHONUNBUFFERED": "1", **(env or {})}
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raygrpo.cli", "rollout", "rollout.yaml", "--out", "out", "--no-progress", *args],
            cwd=folder, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill_driver(self) -> None:
        """`kill -9` of the driver alone, as a crash would do it."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def output(self) -> str:
        self.log.flush()
        return (self.folder / "driver.log").read_text()[-4000:]

    def stop(self) -> None:
        """Kill whatever is left of the run: the driver, and the Ray processes that outlive a killed driver."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(30)
        self.log.close()


def wait_for(what: str, check, timeout_s: float, run: Run | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if run is not None and run.proc.poll() is not None:
            raise AssertionError(f"the run exited ({run.proc.returncode}) before {what}:\n{run.output()}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{run.output()}" if run else ""))


def owners_dead(lease_dir: Path, run_id: str) -> bool:
    """Every owner of the run's leases is gone (the killed driver's actors die with its Ray)."""
    ledger = LeaseLedger(lease_dir)
    for lease in ledger.leases(run=run_id):
        state = ledger.owner_state(lease.owner)
        pid = state.record.get("pid")
        if pid and psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    return True


def reap(lease_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raygrpo.cli", "reap", "--lease-dir", str(lease_dir), *args],
                          capture_output=True, text=True, timeout=60)


def test_reap_stops_what_a_killed_driver_left_while_its_create_was_held(tmp_path):
    lease_dir = tmp_path / "leases"
    with FakeProviderProcess(tmp_path / "calls.jsonl", Limits()) as provider:
        provider.set_limits(hold_creates=True)
        run = Run(_folder(tmp_path, "A", provider.url, group_size=2), lease_dir)
        try:
            held = wait_for("a held create", lambda: provider.live("test.run=A"), 120, run)
            run_id = held[0]["labels"][RUN_LABEL]
            # The creates are held: the sandboxes exist, the run never learnt their ids; their leases say so.
            wait_for("the intents", lambda: len(LeaseLedger(lease_dir).leases(run_id)) >= len(held), 10, run)
            leases = LeaseLedger(lease_dir).leases(run_id)
            assert all(lease.sandbox_id is None for lease in leases)
            assert {s["labels"][LEASE_LABEL] for s in provider.live(f"{RUN_LABEL}={run_id}")} <= {x.id for x in leases}

            run.kill_driver()
            wait_for("the killed run's actors to die", lambda: owners_dead(lease_dir, run_id), 60)
            assert provider.live(f"{RUN_LABEL}={run_id}")  # still billing: nobody stopped them

            done = reap(lease_dir, "--run", run_id)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "0 kept" in done.stdout
        finally:
            run.stop()
            provider.set_limits(hold_creates=False)
        # The provider's view: nothing of that run is alive, and its log agrees.
        assert provider.live(f"{RUN_LABEL}={run_id}") == []
        figures = audit(provider.log_path)
        assert figures.creates >= 1 and figures.live == 0
        assert LeaseLedger(lease_dir).leases(run_id) == []


def test_reap_after_a_killed_run_leaves_a_concurrent_run_untouched(tmp_path):
    lease_dir = tmp_path / "leases"
    # Each exec takes a while, so both runs hold sandboxes for seconds and the survivor outlives the reap.
    with FakeProviderProcess(tmp_path / "calls.jsonl", Limits(exec_delay_s=1.0)) as provider:
        survivor = Run(_folder(tmp_path, "A", provider.url, group_size=4), lease_dir)
        victim = Run(_folder(tmp_path, "B", provider.url, group_size=2), lease_dir)
        try:
            wait_for("the survivor's sandboxes", lambda: provider.live("test.run=A"), 150, survivor)
            victims = wait_for("the victim's sandboxes", lambda: provider.live("test.run=B"), 150, victim)
            victim_run = victims[0]["labels"][RUN_LABEL]
            victim.kill_driver()
            wait_for("the killed run's actors to die", lambda: owners_dead(lease_dir, victim_run), 60)
            assert provider.live(f"{RUN_LABEL}={victim_run}")

            # Every run's stale leases, not only the victim's: the survivor's owners are alive, so it is spared.
            done = reap(lease_dir, "--json")
            assert done.returncode == 0, done.stdout + done.stderr
            assert survivor.proc.poll() is None, "the survivor finished before the reap: make its run longer"
            report = json.loads(done.stdout)
            assert report["untouched"] >= 1 and {r["run"] for r in report["reaped"]} == {victim_run}
            assert provider.live(f"{RUN_LABEL}={victim_run}") == []
            assert survivor.wait(150) == 0, survivor.output()
        finally:
            victim.stop()
            survivor.stop()

        summary = json.loads((tmp_path / "A" / "out" / "summary.json").read_text())
        assert summary["status_counts"] == {"ok": 8} and summary["leaked_envs"] == 0
        log = [json.loads(x) for x in provider.log_path.read_text().splitlines()]
        survivors = {r["id"] for r in log if r["op"] == "create" and r["status"] == 201
                     and r["labels"].get("test.run") == "A"}
        victims_ids = {r["id"] for r in log if r["op"] == "create" and r["status"] == 201
                       and r["labels"].get("test.run") == "B"}
        assert len(survivors) == 8
        reaped_ids = set(report["stopped_sandboxes"])
        assert reaped_ids and reaped_ids <= victims_ids and not reaped_ids & survivors
        # No sandbox vanished under the survivor: every exec it sent found its sandbox.
        assert not [r for r in log if r["op"] == "exec" and r["id"] in survivors and r["status"] != 200]
        assert audit(provider.log_path).live == 0
