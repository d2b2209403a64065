"""Whether an env pool actor still answers: the driver probes each live actor, and one silent too long is unreachable.

Why the driver probes (rather than the actors pushing heartbeats): what matters is whether this driver can still
get results from the actor, and a probe (`EnvPool.ping`, an ordinary actor call) travels exactly the path a
rollout's result takes, both ways. A heartbeat pushed by the actor would need a receiver actor (the orchestrator is
plain code on the driver, not an actor), and that receiver being reachable says nothing about the driver's own
connection. A probe costs one Ray call per actor every `heartbeat_s`; at most one is in flight per actor.

`Reachability` is plain bookkeeping over a monotonic clock, kept per actor in its `PoolSlot`; `ElasticPool` sends
the probes and reads their answers. Ray's own node health check (~30 s by default) still declares a dead node dead;
this only notices sooner, so the actor's rollouts in flight can run again elsewhere (`Orchestrator`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from raygrpo.config.run import WorkersConfig

#: Seconds between probes of one actor, and silence after which it is unreachable, by default: the config's
#: (`workers.heartbeat_s`, `workers.unreachable_after_s`).
HEARTBEAT_S: float = WorkersConfig.model_fields["heartbeat_s"].default
UNREACHABLE_AFTER_S: float = WorkersConfig.model_fields["unreachable_after_s"].default


@dataclass
class Reachability:
    """When an actor last answered a probe, and the probe now in flight.

    Args:
        last_answer: When it last answered (monotonic seconds): a probe, or its start.
        probe_ref: The probe in flight (None: none).
        probe_sent: When that probe was sent.
    """

    last_answer: float = field(default_factory=time.monotonic)
    probe_ref: Any = None
    probe_sent: float = 0.0

    def due(self, now: float, heartbeat_s: float) -> bool:
        """Whether to send a probe now: none is in flight and the last answer is `heartbeat_s` old."""
        return self.probe_ref is None and now - max(self.last_answer, self.probe_sent) >= heartbeat_s

    def sent(self, ref: Any, now: float) -> None:
        self.probe_ref, self.probe_sent = ref, now

    def answered(self, now: float) -> None:
        """The probe in flight answered (or the actor became live)."""
        self.probe_ref, self.last_answer = None, now

    def silent_for(self, now: float) -> float:
        """Seconds since its last answer."""
        return now - self.last_answer

    def unreachable(self, now: float, unreachable_after_s: float) -> bool:
        """Whether it has been silent for longer than `unreachable_after_s` with a probe unanswered (an actor that
        was simply not asked is not silent)."""
        return self.probe_ref is not None and self.silent_for(now) > unreachable_after_s
