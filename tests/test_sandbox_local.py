"""The local sandbox backend, driven through Harbor's own factory and verifier; leaks checked through /proc."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harbor.verifier.verifier import Verifier

from raygrpo.sandbox import process as _process
from raygrpo.sandbox import owners as _registry
from raygrpo.sandbox.dockerfile import DockerfileError, parse_dockerfile
from raygrpo.sandbox.errors import SandboxStartError
from raygrpo.sandbox.local import (
    LocalSandboxEnvironment,
    SandboxExecTimeoutError,
    SandboxNotRunningError,
)
from raygrpo.sandbox.owners import live_sandboxes
from raygrpo.sandbox.toolbox import toolbox_path
from tests.sandbox_utils import (
    assert_no_leaks,
    make_env,
    make_task,
    pid_namespace,
    pids_in_namespace,
    processes_mentioning,
    wait_until,
)

RICH_DOCKERFILE = """\
# syntax=docker/dockerfile:1
FROM python:3.12-slim
ARG TOOL_VERSION=1.2
ENV APP_MODE=test \\
    GREETING="hello world"
ENV LEGACY_STYLE some value $TOOL_VERSION
ENV PATH=/opt/tool/bin:$PATH
WORKDIR /opt/project
WORKDIR src
RUN apt-get update && \\
    apt-get install -y --no-install-recommends curl
COPY data.txt ./
COPY --chown=1000:1000 conf/ ../conf/
COPY ["data.txt", "/data/copy2.txt"]
COPY --chmod=755 <<EOF /app/run.sh
#!/bin/sh
echo mode=$APP_MODE
EOF
RUN echo done > ran.txt && echo "$APP_MODE" >> ran.txt
CMD ["python3"]
"""


@pytest.fixture
def sroot(tmp_path: Path) -> Path:
    """A sandbox root of this test's own (never the shared default), checked for leaks at the end."""
    root = tmp_path / "sandboxes"
    yield root
    assert_no_leaks(root)


@pytest.mark.timeout(60)
async def test_start_exec_upload_download_stop(tmp_path: Path, sroot: Path):
    task = make_task(tmp_path)
    env, _, _ = make_env(task, tmp_path / "trials", sroot)
    assert isinstance(env, LocalSandboxEnvironment)
    t0 = time.perf_counter()
    await env.start(force_build=False)
    start_s = time.perf_counter() - t0
    try:
        ns = pid_namespace(env.init_pid)
        assert ns != pid_namespace(os.getpid())
        r = await env.exec("pwd; cat data.txt; echo err >&2; exit 3")
        assert (r.stdout, r.stderr, r.return_code) == ("/app\npayload\n", "err\n", 3)
        r = await env.exec("echo $X-$HOME; pwd", cwd="/tmp", env={"X": "y"})
        assert r.stdout == "y-/root\n/tmp\n"
        # The host's filesystem is read-only; the sandbox's own dirs are writable; its PIDs are its own.
        r = await env.exec("touch /usr/x 2>&1; echo $?; touch /workdir/a /logs/a /tests/a /solution/a /home/user/a")
        assert "Read-only file system" in r.stdout and r.stdout.strip().endswith("1") and r.return_code == 0
        r = await env.exec("ps -o pid= -p 1 && readlink /proc/1/exe && ls /work 2>&1 | head -1")
        assert "No such file" in r.stdout

        src = tmp_path / "up.txt"
        src.write_text("uploaded\n")
        await env.upload_file(src, "/workdir/in/up.txt")
        await env.upload_file(src, "/home/user/")
        updir = tmp_path / "updir"
        (updir / "sub").mkdir(parents=True)
        (updir / "sub" / "f.txt").write_text("deep\n")
        await env.upload_dir(updir, "/tests")
        r = await env.exec("cat /workdir/in/up.txt /home/user/up.txt /tests/sub/f.txt")
        assert r.stdout == "uploaded\nuploaded\ndeep\n"

        await env.exec("mkdir -p /app/out/x && echo o > /app/out/x/o.txt && echo r > /app/result.txt")
        await env.download_file("/app/result.txt", tmp_path / "dl" / "result.txt")
        await env.download_dir("/app/out", tmp_path / "dl" / "out")
        assert (tmp_path / "dl" / "result.txt").read_text() == "r\n"
        assert (tmp_path / "dl" / "out" / "x" / "o.txt").read_text() == "o\n"
        # Host paths outside the sandbox's own dirs go through the sandbox (read-only ones can be read).
        await env.download_file("/etc/hostname", tmp_path / "dl" / "hostname")
        assert (tmp_path / "dl" / "hostname").exists()
        with pytest.raises(RuntimeError, match="read-only"):
            await env.upload_file(src, "/usr/share/up.txt")
        # A symlink the sandbox made must not redirect an upload on the host.
        await env.exec("ln -s /etc /app/etc-link")
        with pytest.raises(RuntimeError):
            await env.upload_file(src, "/app/etc-link/evil.txt")
        assert not Path("/etc/evil.txt").exists()

        t0 = time.perf_counter()
        for _ in range(5):
            await env.exec("true")
        exec_s = (time.perf_counter() - t0) / 5
        host_dir = env.host_dir
        assert host_dir is not None and host_dir.exists()
    finally:
        t0 = time.perf_counter()
        await env.stop(delete=True)
        stop_s = time.perf_counter() - t0
    assert not host_dir.exists()
    assert pids_in_namespace(ns) == []
    with pytest.raises(SandboxNotRunningError):
        await env.exec("true")
    await env.stop(delete=True)  # idempotent
    print(f"local sandbox: start {start_s * 1000:.0f} ms, exec {exec_s * 1000:.1f} ms, stop {stop_s * 1000:.0f} ms")


