"""What a Harbor verifier leaves behind, in every trajectory and in the run folder: `test.sh`'s exit code, the end of
its output, the raw rewards before reduction, and the sandbox's `/logs` of failed verifications (size-bounded), so
that a `pytest: command not found` can be told apart from a wrong answer."""

from __future__ import annotations

import json
import subprocess

import pytest

from raygrpo.driver.collect import collect
from raygrpo.config import load_config
from tests.harbor_utils import EXAMPLE_TASKS, bash_script, make_task
from tests.test_harbor_adapter import nothing_left, renderer, rollout, root, spec_for  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)

CHECK = """#!/bin/bash
cat > /tmp/check_out.py <<'END'
assert open("/app/out.txt").read().strip() == "ok", "out.txt does not say ok"
print("1 passed")
END
echo "collecting the tests"
if {runner} /tmp/check_out.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


async def test_a_right_answer_keeps_exit_code_output_and_raw_rewards_but_no_logs(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t", test_sh=CHECK.format(runner="python3"))
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo ok > /app/out.txt"))
    assert traj.reward == 1.0, traj.error
    verifier = traj.verifier
    assert verifier["exit_code"] == 0 and verifier["rewards"] == {"reward": 1.0}
    assert "collecting the tests" in verifier["output_tail"] and "1 passed" in verifier["output_tail"]
    assert "logs" not in verifier  # keep_logs="failed": a passed verification keeps none
    await nothing_left(root)


async def test_a_wrong_answer_keeps_the_sandbox_logs(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t", test_sh=CHECK.format(runner="python3")
              + "echo extra evidence > /logs/verifier/notes.txt\nexit 3\n")
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo nope > /app/out.txt"))
    assert traj.reward == 0.0
    verifier = traj.verifier
    assert verifier["exit_code"] == 3 and verifier["rewards"] == {"reward": 0.0}
    assert "AssertionError: out.txt does not say ok" in verifier["output_tail"]
    logs = verifier["logs"]
    assert list(logs)[0] == "verifier/test-stdout.txt"  # the test output first
    assert logs["verifier/notes.txt"] == "extra evidence\n" and logs["verifier/reward.txt"] == "0\n"
    await nothing_left(root)


async def test_a_verifier_that_cannot_run_shows_why_in_its_output(renderer, root, tmp_path):
    """The tests' runner is missing from the start: the 0.0 test.sh writes is not the model's (`verifier_error`), and
    the output and the kept logs say what happened."""
    make_task(tmp_path / "suite", "t", test_sh=CHECK.format(runner="no-such-runner"))
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo ok > /app/out.txt"))
    assert traj.status.value == "verifier_error" and traj.reward is None
    assert traj.verifier["rewards"] == {"reward": 0.0} and traj.verifier["exit_code"] == 0
    assert "no-such-runner: command not found" in traj.verifier["output_tail"]
    assert "no-such-runner: command not found" in traj.verifier["logs"]["verifier/test-stdout.txt"]
    await nothing_left(root)


async def test_no_reward_and_a_timeout_keep_their_evidence(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "silent", test_sh="#!/bin/bash\necho 'ran, but the reward line is missing'\n")
    make_task(tmp_path / "slow", "hung", test_sh="#!/bin/bash\necho 'started the slow check'\nsleep 60\n")
    silent = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo ok > /app/out.txt"))
    assert silent.status.value == "task_error" and silent.verifier["rewards"] is None
    assert silent.verifier["exit_code"] == 0 and "reward line is missing" in silent.verifier["output_tail"]
    hung = await rollout(spec_for(tmp_path / "slow", root, verifier_timeout_s=2), renderer,
                         bash_script("echo ok > /app/out.txt"))
    assert hung.status.value == "timeout" and hung.verifier["exit_code"] is None
    assert "started the slow check" in hung.verifier["output_tail"]
    await nothing_left(root)


async def test_kept_logs_are_bounded(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t", test_sh=(
        "#!/bin/bash\nfor i in $(seq 1 4000); do echo \"line $i of a long test log\"; done\n"
        "head -c 5000 /dev/zero > /logs/verifier/zeros.bin\necho 0 > /logs/verifier/reward.txt\n"))
    traj = await rollout(spec_for(tmp_path / "suite", root, keep_logs_kib=4), renderer, bash_script("true"))
    logs = traj.verifier["logs"]
    assert sum(len(text) for text in logs.values()) <= 4 * 1024 + 16
    assert logs["verifier/test-stdout.txt"].startswith("[...]\n")
    assert logs["verifier/test-stdout.txt"].endswith("line 4000 of a long test log\n")  # the end is what is kept
    assert set(traj.verifier["logs_omitted"]) == {"verifier/zeros.bin", "verifier/reward.txt"}
    assert len(traj.verifier["output_tail"]) <= 2000 + 6
    none = await rollout(spec_for(tmp_path / "suite", root, keep_logs="none"), renderer, bash_script("true"))
    assert "logs" not in none.verifier and none.verifier["output_tail"]
    await nothing_left(root)


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_run_folder_holds_the_logs_of_failed_verifications(ray_local, tmp_path):
    cfg = load_config("examples/harbor_local/rollout.yaml", [
        f"envs.local.path={EXAMPLE_TASKS}", "envs.local.num_tasks=2", "policy.kind=scripted",
        "policy.script=policies.py:wrong", "rollout.group_size=1"])
    out = tmp_path / "out"
    summary = collect(cfg, out, progress=False)
    assert summary["completed"] == 2 and summary["reward_mean"] == 0.0
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    for line in lines:
        verifier = line["verifier"]
        assert "logs" not in verifier  # the files, not the line, hold them
        folder = out / verifier["logs_dir"]
        assert folder.parent == out / "verifier_logs"
        assert (folder / "verifier" / "reward.txt").read_text() == "0\n"
        assert (folder / "verifier" / "test-stdout.txt").is_file()


# ── verifier_error only on evidence gathered before the model acted ───────────────────────────────────────────────

CHECKER = "#!/bin/bash\n[ \"$(cat /app/out.txt 2>/dev/null)\" = ok ]\n"
CHECKER_TEST = """#!/bin/bash
if check-out; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def checker_task(root, name: str, *, provided: bool):
    """A task whose verifier runs `check-out`, a tool its image provides (or, broken, does not)."""
    dockerfile = "FROM debian:bookworm-slim\nWORKDIR /app\nENV PATH=/opt/tools:$PATH\n"
    files = {}
    if provided:
        dockerfile += "COPY --chmod=755 check-out /opt/tools/check-out\n"
        files = {"check-out": CHECKER}
    task = make_task(root, name, test_sh=CHECKER_TEST, dockerfile=dockerfile)
    for rel, text in files.items():
        (task / "environment" / rel).write_text(text)
    return task


