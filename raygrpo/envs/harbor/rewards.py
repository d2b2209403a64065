"""One reward from a verifier's named rewards (`reward.txt` gives one; `reward.json` may give several)."""

from __future__ import annotations

import statistics

from raygrpo.envs.base import RewardMissingError


def reduce_rewards(rewards: dict[str, float], reduce: str, key: str | None, label: str = "") -> float:
    """One reward from the verifier's named rewards (`reward.txt` gives `{"reward": x}`).

    `reduce="key"` takes `rewards[key]`; with no key, `rewards["reward"]`, else the only entry. `mean`, `sum`, `min`
    and `max` reduce every entry.

    Raises:
        RewardMissingError: There is no entry, or not the one asked for (the message lists what there is).
    """
    where = f"{label}: " if label else ""
    if not rewards:
        raise RewardMissingError(f"{where}the verifier's reward file holds no rewards")
    if reduce == "key":
        if key is None:
            if "reward" in rewards:
                key = "reward"
            elif len(rewards) == 1:
                key = next(iter(rewards))
            else:
                raise RewardMissingError(
                    f"{where}reward.json holds several rewards ({', '.join(sorted(rewards))}) and none is named "
                    "'reward': set `reward_key`, or `reward_reduce` to mean/sum/min/max"
                )
        if key not in rewards:
            raise RewardMissingError(f"{where}reward.json has no {key!r} (it has: {', '.join(sorted(rewards))})")
        return float(rewards[key])
    values = [float(v) for v in rewards.values()]
    if reduce == "mean":
        return statistics.fmean(values)
    if reduce == "sum":
        return float(sum(values))
    if reduce == "min":
        return min(values)
    if reduce == "max":
        return max(values)
    raise ValueError(f"unknown reward_reduce {reduce!r}")