@pytest.mark.timeout(60)
async def test_dockerfile_workdir_env_and_copies(tmp_path: Path, sroot: Path, caplog):
    task = make_task(tmp_path, dockerfile=RICH_DOCKERFILE, files={"conf/app.ini": "k=v\n"})
    caplog.set_level(logging.WARNING, logger="raygrpo.sandbox.dockerfile")
    envs = [make_env(task, tmp_path / "trials", sroot)[0] for _ in range(2)]
    for env in envs:
        await env.start(force_build=False)
    try:
        r = await envs[0].exec(
            "pwd; echo $APP_MODE/$GREETING/$LEGACY_STYLE; echo $PATH; cat data.txt ../conf/app.ini /data/copy2.txt; "
            "/app/run.sh; ls -A /opt"
        )
        lines = r.stdout.splitlines()
        assert lines[0] == "/opt/project/src"
        assert lines[1] == "test/hello world/some value 1.2"
        # The verifier toolbox first, then the Dockerfile's PATH.
        assert lines[2].startswith(f"{toolbox_path() / 'bin'}:/opt/tool/bin:/usr/local/sbin:")
        assert lines[3:7] == ["payload", "k=v", "payload", "mode=test"]
        # /opt is a read-only host dir: made writable for WORKDIR, with every host entry still there (whatever its
        # mode: docker.io's /opt/containerd is 711) next to the sandbox's own `project`.
        assert sorted(lines[7:]) == sorted({p.name for p in Path("/opt").iterdir()} | {"project"})
        # The RUN that makes a file ran (from its WORKDIR, with the ENV of its step); the one installing curl did not.
        assert (await envs[0].exec("cat ran.txt")).stdout == "done\ntest\n"
        # Each sandbox has its own copy.
        await envs[0].exec("echo changed > data.txt")
        assert (await envs[1].exec("cat data.txt")).stdout == "payload\n"
    finally:
        for env in envs:
            await env.stop(delete=True)
    runs = [r for r in caplog.records if "RUN step" in r.getMessage()]
    assert len(runs) == 1, "skipped RUN steps are reported once per task, not per sandbox"
    assert "install commands of 1 RUN step(s) skipped (line 10)" in runs[0].getMessage()
    # The base image is not what the sandbox runs: said once per task as well.
    froms = [r.getMessage() for r in caplog.records if "FROM" in r.getMessage()]
    assert len(froms) == 1 and ":2: FROM not applied" in froms[0] and "python:3.12-slim is not pulled" in froms[0]


ROOT_COPIES_DOCKERFILE = """\
FROM python:3.12-slim
COPY config.json /config.json
COPY entrypoint.sh /
COPY a.txt b.txt /
COPY rootfs/ /
COPY <<EOF /inline.txt
inline
EOF
RUN chmod +x /entrypoint.sh
WORKDIR /app
"""


