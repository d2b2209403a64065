"""Trial dirs: every sandbox gets its own path holding only the empty layout, however the last one was left."""

from __future__ import annotations

import os

from raygrpo.envs.harbor.trial import TrialDir, keep_fresh, remove_spares


def _tree(path: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, dirs, files in os.walk(path) for n in dirs + files)


async def test_a_reused_trial_dir_is_empty_and_has_a_new_path():
    first = TrialDir.make("task")
    (first.paths.verifier_dir / "reward.txt").write_text("1.0\n")
    (first.paths.trial_dir / "compose.yaml").write_text("x")
    await first.remove()
    assert not os.path.exists(first.path)
    second = TrialDir.make("task")
    assert second.path != first.path
    assert _tree(second.path) == ["agent", "artifacts", "verifier"]
    assert not second.paths.reward_text_path.exists()
    await second.remove()
    remove_spares()


async def test_changed_subtrees_modes_and_mounted_dirs_are_removed_not_reused():
    a = TrialDir.make("task")
    (a.paths.agent_dir / "sub").mkdir()
    b = TrialDir.make("task")
    b.paths.verifier_dir.chmod(0o777)
    c = TrialDir.make("task")
    keep_fresh(c.paths.trial_dir)
    for trial in (a, b, c):
        await trial.remove()
        assert not os.path.exists(trial.path)
    d = TrialDir.make("task")
    assert _tree(d.path) == ["agent", "artifacts", "verifier"]
    assert oct(os.stat(d.paths.verifier_dir).st_mode & 0o777) != oct(0o777)
    await d.remove()
    remove_spares()
