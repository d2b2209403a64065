"""The lease ledger: records, owners' heartbeats, reaping stale owners' leases at the fake provider, `raygrpo reap`,
and the Harbor adapter's leases (label, lifetime, record from intent to stop).

Judged from the provider's side where it matters: what is alive is the fake provider's own listing and log. The
crash acceptance tests (a killed driver, two concurrent runs) are `tests/test_lease_crash.py`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from raygrpo.cli import main as cli_main
from raygrpo.envs.harbor.provider import HarborProvider, HarborStartError
from raygrpo.envs.harbor.leases import LIFETIME_MARGIN_S, HarborLeases
from raygrpo.envs.harbor.tasks import list_harbor_tasks, load_task
from raygrpo.governor import Governor
from raygrpo.testing.fake_provider.audit import audit
from raygrpo.testing.fake_provider.service import FakeProviderProcess
from raygrpo.testing.fake_provider.state import Limits
from raygrpo.leases.hooks import lease_policy
from raygrpo.leases.reaper import LeaseWatch, reap_leases
from raygrpo.leases.ledger import LEASE_DIR_ENV, LEASE_LABEL, LeaseLedger, safe_id
from raygrpo.specs import HarborSpec, ProviderSpec
from tests.harbor_utils import EXAMPLE_TASKS, make_task

pytestmark = pytest.mark.timeout(60)

FAKE = "raygrpo.testing.fake_provider.backend:FakeProviderEnvironment"

#: Writes leases (JSON list of intent kwargs, each with an optional `bind`) as an owner, prints the owner id, and
#: then exits, or with "stay" keeps beating until killed.
_OWNER = """
import json, sys, time
from raygrpo.leases.ledger import LeaseLedger
ledger = LeaseLedger(sys.argv[1])
for spec in json.loads(sys.argv[2]):
    bind = spec.pop("bind", None)
    lease = ledger.intent(spec.pop("id"), **spec)
    if bind:
        ledger.bind(lease, bind)
print(ledger.own(), flush=True)
if sys.argv[3] == "stay":
    time.sleep(60)