@pytest.mark.timeout(60)
async def test_copies_into_the_root_land_there(tmp_path: Path, sroot: Path):
    """The sandbox's `/` is a tmpfs: files copied into it (`COPY entrypoint.sh /entrypoint.sh`, very common) are
    bound in one by one, a directory's contents become directories of their own, as a build puts them there."""
    files = {"config.json": '{"port": 5432}\n', "entrypoint.sh": "#!/bin/sh\necho entry\n", "a.txt": "A\n",
             "b.txt": "B\n", "rootfs/srv-data/x.txt": "X\n", "rootfs/top.txt": "T\n"}
    task = make_task(tmp_path, dockerfile=ROOT_COPIES_DOCKERFILE, files=files)
    env, _, _ = make_env(task, tmp_path / "trials", sroot)
    await env.start(force_build=False)
    try:
        r = await env.exec("cat /config.json /a.txt /b.txt /srv-data/x.txt /top.txt /inline.txt; /entrypoint.sh; "
                           "echo changed > /config.json && cat /config.json")
        assert r.return_code == 0, r.stderr
        assert r.stdout == '{"port": 5432}\nA\nB\nX\nT\ninline\nentry\nchanged\n'
    finally:
        await env.stop(delete=True)


ENTRYPOINT_DOCKERFILE = """\
FROM python:3.12-slim
COPY status_server.py /opt/status/status_server.py
COPY entrypoint.sh /entrypoint.sh
RUN chmod +x /entrypoint.sh
ENV GREETING=hello
WORKDIR /app
ENTRYPOINT ["/entrypoint.sh"]
CMD ["python3", "-c", "print('the CMD ran')"]
"""
ENTRYPOINT_SH = """#!/bin/bash
set -euo pipefail
echo "$GREETING from $(pwd), args: $*" > /tmp/entrypoint.txt
python3 /opt/status/status_server.py &
exec "$@"
"""
STATUS_SERVER = """import http.server


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"fleet=green\\n")


http.server.HTTPServer(("127.0.0.1", 8765), Handler).serve_forever()
"""


@pytest.mark.timeout(60)
async def test_the_entrypoint_starts_with_harbors_arguments_as_on_docker(tmp_path: Path, sroot: Path, caplog):
    """The service an `entrypoint.sh` starts before `exec "$@"` is up, as on Harbor's docker backend: the
    ENTRYPOINT runs in the background with `sh -c "sleep infinity"` (what Harbor runs in place of CMD) as its
    arguments, with the Dockerfile's ENV and WORKDIR; the CMD does not run; it all goes with the sandbox."""
    task = make_task(tmp_path, dockerfile=ENTRYPOINT_DOCKERFILE,
                     files={"status_server.py": STATUS_SERVER, "entrypoint.sh": ENTRYPOINT_SH})
    caplog.set_level(logging.INFO, logger="raygrpo.sandbox.dockerfile")
    env, _, _ = make_env(task, tmp_path / "trials", sroot)
    await env.start(force_build=False)
    try:
        fetch = ("for i in $(seq 50); do python3 -c 'import urllib.request as u; "
                 "print(u.urlopen(\"http://127.0.0.1:8765/status\", timeout=1).read().decode(), end=\"\")' "
                 "2>/dev/null && break; sleep 0.1; done; cat /tmp/entrypoint.txt; ps -eo args")
        r = await env.exec(fetch)
        lines = r.stdout.splitlines()
        assert lines[:2] == ["fleet=green", "hello from /app, args: sh -c sleep infinity"], r.stdout
        assert "sh -c sleep infinity" in lines and not any("the CMD ran" in line for line in lines)
    finally:
        await env.stop(delete=True)
    messages = [r.getMessage() for r in caplog.records]
    assert any("ENTRYPOINT ['/entrypoint.sh'] started in the background" in m for m in messages)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "ENTRYPOINT" in r.getMessage()]


@pytest.mark.timeout(60)
async def test_an_entrypoint_that_exits_at_once_is_warned_about_once_per_task(tmp_path: Path, sroot: Path, caplog):
    """On docker the container would stop with it; the local sandbox goes on, and says so once per task, with the
    exit status and the end of the entrypoint's output."""
    task = make_task(tmp_path, dockerfile="FROM x\nCOPY fail.sh /fail.sh\nENTRYPOINT [\"sh\", \"/fail.sh\"]\n",
                     files={"fail.sh": "echo cannot reach the database >&2\nexit 3\n"})
    caplog.set_level(logging.WARNING, logger="raygrpo.sandbox.local")
    for _ in range(2):
        env, _, _ = make_env(task, tmp_path / "trials", sroot)
        await env.start(force_build=False)
        try:
            assert (await env.exec("echo up")).stdout == "up\n"
        finally:
            await env.stop(delete=True)
    told = [r.getMessage() for r in caplog.records if "ENTRYPOINT" in r.getMessage()]
    assert len(told) == 1, told
    assert "ENTRYPOINT ['sh', '/fail.sh'] exited 3 right after it started" in told[0]
    assert told[0].endswith("cannot reach the database")