async def test_a_model_that_deletes_the_verifiers_tool_gets_its_zero(renderer, root, tmp_path):
    checker_task(tmp_path / "suite", "t", provided=True)
    spec = spec_for(tmp_path / "suite", root)
    right = await rollout(spec, renderer, bash_script("echo ok > /app/out.txt"))
    assert right.reward == 1.0 and "tooling_missing" not in right.verifier
    gamed = await rollout(spec, renderer, bash_script("rm /opt/tools/check-out"))
    assert gamed.status.value == "ok" and gamed.reward == 0.0
    assert "check-out: command not found" in gamed.verifier["output_tail"]
    await nothing_left(root)


async def test_an_import_error_of_the_models_module_is_its_zero(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t", dockerfile="FROM python:3.12-slim\nWORKDIR /app\n", test_sh="""#!/bin/bash
cd /app
if python3 -c "import solution; assert solution.answer() == 42"; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
""")
    spec = spec_for(tmp_path / "suite", root)
    missing = await rollout(spec, renderer, bash_script("true"))
    assert missing.status.value == "ok" and missing.reward == 0.0
    assert "No module named 'solution'" in missing.verifier["output_tail"]
    right = await rollout(spec, renderer, bash_script("printf 'def answer():\\n    return 42\\n' > /app/solution.py"))
    assert right.reward == 1.0
    await nothing_left(root)


async def test_tooling_missing_at_start_is_a_verifier_error_not_a_zero(renderer, root, tmp_path):
    checker_task(tmp_path / "suite", "t", provided=False)
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo ok > /app/out.txt"))
    assert traj.status.value == "verifier_error" and traj.reward is None
    assert "the command `check-out`" in traj.error and "before the model acted" in traj.error
    assert traj.verifier["tooling_missing"] == ["the command `check-out`"]
    assert "check-out: command not found" in traj.verifier["output_tail"]
    assert traj.verifier["rewards"] == {"reward": 0.0}  # what the verifier wrote, kept as evidence
    # Told not to probe, the verifier's verdict stands, whatever it is.
    unprobed = await rollout(spec_for(tmp_path / "suite", root, probe_verifier=False), renderer,
                             bash_script("echo ok > /app/out.txt"))
    assert unprobed.status.value == "ok" and unprobed.reward == 0.0 and "tooling_missing" not in unprobed.verifier
    await nothing_left(root)


ONLY_WHEN_DEBUGGING = """#!/bin/bash
if [ "$(cat /app/out.txt 2>/dev/null)" = ok ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
if [ -n "$VERIFIER_DEBUG" ]; then report-tool /app/out.txt; fi
"""


@pytest.mark.timeout(120)
async def test_a_missing_command_the_verifier_never_ran_into_does_not_set_its_verdict_aside(renderer, root, tmp_path):
    """Issue 43: the pre-agent probe finds `report-tool` missing, but test.sh only runs it when debugging. The
    verifier's shell never missed it (bash's `command_not_found_handle`), so a wrong answer's 0.0 stands; run with
    the debugging switch on, bash misses it, and the 0.0 is set aside as before."""
    make_task(tmp_path / "suite", "t", test_sh=ONLY_WHEN_DEBUGGING)
    spec = spec_for(tmp_path / "suite", root)
    wrong = await rollout(spec, renderer, bash_script("echo no > /app/out.txt"))
    assert wrong.status.value == "ok" and wrong.reward == 0.0, wrong.error
    assert wrong.verifier["tooling_missing"] == ["the command `report-tool`"]
    assert "missing_at_verify" not in wrong.verifier
    make_task(tmp_path / "debug", "t", test_sh=ONLY_WHEN_DEBUGGING.replace('-n "$VERIFIER_DEBUG"', "1 = 1"))
    hit = await rollout(spec_for(tmp_path / "debug", root), renderer, bash_script("echo no > /app/out.txt"))
    assert hit.status.value == "verifier_error" and hit.reward is None
    assert hit.verifier["missing_at_verify"] == ["report-tool"]
    await nothing_left(root)


BY_PATH = """#!/bin/bash
if /opt/tools/check-out; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


async def test_a_tool_run_by_its_path_missing_at_start_is_a_verifier_error(renderer, root, tmp_path):
    """Bash never calls `command_not_found_handle` for a path: its own `No such file or directory` line for a path
    the probe found missing is what confirms it (a venv's `/opt/verifier-venv/bin/pytest` a skipped `RUN` did not
    make). Where the image has the tool, a wrong answer keeps its 0.0."""
    for name, provided in (("missing", False), ("there", True)):
        checker_task(tmp_path / name, "t", provided=provided)
        (tmp_path / name / "t" / "tests" / "test.sh").write_text(BY_PATH)
    broken = await rollout(spec_for(tmp_path / "missing", root), renderer, bash_script("echo ok > /app/out.txt"))
    assert broken.status.value == "verifier_error" and broken.reward is None, broken.verifier
    assert "before the model acted: the command `/opt/tools/check-out`;" in broken.error
    assert broken.verifier["missing_at_verify"] == ["/opt/tools/check-out"]
    assert "/opt/tools/check-out: No such file or directory" in broken.verifier["output_tail"]
    wrong = await rollout(spec_for(tmp_path / "there", root), renderer, bash_script("echo no > /app/out.txt"))
    assert wrong.status.value == "ok" and wrong.reward == 0.0 and "tooling_missing" not in wrong.verifier
    await nothing_left(root)


BUILD_IT = """#!/bin/bash
if [ "$(wordstat /app/in.txt 2>/dev/null)" = "2 3" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


async def test_a_command_the_instruction_asks_for_is_the_models_to_make(renderer, root, tmp_path):
    """The probe runs before the model acts, so the CLI the model is asked to make is missing then: named by the
    instruction, it is not the verifier's tooling, and a model that does not make it gets its 0.0."""
    make_task(tmp_path / "suite", "t", test_sh=BUILD_IT, files={"in.txt": "a b\nc\n"},
              instruction="Create an executable command `wordstat` in `/app/bin` (on `PATH`): `wordstat FILE` prints "
                          "the numbers of lines and words of FILE.",
              dockerfile="FROM python:3.12-slim\nWORKDIR /app\nCOPY in.txt /app/in.txt\nRUN mkdir -p /app/bin\n"
                         "ENV PATH=/app/bin:$PATH\n")
    spec = spec_for(tmp_path / "suite", root)
    noop = await rollout(spec, renderer, bash_script())
    assert noop.status.value == "ok" and noop.reward == 0.0, noop.error
    assert "tooling_missing" not in noop.verifier
    made = await rollout(spec, renderer, bash_script(
        "printf '#!/bin/bash\\necho $(wc -l < $1) $(wc -w < $1)\\n' > /app/bin/wordstat && chmod +x /app/bin/wordstat"))
    assert made.reward == 1.0, made.verifier
    await nothing_left(root)


def demo_wheel(folder) -> None:
    """`raygrpo_demo-1.0-py3-none-any.whl` (module `raygrpo_demo`) in `folder`, for `pip install --no-index`."""
    import base64
    import hashlib
    import zipfile

    files = {"raygrpo_demo/__init__.py": "VALUE = 1\n",
             "raygrpo_demo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: raygrpo-demo\nVersion: 1.0\n",
             "raygrpo_demo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                                 "Tag: py3-none-any\n"}

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(text)},{len(text.encode())}\n" for path, text in files.items())
    files["raygrpo_demo-1.0.dist-info/RECORD"] = record + "raygrpo_demo-1.0.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "raygrpo_demo-1.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


PIP_IN_TEST = """#!/bin/bash
python3 -m pip install --user --break-system-packages --no-index --find-links /tests/wheels raygrpo-demo==1.0
if python3 -c "import raygrpo_demo" && [ "$(cat /app/out.txt 2>/dev/null)" = ok ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


@pytest.mark.skipif(subprocess.run(["/usr/bin/python3", "-m", "pip", "--version"], capture_output=True).returncode != 0,
                    reason="the host's /usr/bin/python3 (the sandbox's without the toolbox) has no pip")
async def test_a_package_test_sh_pip_installs_counts_only_when_its_install_fails(renderer, root, tmp_path):
    """A package test.sh `pip install`s is checked in the sandbox's python3 before the model acts, like a `--with`
    spec: missing, and still missing after the verifier ran (its install failed), it is `verifier_error` naming it;
    installed by test.sh, a wrong answer keeps its 0.0."""
    for name in ("installs", "fails"):
        make_task(tmp_path / name, "t", test_sh=PIP_IN_TEST)
    demo_wheel(tmp_path / "installs" / "t" / "tests" / "wheels")
    bare = {"environment_kwargs": {"toolbox": False}}  # the host's python3, whose pip can install for the user
    installs = spec_for(tmp_path / "installs", root, **bare)
    wrong = await rollout(installs, renderer, bash_script("echo no > /app/out.txt"))
    assert wrong.status.value == "ok" and wrong.reward == 0.0, wrong.error
    assert wrong.verifier["tooling_missing"] == ["the Python package `raygrpo-demo==1.0`"]
    right = await rollout(installs, renderer, bash_script("echo ok > /app/out.txt"))
    assert right.reward == 1.0, right.verifier
    failed = await rollout(spec_for(tmp_path / "fails", root, **bare), renderer, bash_script("echo ok > /app/out.txt"))
    assert failed.status.value == "verifier_error" and failed.reward is None
    assert "before the model acted: the Python package `raygrpo-demo==1.0`;" in failed.error
    await nothing_left(root)


# ── the local backend's verifier toolbox ──────────────────────────────────────────────────────────────────────────

PYTEST_CTRF = """#!/bin/bash
mkdir -p /logs/verifier
cat > /tmp/test_outputs.py <<'END'
def test_out():
    assert open("/app/out.txt").read().strip() == "ok"
END
python --version
if pytest --ctrf /logs/verifier/ctrf.json /tmp/test_outputs.py -rA; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


async def test_pytest_with_ctrf_and_a_python_alias_come_from_the_toolbox(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t", test_sh=PYTEST_CTRF)
    spec = spec_for(tmp_path / "suite", root)
    right = await rollout(spec, renderer, bash_script("echo ok > /app/out.txt"))
    assert right.reward == 1.0, right.verifier
    assert "1 passed" in right.verifier["output_tail"] and "Python 3" in right.verifier["output_tail"]
    wrong = await rollout(spec, renderer, bash_script("echo no > /app/out.txt"))
    assert wrong.reward == 0.0 and '"failed": 1' in wrong.verifier["logs"]["verifier/ctrf.json"]
    # Without the toolbox the host's own tools are all there is (no pytest here): known before the model acts.
    bare = await rollout(spec_for(tmp_path / "suite", root, environment_kwargs={"toolbox": False}), renderer,
                         bash_script("echo ok > /app/out.txt"))
    host_has_them = subprocess.run(["/usr/bin/python3", "-c", "import pytest, ctrf"], capture_output=True).returncode
    if host_has_them != 0:
        assert bare.status.value == "verifier_error" and "the command `pytest`" in bare.error, bare.error
    else:  # a host with pytest and the plugin of its own
        assert bare.reward == 1.0
    await nothing_left(root)


# ── offline test tooling: Harbor's download-at-test-time template ────────────────────────────────────────────────


def harbor_template_task(root, name: str, extra_with: str = ""):
    """A task as `harbor tasks init --verifier-mode shared` writes it, filled in: its test.sh downloads curl, the uv
    installer and, through uvx, pytest and pytest-json-ctrf when it runs."""
    from harbor.cli.tasks import init

    init(name=f"acme/{name}", tasks_dir=root, verifier_mode="shared")
    task = root / name
    (task / "instruction.md").write_text("Write ok to /app/out.txt.\n")
    (task / "tests" / "test_outputs.py").write_text(
        'def test_out():\n    assert open("/app/out.txt").read().strip() == "ok"\n')
    if extra_with:
        test_sh = task / "tests" / "test.sh"
        test_sh.write_text(test_sh.read_text().replace("--with pytest==8.4.1", f"--with pytest==8.4.1 {extra_with}"))
    return task


@pytest.mark.timeout(180)
async def test_harbors_template_offline_scores_and_a_missing_package_is_named(renderer, root, tmp_path):
    harbor_template_task(tmp_path / "suite", "tmpl")
    harbor_template_task(tmp_path / "more", "needs-more", extra_with="--with nosuchpkg==1.0")
    offline = spec_for(tmp_path / "suite", root, offline_tooling=True)
    right = await rollout(offline, renderer, bash_script("echo ok > /app/out.txt"))
    assert right.status.value == "ok" and right.reward == 1.0, right.verifier
    assert "uv (raygrpo offline tooling) installed" in right.verifier["output_tail"]
    wrong = await rollout(offline, renderer, bash_script("echo no > /app/out.txt"))
    assert wrong.status.value == "ok" and wrong.reward == 0.0
    assert '"failed": 1' in wrong.verifier["logs"]["verifier/ctrf.json"]
    # Without it, the template cannot download here: known before the model acted, so no 0.0.
    online = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo ok > /app/out.txt"))
    assert online.status.value == "verifier_error", online.verifier
    assert "https://astral.sh/uv/0.9.7/install.sh (unreachable)" in online.error
    # A package the sandbox's python3 does not have is named, not scored.
    more = await rollout(spec_for(tmp_path / "more", root, offline_tooling=True), renderer,
                         bash_script("echo ok > /app/out.txt"))
    assert more.status.value == "verifier_error" and "`nosuchpkg==1.0`" in more.error
    assert "nosuchpkg==1.0 is not installed in the sandbox's python3" in more.verifier["output_tail"]
    await nothing_left(root)
