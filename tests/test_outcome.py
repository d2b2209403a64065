"""How a run went: failure causes grouped across rollouts, and DESIGN section 7's rule for a failed run."""

from __future__ import annotations

import pytest

from raygrpo.core.outcome import Outcomes, cause_of, report, verdict
from raygrpo.core.types import Status, TaskRef, Trajectory

pytestmark = pytest.mark.timeout(30)


def _traj(status: Status, error: str | None = None, reward: float | None = None) -> Trajectory:
    return Trajectory(task=TaskRef(env="e", index=0), status=status, error=error, reward=reward)


def test_the_same_failure_of_many_rollouts_is_one_cause():
    a = "ORSSessionError: envs.e.url (http://127.0.0.1:40123) task train[3]: the session is gone (HTTP 404)"
    b = "ORSSessionError: envs.e.url (http://127.0.0.1:40123) task train[17]: the session is gone (HTTP 404)"
    assert cause_of(a) == cause_of(b) != cause_of("PolicyError: boom")
    assert cause_of("sandbox raygrpo-t-3fa9c2b1d0 died") == cause_of("sandbox raygrpo-t-77aa01bc9e died")
    outcomes = Outcomes()
    for traj in [_traj(Status.ENV_ERROR, a), _traj(Status.ENV_ERROR, b), _traj(Status.POLICY_ERROR, "PolicyError: x"),
                 _traj(Status.OK, reward=1.0), _traj(Status.OK), _traj(Status.TASK_ERROR, "no reward file")]:
        outcomes.add(traj)
    causes = outcomes.causes()
    # A broken task is reported among the causes too (it is not retried: this is where its message shows).
    assert [(c["status"], c["count"]) for c in causes] == [("env_error", 2), ("policy_error", 1), ("task_error", 1)]
    assert causes[0]["example"] == a  # the first message seen, as it was
    assert outcomes.scored == 1 and dict(outcomes.status_counts) == {"env_error": 2, "policy_error": 1, "ok": 2,
                                                                     "task_error": 1}
    text = report(dict(outcomes.status_counts), causes)
    assert text.splitlines()[0] == "status: env_error 2, ok 2, policy_error 1, task_error 1"
    assert "top failure causes:" in text and f"e.g. {a}" in text


@pytest.mark.parametrize("counts, scored, fail_fraction, failed", [
    ({"ok": 31, "env_error": 1}, 31, 0.25, False),           # one failure in many
    ({"policy_error": 4}, 0, 0.25, True),                     # nothing scored, some failed
    ({"ok": 4}, 0, 0.25, False),                              # nothing scored, nothing failed: the model's doing
    ({"ok": 6, "timeout": 2, "env_error": 2}, 6, 0.25, True),  # 4/10 > 0.25
    ({"ok": 6, "timeout": 2, "env_error": 2}, 6, 0.5, False),
    ({"ok": 3, "task_error": 5}, 3, 0.25, False),              # a task that writes no reward is not infrastructure
    ({"task_error": 4}, 0, 0.25, True),                       # ... but a run of nothing else measured nothing
    ({}, 0, 0.25, False),
])
def test_verdict(counts, scored, fail_fraction, failed):
    result = verdict(counts, scored, fail_fraction)
    assert result.failed is failed and bool(result.reason) is failed


#: The same tool crash in two ORS sessions: the SDK names each session's sid (a UUID) in the message.
CRASH = ("ORSSessionError: envs.misc.environment (http://127.0.0.1:44253) task train[2]: call 'crash' failed on the "
         "server: (environment session sid={sid}) upstream judge unavailable")
SIDS = ("2aa3b985-7391-4f31-902a-6355fcb3e11f", "e252ac95-9638-436f-8903-c429b2fc1843")


def test_the_same_crash_in_sessions_with_different_uuids_is_one_cause():
    first, second = (CRASH.format(sid=sid) for sid in SIDS)
    assert cause_of(first) == cause_of(second)
    assert "sid=ID)" in cause_of(first) and "4f31" not in cause_of(first)
    assert cause_of(CRASH.format(sid=SIDS[0].upper())) == cause_of(first)


def test_a_retry_that_failed_as_before_but_in_another_session_is_not_retried_again():
    from raygrpo.driver.attempts import RolloutRequest, next_attempt, should_retry

    first, second = (CRASH.format(sid=sid) for sid in SIDS)
    request = RolloutRequest(TaskRef(env="misc", index=2), "g")
    assert should_retry(request, _traj(Status.ENV_ERROR, first), max_retries=3)
    retry = next_attempt(request, first)
    assert not should_retry(retry, _traj(Status.ENV_ERROR, second), max_retries=3)
    other = second.replace("upstream judge unavailable", "database connection lost")
    assert should_retry(retry, _traj(Status.ENV_ERROR, other), max_retries=3)