def test_entrypoint_forms_as_docker_reads_them(tmp_path: Path):
    df = tmp_path / "Dockerfile"
    df.write_text("FROM a\nENTRYPOINT [\"/x.sh\", \"--flag\"]\nFROM b\nENTRYPOINT /y.sh \"$HOME\"\n")
    assert parse_dockerfile(df).entrypoint == ("/bin/sh", "-c", '/y.sh "$HOME"')  # the last stage's, shell form
    df.write_text("FROM a\nENTRYPOINT [\"/x.sh\", \"--flag\"]\n")
    assert parse_dockerfile(df).entrypoint == ("/x.sh", "--flag")
    df.write_text("FROM a\nENTRYPOINT [\"/x.sh\"]\nENTRYPOINT []\n")
    assert parse_dockerfile(df).entrypoint is None
    df.write_text("FROM a\nENTRYPOINT [\"/x.sh\"]\nFROM b\n")
    assert parse_dockerfile(df).entrypoint is None


def test_dockerfile_errors_name_path_and_line(tmp_path: Path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM x\nWORKDIR /app\nFROBNICATE now\n")
    with pytest.raises(DockerfileError, match=rf"{bad}:3: unknown instruction 'FROBNICATE'"):
        parse_dockerfile(bad)
    bad.write_text("FROM x\n\nCOPY missing.txt /app/\n")
    with pytest.raises(DockerfileError, match=rf"{bad}:3: COPY source 'missing.txt' not found"):
        parse_dockerfile(bad)
    bad.write_text('FROM x\nENV A="unterminated\n')
    with pytest.raises(DockerfileError, match=rf"{bad}:2: unterminated double quote"):
        parse_dockerfile(bad)
    bad.write_text("FROM x\nCOPY ../../etc/passwd /app/\n")
    with pytest.raises(DockerfileError, match=rf"{bad}:2: .*outside the build context"):
        parse_dockerfile(bad)
    # A bad Dockerfile fails when the environment is created, before any sandbox exists.
    task = make_task(tmp_path, "t2", dockerfile="FROM x\nRUN true\nCOPY nope /app\n")
    with pytest.raises(DockerfileError, match=r"Dockerfile:3"):
        make_env(task, tmp_path / "trials", tmp_path / "sandboxes")


def test_the_old_start_timeout_kwarg_is_refused_naming_init_timeout(tmp_path: Path):
    """Passed the way a config's `environment_kwargs` reach it (Harbor's factory), the local sandbox's old
    `start_timeout_s` fails before any sandbox exists, naming `init_timeout_s`."""
    task = make_task(tmp_path, "t")
    with pytest.raises(TypeError, match=r"`start_timeout_s` in environment_kwargs is now `init_timeout_s`"):
        make_env(task, tmp_path / "trials", tmp_path / "sandboxes", kwargs={"start_timeout_s": 5})
    assert not (tmp_path / "sandboxes").exists() or not any((tmp_path / "sandboxes").iterdir())


@pytest.mark.timeout(60)
async def test_init_timeout_bounds_the_init_coming_up(tmp_path: Path, sroot: Path):
    """`init_timeout_s` (an `environment_kwargs` entry) is how long the sandbox's init may take to come up."""
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot, kwargs={"init_timeout_s": 0.001})
    try:
        with pytest.raises(SandboxStartError, match=r"did not come up within init_timeout_s=0\.001"):
            await env.start(force_build=False)
    finally:
        await env.stop(delete=True)


def test_dockerfile_multistage_and_skips(tmp_path: Path):
    (tmp_path / "a.txt").write_text("a")
    df = tmp_path / "Dockerfile"
    df.write_text(
        "FROM builder AS b\nWORKDIR /build\nENV X=1\nCOPY a.txt .\n"
        "FROM final\nUSER app\nCOPY --from=b /build/a.txt /app/\nADD https://example.com/f.tgz /app/\n"
        "ADD a.txt /app/b.txt\nEXPOSE 80\n"
    )
    plan = parse_dockerfile(df)
    assert plan.workdir is None and plan.env == {} and plan.user == "app"
    assert [str(c.dest) for c in plan.copies] == ["/app/b.txt"]
    reasons = {s.instruction: s.reason for s in plan.skipped}
    assert "--from=b" in str([s.reason for s in plan.skipped]) and "remote" in reasons["ADD"]