"""


def leases_of_a_dead_owner(root, *specs: dict) -> str:
    """Write `specs` as leases from a process that then exits; returns its owner id."""
    done = subprocess.run([sys.executable, "-c", _OWNER, str(root), json.dumps(list(specs)), "exit"],
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


def lease_spec(lease_id: str, backend: str = FAKE, url: str = "http://127.0.0.1:9", **extra) -> dict:
    return {"id": lease_id, "provider_key": "fake", "backend": backend, "reach": {"url": url}, "deadline": 0.0,
            "run": "run-dead", **extra}


def create_labelled(url: str, lease_id: str, **labels: str) -> str:
    """A sandbox at the provider carrying the lease's label (as the backend's create would make it)."""
    response = httpx.post(f"{url}/sandboxes", json={"labels": {LEASE_LABEL: lease_id, **labels}}, timeout=10)
    response.raise_for_status()
    return response.json()["id"]


@pytest.fixture
def provider(tmp_path):
    with FakeProviderProcess(tmp_path / "calls.jsonl", Limits()) as running:
        yield running


# ── records and owners ───────────────────────────────────────────────────────────────────────────────────────────


def test_a_lease_is_written_before_the_create_bound_then_removed(tmp_path):
    ledger = LeaseLedger(tmp_path / "leases")
    lease = ledger.intent("task__abc__env", provider_key="fake", backend=FAKE, reach={"url": "http://x"},
                          deadline=123.0, expires=456.0, run="run-a")
    on_disk = json.loads((tmp_path / "leases" / "task__abc__env.json").read_text())
    assert on_disk["sandbox_id"] is None and on_disk["run"] == "run-a" and on_disk["reach"] == {"url": "http://x"}
    assert on_disk["owner"] == lease.owner == ledger.own() and on_disk["provider_key"] == "fake"
    assert lease.labels == {LEASE_LABEL: "task__abc__env"}
    owner = json.loads((tmp_path / "leases" / "owners" / lease.owner / "owner.json").read_text())
    assert owner["pid"] == os.getpid()
    assert ledger.owner_state(lease.owner).reason == "alive"
    assert ledger.leases() == [lease] and ledger.leases(run="run-a") == [lease] and ledger.leases(run="run-b") == []

    ledger.bind(lease, "sb-1", expires=789.0)
    (read,) = ledger.leases()
    assert read.sandbox_id == "sb-1" and read.expires == 789.0
    ledger.remove(lease)
    assert ledger.leases() == [] and not list((tmp_path / "leases").glob("*.json"))
    assert safe_id("tests/my task:1") == "tests_my_task_1" and safe_id("../x") == "_x"


def test_an_owner_is_fresh_while_it_beats_and_stale_once_its_process_dies(tmp_path):
    root = tmp_path / "leases"
    child = subprocess.Popen([sys.executable, "-c", _OWNER, str(root), json.dumps([lease_spec("l1")]), "stay"],
                             stdout=subprocess.PIPE, text=True)
    try:
        owner = child.stdout.readline().strip()
        ledger = LeaseLedger(root)
        beat = root / "owners" / owner / "heartbeat"
        old = time.time() - 20
        os.utime(beat, (old, old))
        deadline = time.monotonic() + 15
        while beat.stat().st_mtime <= old + 1 and time.monotonic() < deadline:
            time.sleep(0.2)  # the owner's heartbeat thread refreshes it every 2 s
        assert time.time() - beat.stat().st_mtime < 5
        assert ledger.owner_state(owner).reason == "alive"
        report = reap_leases(ledger)
        assert report.untouched == 1 and report.reaped == [] and len(ledger.leases()) == 1
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    state = ledger.owner_state(owner)
    assert state.stale and "is dead" in state.reason


def test_an_owner_on_another_host_is_judged_by_its_heartbeat(tmp_path):
    ledger = LeaseLedger(tmp_path / "leases")
    owner = ledger.own()
    record_path = ledger.owners / owner / "owner.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "hostname": "another-node", "pid": 1}))
    assert not ledger.owner_state(owner).stale  # its pid means nothing here; the heartbeat is fresh
    old = time.time() - 31
    os.utime(ledger.owners / owner / "heartbeat", (old, old))
    state = ledger.owner_state(owner, stale_after_s=30)
    assert state.stale and "heartbeat" in state.reason
    assert not ledger.owner_state(owner, stale_after_s=60).stale
    assert ledger.owner_state("never-seen").reason == "no owner record"


# ── reaping ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_reap_stops_a_dead_owners_sandboxes_and_never_a_live_owners(tmp_path, provider):
    root = tmp_path / "leases"
    url = provider.url
    # A create whose answer never arrived: the sandbox exists, labelled with its lease; the lease has no id.
    orphan = create_labelled(url, "lost-answer")
    # A bound lease whose sandbox is still there, and one whose sandbox is already gone.
    bound = create_labelled(url, "bound")
    leases_of_a_dead_owner(root, lease_spec("lost-answer", url=url), lease_spec("bound", url=url, bind=bound),
                           lease_spec("gone", url=url, bind="no-such-sandbox"))
    # A concurrent run's lease: this process is its owner, alive.
    mine = LeaseLedger(root).intent("live-run", provider_key="fake", backend=FAKE, reach={"url": url},
                                    deadline=0.0, run="run-live")
    live = create_labelled(url, "live-run")

    report = reap_leases(root)
    outcomes = {r.lease.id: (r.outcome, sorted(r.stopped)) for r in report.reaped}
    assert outcomes == {"lost-answer": ("stopped", [orphan]), "bound": ("stopped", [bound]), "gone": ("stopped", [])}
    assert report.untouched == 1 and report.kept == []
    assert [x.id for x in LeaseLedger(root).leases()] == [mine.id]
    assert [s["id"] for s in provider.live()] == [live]
    assert audit(provider.log_path).live == 1
    # Nothing is left of the dead owner: its record went with its last lease.
    assert [p.name for p in (root / "owners").iterdir()] == [mine.owner]


def test_the_lease_watch_stops_a_dead_owners_sandboxes_mid_run_and_its_governor_forgets_it(tmp_path, provider):
    """An actor lost mid-run: the watch of its run stops its sandboxes, and the governor drops the live tickets of
    the actor's gate and what it still had queued; another run's leases, and a live owner's in the same run, are
    untouched."""
    root = tmp_path / "leases"
    url = provider.url
    lost = create_labelled(url, "lost")
    uncapped = create_labelled(url, "no-cap")
    leases_of_a_dead_owner(root, lease_spec("lost", url=url, bind=lost, run="run-a", live_holder="dead-gate"),
                           lease_spec("no-cap", url=url, bind=uncapped, run="run-a"),
                           lease_spec("other-run", url=url, run="run-b", live_holder="other-gate"))
    LeaseLedger(root).intent("alive", provider_key="fake", backend=FAKE, reach={"url": url}, deadline=0.0,
                             run="run-a", live_holder="live-gate")
    governor = Governor("fake", None, 3)

    async def fill() -> asyncio.Task:
        for ticket, holder in (("t1", "dead-gate"), ("t2", "dead-gate"), ("t3", "live-gate")):
            assert await governor.acquire_live(ticket, holder)
        return asyncio.ensure_future(governor.acquire_live("t4", "dead-gate"))  # a dead caller's queued request

    forgotten: list[tuple[str, list[str]]] = []

    async def scenario() -> None:
        queued = await fill()
        await asyncio.sleep(0.05)
        watch = LeaseWatch(root, "run-a", on_holders_gone=lambda key, holders: (forgotten.append((key, holders)),
                                                                          governor.forget_holders(holders)))
        await asyncio.to_thread(watch.reap_once)
        assert await asyncio.wait_for(queued, 5) is False  # cancelled, not granted to nobody
        assert await governor.acquire_live("t5", "dead-gate") is False  # a late call of the dead gate
        assert watch.outcomes == {"stopped": 2}

    asyncio.run(scenario())
    assert forgotten == [("fake", ["dead-gate"])]
    stats = governor.stats()
    assert stats["live"] == 1 and stats["waiting_live"] == 0 and stats["live_forgotten"] == 2
    assert provider.live() == []
    assert sorted(x.id for x in LeaseLedger(root).leases()) == ["alive", "other-run"]


def test_leases_that_cannot_be_reaped_are_reported_and_kept(tmp_path, provider):
    root = tmp_path / "leases"
    leases_of_a_dead_owner(
        root, lease_spec("e2b-lease", backend="e2b", bind="e2b-sb"),
        lease_spec("e2b-expired", backend="e2b", expires=time.time() - 5),
        lease_spec("unreachable", url="http://127.0.0.1:9"))  # nothing listens on the discard port
    report = reap_leases(root)
    by_id = {r.lease.id: r for r in report.reaped}
    assert by_id["e2b-lease"].outcome == "kept" and "no reap hook" in by_id["e2b-lease"].reason
    line = by_id["e2b-lease"].describe()
    assert "e2b-sb" in line and "provider key fake" in line and "io.raygrpo.lease=e2b-lease" in line
    assert by_id["e2b-expired"].outcome == "expired"
    assert by_id["unreachable"].outcome == "kept" and "did not answer" in by_id["unreachable"].reason
    assert sorted(x.id for x in LeaseLedger(root).leases()) == ["e2b-lease", "unreachable"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no claim left behind


def test_a_claim_whose_reaper_died_is_taken_over(tmp_path, provider):
    root = tmp_path / "leases"
    sandbox = create_labelled(provider.url, "claimed")
    leases_of_a_dead_owner(root, lease_spec("claimed", url=provider.url))
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    from raygrpo.sandbox.owners import HOSTNAME

    os.rename(root / "claimed.json", root / f".claim-claimed@{safe_id(HOSTNAME)}@{dead_pid}")
    assert LeaseLedger(root).leases() == []
    report = reap_leases(root)
    assert [(r.lease.id, r.stopped) for r in report.reaped] == [("claimed", [sandbox])]
    assert provider.live() == [] and list(root.glob(".claim-*")) == []


def test_raygrpo_reap_exit_codes(tmp_path, provider, capsys):
    root = tmp_path / "leases"
    assert cli_main(["reap", "--lease-dir", str(root), "--sandbox-root", str(tmp_path / "sandboxes")]) == 0
    out = capsys.readouterr().out
    assert "0 sandbox(es), 0 process(es), 0 run folder(s)" in out and "no remote sandbox to reap" in out
    assert cli_main(["reap", "--lease-dir", str(root), "--stale-after", "0"]) == 2

    sandbox = create_labelled(provider.url, "a")
    leases_of_a_dead_owner(root, lease_spec("a", url=provider.url, run="run-x"),
                           lease_spec("b", backend="e2b", run="run-y"))
    assert cli_main(["reap", "--lease-dir", str(root), "--run", "run-x"]) == 0
    out = capsys.readouterr().out
    assert f"stopped lease a (run run-x" in out and sandbox in out and "lease b" not in out
    assert provider.live() == []
    assert cli_main(["reap", "--lease-dir", str(root)]) == 1
    captured = capsys.readouterr()
    assert "kept lease b (run run-y" in captured.out and "could not be reaped" in captured.err
    assert [x.id for x in LeaseLedger(root).leases()] == ["b"]


# ── the Harbor adapter's leases ──────────────────────────────────────────────────────────────────────────────────


def test_which_backends_are_leased():
    from raygrpo.testing.fake_provider.backend import FakeProviderEnvironment
    from raygrpo.testing.null import NullEnvironment

    assert not lease_policy("local").tracked and not lease_policy("docker").tracked
    assert not lease_policy("raygrpo.testing.null:NullEnvironment", NullEnvironment).tracked
    e2b = lease_policy("e2b")
    assert e2b.tracked and e2b.hook is None and e2b.lifetime_kwarg == "sandbox_timeout_secs"
    fake = lease_policy(FAKE, FakeProviderEnvironment)
    assert fake.tracked and fake.hook is FakeProviderEnvironment and fake.lifetime_kwarg == "lifetime_s"


def test_the_lifetime_is_derived_from_the_rollout_deadline_unless_the_user_set_one(tmp_path, caplog):
    task = load_task(str(sorted(p for p in EXAMPLE_TASKS.iterdir() if p.is_dir())[0]))
    spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="e2b", start_timeout_s=100, stop_timeout_s=20,
                      verifier_timeout_s=50)
    leases = HarborLeases(spec, "suite", rollout_timeout_s=400, ledger=LeaseLedger(tmp_path / "leases"))
    assert leases.backend_kwargs({"override_cpus": 2}, task, "s") == {
        "override_cpus": 2, "sandbox_timeout_secs": math.ceil(100 + 400 + 50 + 20 + LIFETIME_MARGIN_S)}
    mine = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="e2b", environment_kwargs={"sandbox_timeout_secs": 900})
    leases = HarborLeases(mine, "suite", rollout_timeout_s=400, ledger=LeaseLedger(tmp_path / "leases"))
    with caplog.at_level("INFO"):
        assert leases.backend_kwargs(dict(mine.environment_kwargs), task, "s") == {"sandbox_timeout_secs": 900}
    assert "sandbox_timeout_secs=900 set in environment_kwargs wins" in caplog.text
    assert leases.lifetime_s(task) == 900
    # Docker and the local backend are left to their owner-based reapers: nothing changes, nothing is written.
    local = HarborLeases(HarborSpec(path=str(EXAMPLE_TASKS)), "suite", ledger=LeaseLedger(tmp_path / "none"))
    assert not local.tracked and local.backend_kwargs({"a": 1}, task, "s") == {"a": 1}
    assert not (tmp_path / "none").exists()


async def test_a_release_waits_for_its_leases_id_write_even_when_the_start_was_cancelled(tmp_path, monkeypatch):
    task = load_task(str(sorted(p for p in EXAMPLE_TASKS.iterdir() if p.is_dir())[0]))
    spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="e2b")
    ledger = LeaseLedger(tmp_path / "leases")
    leases = HarborLeases(spec, "suite", rollout_timeout_s=400, ledger=ledger)
    lease = await leases.intent("s-1", task)
    slow_bind = ledger.bind

    def bind_late(*args, **kwargs):  # the write, off the event loop, finishes after its start was cancelled
        time.sleep(0.3)
        slow_bind(*args, **kwargs)

    monkeypatch.setattr(ledger, "bind", bind_late)
    sandbox = type("Sandbox", (), {"sandbox_id": "sb-1"})()
    binding = asyncio.create_task(leases.bind(lease, sandbox, task))
    await asyncio.sleep(0.05)
    binding.cancel()
    with pytest.raises(asyncio.CancelledError):
        await binding
    await leases.release(lease, started=True)
    await asyncio.sleep(0.4)  # past the write, had the release not waited for it
    assert ledger.leases() == [] and leases._binding == {}


def _fake_spec(tmp_path, url: str, **fields) -> HarborSpec:
    make_task(tmp_path / "suite", "t")
    kwargs = {"url": url, "reward": 1.0, **fields.pop("environment_kwargs", {})}
    return HarborSpec(path=str(tmp_path / "suite"), import_path=FAKE, environment_kwargs=kwargs,
                      probe_verifier=False, **fields)


async def test_an_episode_leases_its_sandbox_from_intent_to_stop(tmp_path, provider, monkeypatch):
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    monkeypatch.setenv("RAYGRPO_RUN_ID", "run-episode")
    spec = _fake_spec(tmp_path, provider.url, start_timeout_s=30, stop_timeout_s=10)
    provider_ = HarborProvider(spec, name="suite", rollout_timeout_s=200)
    adapter = provider_.adapter()
    try:
        await adapter.start(list_harbor_tasks(spec, "suite")[0])
        await adapter.call("bash", {"command": "true"})
        assert await adapter.score() == 1.0
        (lease,) = LeaseLedger().leases()
        (alive,) = provider.live()
        assert lease.sandbox_id == alive["id"] and lease.run == "run-episode" and lease.backend == FAKE
        assert lease.reach == {"url": provider.url} and lease.id == safe_id(adapter.session_id)
        assert alive["labels"][LEASE_LABEL] == lease.id and alive["labels"]["io.raygrpo.run"] == "run-episode"
        lifetime = 30 + 200 + 60 + 10 + LIFETIME_MARGIN_S  # the task's verifier timeout is 60 s
        assert alive["expires"] - alive["created"] == pytest.approx(lifetime, abs=1)
        assert lease.expires == pytest.approx(time.time() + lifetime, abs=5)
    finally:
        await adapter.close()
        await provider_.aclose()
    assert LeaseLedger().leases() == [] and provider.live() == []


async def test_a_user_set_lifetime_wins(tmp_path, provider, monkeypatch):
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    spec = _fake_spec(tmp_path, provider.url, environment_kwargs={"lifetime_s": 77})
    provider_ = HarborProvider(spec, name="suite")
    adapter = provider_.adapter()
    try:
        await adapter.start(list_harbor_tasks(spec, "suite")[0])
        (alive,) = provider.live()
        assert alive["expires"] - alive["created"] == pytest.approx(77, abs=0.5)
    finally:
        await adapter.close()
        await provider_.aclose()
    assert LeaseLedger().leases() == []


async def test_a_create_whose_answer_never_came_is_stopped_by_its_label(tmp_path, provider, monkeypatch, caplog):
    """The provider holds the create's answer past the start's deadline: the sandbox exists, the client never
    learns its id; the failed start's sandbox is closed at once, which finds it by the lease's label and stops it
    before dropping the lease."""
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    provider.set_limits(hold_creates=True)
    spec = _fake_spec(tmp_path, provider.url, start_timeout_s=1)
    provider_ = HarborProvider(spec, name="suite")
    adapter = provider_.adapter()
    try:
        with pytest.raises(HarborStartError, match="did not start within"):
            await adapter.start(list_harbor_tasks(spec, "suite")[0])
        assert provider.live() == [] and LeaseLedger().leases() == []
        assert "whose start did not complete, stopped by label" in caplog.text
    finally:
        await adapter.close()
        await provider_.aclose()
        provider.set_limits(hold_creates=False)
    assert provider.live() == [] and LeaseLedger().leases() == []
    assert audit(provider.log_path).deletes == 1


async def test_a_start_cancelled_while_waiting_for_its_create_slot_leaves_no_lease(tmp_path, provider, monkeypatch):
    """The intent is written before the start waits for its slot (so the create goes out on time); a start cancelled
    in that wait never sent a create, and its record goes with the adapter."""
    from raygrpo.governor.gate import reset_gates

    reset_gates()
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    spec = _fake_spec(tmp_path, provider.url)
    provider_ = HarborProvider(spec, name="suite", limits=ProviderSpec(create_rate_per_s=0.2))
    first, second = provider_.adapter(), provider_.adapter()
    task = list_harbor_tasks(spec, "suite")[0]
    try:
        await first.start(task)  # takes the schedule's first slot; the next is 5 s later
        waiting = asyncio.ensure_future(second.start(task))
        deadline = time.time() + 10
        while len(LeaseLedger().leases()) < 2 and time.time() < deadline:
            await asyncio.sleep(0.05)
        assert len(LeaseLedger().leases()) == 2 and len(provider.live()) == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
    finally:
        await second.close()
        await first.close()
        await provider_.aclose()
        reset_gates()
    assert LeaseLedger().leases() == [] and provider.live() == []
    assert audit(provider.log_path).creates == 1


async def test_warm_sandboxes_of_a_remote_provider_are_leased_and_stopped(tmp_path, provider, monkeypatch):
    """Counted at the (fake) provider: warm sandboxes past their TTL, a warm one a rollout adopted, and a closed
    provider's warm ones are all deleted there, and their leases go with them."""
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    spec = _fake_spec(tmp_path, provider.url, warm_pool={"size": 3, "ttl_s": 1.0}, stop_timeout_s=10)
    provider_ = HarborProvider(spec, name="suite")
    ref = list_harbor_tasks(spec, "suite")[0]
    try:
        provider_.expect([ref, ref, ref])
        deadline = time.monotonic() + 20
        while provider_.warm.stats()["ready"] < 3:
            assert time.monotonic() < deadline, provider_.warm.stats()
            await asyncio.sleep(0.05)
        assert len(provider.live()) == 3 and len(LeaseLedger().leases()) == 3
        adapter = provider_.adapter()
        await adapter.start(ref)
        assert adapter.provenance == "warm"
        while provider_.warm.stats()["expired"] < 2:  # the two nobody took: stopped past their TTL
            assert time.monotonic() < deadline + 10, provider_.warm.stats()
            await asyncio.sleep(0.05)
        while len(provider.live()) > 1:  # the pool stops them in the background: wait for the deletes to land
            assert time.monotonic() < deadline + 20, provider.live()
            await asyncio.sleep(0.05)
        assert [s["id"] for s in provider.live()] == [adapter.sandbox.env.sandbox_id]
        await adapter.close()
        assert provider.live() == [] and LeaseLedger().leases() == []
        provider_.expect([ref])  # one more, left for the provider's close
        while provider_.warm.stats()["ready"] < 1:
            await asyncio.sleep(0.05)
    finally:
        await provider_.aclose()
    assert provider.live() == [] and LeaseLedger().leases() == []
    assert audit(provider.log_path).deletes == 4