@pytest.mark.timeout(60)
async def test_files_and_background_processes_persist_between_execs(tmp_path: Path, sroot: Path):
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    await env.start(force_build=False)
    try:
        await env.exec("echo state > /app/state.txt; nohup sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/bg.pid")
        r = await env.exec("cat /app/state.txt; kill -0 $(cat /tmp/bg.pid) && echo bg-alive")
        assert r.stdout == "state\nbg-alive\n"
        # A server started in one exec answers in the next, on the host's loopback.
        await env.exec("python3 -u -m http.server 0 --bind 127.0.0.1 >/tmp/http.log 2>&1 &")
        r = await env.exec(
            "for i in $(seq 50); do port=$(grep -o 'port [0-9]*' /tmp/http.log | cut -d' ' -f2); "
            "[ -n \"$port\" ] && break; sleep 0.1; done; "
            "python3 -c \"import urllib.request as u,sys; print(u.urlopen('http://127.0.0.1:'+sys.argv[1]).status)\" "
            "$port"
        )
        assert r.stdout.strip() == "200", r
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_exec_timeout_kills_the_whole_group(tmp_path: Path, sroot: Path):
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    await env.start(force_build=False)
    try:
        ns = pid_namespace(env.init_pid)
        t0 = time.perf_counter()
        with pytest.raises(SandboxExecTimeoutError, match="Command timed out after 1 seconds") as info:
            await env.exec("echo started; sleep 777 & sleep 778", timeout_sec=1)
        elapsed = time.perf_counter() - t0
        assert 0.9 < elapsed < 3.0
        assert info.value.stdout == "started\n"
        assert isinstance(info.value, RuntimeError)  # what Harbor's docker backend raises on a timeout
        assert wait_until(lambda: not any("sleep 77" in _cmdline(p) for p in pids_in_namespace(ns)))
        # The sandbox is still usable after a timeout.
        assert (await env.exec("echo ok")).stdout == "ok\n"
        # A cancelled exec (the caller's own deadline) also kills its processes.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(env.exec("sleep 779"), timeout=0.5)
        assert wait_until(lambda: not any("sleep 779" in _cmdline(p) for p in pids_in_namespace(ns)))
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_exec_output_is_capped_kept_apart_and_leaves_no_files(tmp_path: Path, sroot: Path):
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot, kwargs={"max_output_bytes": 1000})
    await env.start(force_build=False)
    try:
        before = sorted(p.relative_to(sroot) for p in sroot.rglob("*"))
        r = await env.exec("head -c 5000 /dev/zero | tr '\\0' x; echo oops >&2; exit 3")
        assert r.return_code == 3
        assert r.stdout == "x" * 1000 + "\n[raygrpo local sandbox: output cut at 1000 bytes]"
        assert r.stderr == "oops\n"
        # A background process that keeps the exec's stdout open does not hold the exec up, nor what it printed.
        t0 = time.perf_counter()
        r = await env.exec("echo first; (sleep 30; echo late) & echo second")
        assert time.perf_counter() - t0 < 5
        assert (r.stdout, r.stderr) == ("first\nsecond\n", None)
        # Output bigger than the text cap comes back whole as bytes (a download's `cat`).
        await env.exec("head -c 300000 /dev/urandom > /var/tmp/blob.bin")  # /var/tmp: no host folder behind it
        await env.download_file("/var/tmp/blob.bin", tmp_path / "blob.bin")
        digest = (await env.exec("sha256sum /var/tmp/blob.bin")).stdout.split()[0]
        blob = (tmp_path / "blob.bin").read_bytes()
        assert len(blob) == 300000 and hashlib.sha256(blob).hexdigest() == digest
        # The output goes to memory: a running exec has no file on the host beside the sandbox's own.
        running = asyncio.ensure_future(env.exec("echo hi; sleep 1"))
        await asyncio.sleep(0.5)
        assert sorted(p.relative_to(sroot) for p in sroot.rglob("*")) == before
        assert (await running).stdout == "hi\n"
    finally:
        await env.stop(delete=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.timeout(60)
async def test_stop_kills_background_and_detached_processes(tmp_path: Path, sroot: Path):
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    await env.start(force_build=False)
    ns = pid_namespace(env.init_pid)
    try:
        await env.exec("sleep 1000 & setsid sleep 1001 & nohup sleep 1002 >/dev/null 2>&1 &")
        # The exec returns when its shell exits; a background child may not have exec'd `sleep` yet.
        assert wait_until(lambda: len([p for p in pids_in_namespace(ns) if "sleep 100" in _cmdline(p)]) == 3, 5.0)
        assert processes_mentioning(str(sroot))
        assert [s.sandbox_id for s in live_sandboxes(sroot)] == [env.sandbox_id]
    finally:
        await env.stop(delete=True)
    assert pids_in_namespace(ns) == []
    assert live_sandboxes(sroot) == []
    assert list(sroot.iterdir()) == []


async def test_a_models_kill_of_every_process_leaves_the_sandbox_up_and_orphans_are_reaped(tmp_path: Path,
                                                                                         sroot: Path):
    """`kill -9 -1` in the sandbox killed its init (then `sleep infinity` under bwrap's own PID 1), so the model's
    own action ended as env_error, retried as infrastructure and left unscored; on docker PID 1 is shielded and the
    verifier judges what is left. The init is now PID 1 itself: it survives, and still reaps orphans."""
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    await env.start(force_build=False)
    ns = pid_namespace(env.init_pid)
    try:
        await env.exec("sleep 1000 & echo data > /tmp/kept.txt")
        await env.exec("kill -9 -1; true")
        assert env.is_running()
        r = await env.exec("cat /tmp/kept.txt; sh -c 'sleep 0.1 & sleep 0.1 & exit 0'; sleep 1; echo after")
        assert r.return_code == 0 and "data" in r.stdout and "after" in r.stdout
        zombies = [p for p in pids_in_namespace(ns) if _stat_state(p) == "Z"]
        assert zombies == []
    finally:
        await env.stop(delete=True)
    assert pids_in_namespace(ns) == []


def _stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


@pytest.mark.timeout(60)
async def test_a_stop_searches_for_stragglers_only_when_something_may_be_left(tmp_path: Path, sroot: Path, monkeypatch):
    """A stop reads every process's environment for the sandbox's marks (milliseconds per stop on a busy machine)
    only when it has not seen the init reaped or an exec is still running (its `nsenter` lives outside the
    sandbox's PID namespace); either way nothing of the sandbox is alive the moment `stop` returns. (A stop during
    an exec usually finds the exec ended by then: its `nsenter` exits once the namespace is gone.)"""
    searches: list[int] = []
    search = _registry.process_env_marks
    monkeypatch.setattr(_registry, "process_env_marks", lambda: searches.append(1) or search())
    task = make_task(tmp_path)

    env, _, _ = make_env(task, tmp_path / "trials", sroot)
    await env.start(force_build=False)
    ns = pid_namespace(env.init_pid)
    try:
        await env.exec("sleep 1000 & setsid sleep 1001 & nohup sleep 1002 >/dev/null 2>&1 &")
        assert wait_until(lambda: len([p for p in pids_in_namespace(ns) if "sleep 100" in _cmdline(p)]) == 3, 5.0)
    finally:
        await env.stop(delete=True)
    assert searches == []
    assert pids_in_namespace(ns) == [] and processes_mentioning(str(sroot)) == []

    env, _, _ = make_env(task, tmp_path / "trials", sroot)
    await env.start(force_build=False)
    ns = pid_namespace(env.init_pid)
    running = asyncio.create_task(env.exec("sleep 1003"))
    try:
        while not any("sleep 1003" in _cmdline(p) for p in pids_in_namespace(ns)):
            await asyncio.sleep(0.02)
    finally:
        await env.stop(delete=True)
    assert pids_in_namespace(ns) == [] and processes_mentioning(str(sroot)) == []
    with pytest.raises(SandboxNotRunningError):
        await running


@pytest.mark.timeout(60)
async def test_exec_runs_in_its_directory_as_a_chdir_would(tmp_path: Path, sroot: Path):
    """An exec's `bash -c` starts in its working directory as with `chdir` (the physical path, no `OLDPWD`), the
    command's own line numbers and syntax errors read as they would, and a missing directory exits 125."""
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    await env.start(force_build=False)
    try:
        assert (await env.exec("mkdir -p /app/real && ln -s /app/real /app/link")).return_code == 0
        r = await env.exec('pwd; echo "$PWD" "${OLDPWD-unset}" $LINENO\necho $LINENO', cwd="/app/link")
        assert (r.return_code, r.stdout) == (0, "/app/real\n/app/real unset 1\n2\n"), r.stderr
        r = await env.exec("echo one\nif then", cwd="/app")
        assert r.return_code == 2 and "line 2: syntax error" in r.stderr and r.stdout == "one\n", r
        r = await env.exec("echo never", cwd="/app/missing")
        assert r.return_code == 125 and r.stdout is None and "/app/missing" in r.stderr, r
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_empty_dirs_on_the_host_side_as_harbors_command_does(tmp_path: Path, sroot: Path, monkeypatch):
    """Harbor's `empty_dirs` (which every rollout's start runs on `/logs/verifier`) starts no process where the
    sandbox's own writable directories back every path, and leaves what Harbor's command leaves: a directory, empty,
    mode 0777, a file in its place removed, a symlink inside removed without following it. A path with a symlink on
    the way, one with a mount below it, or a read-only one goes through the sandbox as before."""
    processes: list[list[str]] = []
    run = _process.run_in_group
    monkeypatch.setattr(_process, "run_in_group", lambda argv, **kw: processes.append(argv) or run(argv, **kw))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host file\n")
    env, _, paths = make_env(make_task(tmp_path), tmp_path / "trials", sroot, kwargs={"auto_mounting": True})
    await env.start(force_build=False)
    try:
        r = await env.exec(
            "mkdir -p /logs/verifier/sub /app/old && echo 1 > /logs/verifier/reward.txt"
            " && echo 2 > /logs/verifier/sub/x"
            f" && ln -s {outside} /logs/verifier/link && chmod 700 /logs/verifier"
            " && echo file > /app/afile && ln -s /app/old /app/linked && touch /app/old/y", user="root")
        assert r.return_code == 0, r.stderr
        processes.clear()

        assert (await env.empty_dirs(["/logs/verifier", "/app/afile", "/app/new/deep"], chmod=True)).return_code == 0
        assert processes == []
        r = await env.exec("for d in /logs/verifier /app/afile /app/new/deep; do stat -c '%F %a' $d; ls -A $d; done")
        assert r.stdout == "directory 777\n" * 3, r.stdout
        assert (outside / "keep.txt").read_text() == "host file\n"
        assert paths.verifier_dir.is_dir() and list(paths.verifier_dir.iterdir()) == []

        processes.clear()
        assert (await env.empty_dirs(["/app/linked"], chmod=False)).return_code == 0
        assert len(processes) == 1  # a symlink: Harbor's command replaces it by a directory, in the sandbox
        r = await env.exec("stat -c %F /app/linked; ls -A /app/linked /app/old")
        assert r.stdout == "directory\n/app/linked:\n\n/app/old:\ny\n", r.stdout

        processes.clear()
        await env.empty_dirs(["/logs"], chmod=True)  # /logs/verifier is mounted below it (the trial's own dir)
        assert len(processes) == 1 and paths.verifier_dir.is_dir()
        processes.clear()
        assert (await env.empty_dirs(["/usr/share/raygrpo-none"], chmod=True)).return_code != 0
        assert len(processes) == 1
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_harbor_verifier_scores_the_sandbox(tmp_path: Path, sroot: Path):
    task_dir = make_task(tmp_path)
    for answer, expected in (("42", 1.0), ("41", 0.0)):
        env, task, paths = make_env(task_dir, tmp_path / "trials", sroot)
        await env.start(force_build=False)
        try:
            await env.exec(f"echo {answer} > answer.txt")  # the "agent": relative to WORKDIR /app
            result = await Verifier(task=task, trial_paths=paths, environment=env).verify()
            assert result.rewards == {"reward": expected}
            assert paths.reward_text_path.read_text().strip() == str(int(expected))
        finally:
            await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_harbor_verifier_with_auto_mounted_logs(tmp_path: Path, sroot: Path):
    """With Harbor's auto_mounting, /logs/verifier is the trial's own dir: the verifier reads it without a copy."""
    env, task, paths = make_env(make_task(tmp_path), tmp_path / "trials", sroot, kwargs={"auto_mounting": True})
    await env.start(force_build=False)
    try:
        assert env.is_path_mounted("/logs/verifier", paths.verifier_dir)
        await env.exec("echo 42 > /app/answer.txt")
        result = await Verifier(task=task, trial_paths=paths, environment=env).verify()
        assert result.rewards == {"reward": 1.0}
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_users(tmp_path: Path, sroot: Path, caplog):
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    await env.start(force_build=False)
    try:
        assert (await env.exec("id -u")).stdout == "0\n"
        assert (await env.exec("id -u", user="nobody")).stdout == "65534\n"
        with env.with_default_user(1234):
            assert (await env.exec("id -u")).stdout == "1234\n"
        caplog.set_level(logging.WARNING, logger="raygrpo.sandbox.local")
        assert (await env.exec("id -u", user="no-such-user")).stdout == "0\n"
        assert "does not exist on this host" in caplog.text
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(120)
async def test_many_sandboxes_start_at_once(tmp_path: Path, sroot: Path):
    task = make_task(tmp_path)
    n = 32
    envs = [make_env(task, tmp_path / "trials", sroot)[0] for _ in range(n)]
    t0 = time.perf_counter()
    await asyncio.gather(*(env.start(force_build=False) for env in envs))
    start_all_s = time.perf_counter() - t0
    try:
        results = await asyncio.gather(*(env.exec("cat data.txt; hostname") for env in envs))
        assert all(r.stdout.startswith("payload\n") for r in results)
        assert len({r.stdout for r in results}) == n  # each its own UTS namespace / hostname
        assert len({pid_namespace(env.init_pid) for env in envs}) == n
        assert len(live_sandboxes(sroot)) == n
    finally:
        t0 = time.perf_counter()
        await asyncio.gather(*(env.stop(delete=True) for env in envs))
        stop_all_s = time.perf_counter() - t0
    print(f"{n} local sandboxes: all started in {start_all_s:.2f} s, all stopped in {stop_all_s:.2f} s")
    assert start_all_s < 30


@pytest.mark.timeout(60)
async def test_cancelled_start_leaves_nothing(tmp_path: Path, sroot: Path):
    """A start cut by the caller's deadline at any point (preparing files, launching, waiting) leaves no trace."""
    task = make_task(tmp_path, dockerfile=RICH_DOCKERFILE, files={"conf/app.ini": "k=v\n"})
    for delay in (0.0, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.012, 0.015, 0.02, 0.03):
        env, _, _ = make_env(task, tmp_path / "trials", sroot)
        try:
            await asyncio.wait_for(env.start(force_build=False), timeout=delay)
        except asyncio.TimeoutError:
            pass
        finally:
            await env.stop(delete=True)
        assert_no_leaks(sroot)
        assert not sroot.exists() or list(sroot.iterdir()) == []


@pytest.mark.timeout(180)
def test_a_sandbox_used_before_ray_init_leaves_ray_working(tmp_path: Path):
    """Starting a sandbox in a process that imported Ray but never initialised it (a script, or this test session
    before a Ray test) must not touch Ray's global state: a later ray.init in that process has to work."""
    script = f"""
import asyncio, sys
from pathlib import Path
import ray
from tests.sandbox_utils import make_env, make_task
from raygrpo.driver.runtime import init_ray, shutdown_ray

async def use_a_sandbox():
    tmp = Path({str(tmp_path)!r})
    (tmp / "sb").mkdir()
    env, _, _ = make_env(make_task(tmp), tmp / "trials", tmp / "sb")
    await env.start(force_build=False)
    await env.stop(delete=True)

asyncio.run(use_a_sandbox())
init_ray(num_cpus=1)
try:
    print("remote says", ray.get(ray.remote(lambda: 42).remote(), timeout=60))
finally:
    shutdown_ray()
"""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0 and "remote says 42" in done.stdout, done.stderr[-2000:]


@pytest.mark.timeout(60)
async def test_a_workdir_inside_another_writable_dir_exists(tmp_path: Path, sroot: Path):
    """WORKDIR /app/work: /app is writable already, and the directory inside it must still be made."""
    task = make_task(tmp_path, dockerfile="FROM python:3.12-slim\nWORKDIR /app/work\n")
    env = make_env(task, tmp_path / "trials", sroot)[0]
    await env.start(force_build=False)
    try:
        r = await env.exec("pwd && touch here && ls /app")
        assert (r.return_code, r.stdout) == (0, "/app/work\nwork\n"), r.stderr
    finally:
        await env.stop(delete=True)
