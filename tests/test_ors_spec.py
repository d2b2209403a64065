"""ORSSpec: validation messages; task listing (`raygrpo.envs.ors.listing`) against a real local ORS server and
unreachable servers; and `load_object` (the import-spec loader the spec's `environment` field uses)."""

from __future__ import annotations

import asyncio
import pickle
import time

import pytest
from pydantic import ValidationError

from raygrpo.envs.ors.listing import ORSConfigError, ORSConnectionError, list_ors_tasks
from raygrpo.core.imports import ImportSpecError, load_object
from raygrpo.specs.ors import ORSSpec
from tests.ors_utils import ARITH, ECHO, EmptySplitEnvironment, closed_port, ors_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with ors_server([ECHO, ARITH, EmptySplitEnvironment]) as running:
        yield running


# ── validation ───────────────────────────────────────────────────────────────────────────────────────────────────


def _error(**kwargs) -> str:
    with pytest.raises(ValidationError) as info:
        ORSSpec(**kwargs)
    return str(info.value)


def test_unknown_key_is_named():
    message = _error(url="http://127.0.0.1:1", num_taks=3)
    assert "num_taks" in message and "Extra inputs are not permitted" in message


def test_num_tasks_and_indices_are_exclusive():
    message = _error(url="http://127.0.0.1:1", num_tasks=2, indices=[0, 1])
    assert "`num_tasks`" in message and "`indices`" in message


def test_exactly_one_source():
    none = _error(split="train")
    assert "`url`" in none and "`catalog`" in none and "`environment`" in none and "got none" in none
    both = _error(url="http://127.0.0.1:1", catalog="Owner/Env")
    assert "`url`, `catalog`" in both


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"url": "127.0.0.1:8000"}, "url"),
        ({"url": "ftp://127.0.0.1"}, "url"),
        ({"catalog": "https://openreward.ai/Owner/Env"}, "catalog"),
        ({"catalog": "no-owner"}, "catalog"),
        ({"environment": "examples/echo/env.py"}, "environment"),
        ({"url": "http://127.0.0.1:1", "num_tasks": 0}, "num_tasks"),
        ({"url": "http://127.0.0.1:1", "indices": []}, "indices"),
        ({"url": "http://127.0.0.1:1", "indices": [0, -1]}, "indices"),
        ({"url": "http://127.0.0.1:1", "weight": 2}, "train.mixture"),
        ({"url": "http://127.0.0.1:1", "connect_timeout_s": -1}, "connect_timeout_s"),
        ({"url": "http://127.0.0.1:1", "api_key_env": "sk-live-abc"}, "api_key_env"),
        ({"url": "http://127.0.0.1:1", "base_url": "https://openreward.ai"}, "base_url"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    assert field in _error(**kwargs)


def test_secret_values_are_refused_without_being_echoed():
    message = _error(url="http://127.0.0.1:1", secrets={"OPENAI_API_KEY": "sk-fake-123"})
    assert "secrets.OPENAI_API_KEY" in message and "NAME of an environment variable" in message
    assert "sk-fake-123" not in message


def test_served_at_keeps_exactly_one_source():
    spec = ORSSpec(environment=ECHO, num_tasks=2)
    served = spec.served_at("http://127.0.0.1:1234")
    assert served.url == "http://127.0.0.1:1234" and served.environment is None and served.num_tasks == 2
    assert served.served_from == ECHO and ECHO in served.describe()
    assert served.source_field == "environment"
    # The copy is an ordinary valid spec: it round-trips through validation and pickling (what actors receive).
    assert ORSSpec.model_validate(served.model_dump()).url == served.url
    unpickled = pickle.loads(pickle.dumps(served))
    assert unpickled.served_from == ECHO and unpickled.url == served.url
    with pytest.raises(ORSConfigError, match="envs.echo.environment"):
        list_ors_tasks(spec, "echo")


# ── listing ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_list_all_tasks(server):
    tasks = list_ors_tasks(ORSSpec(url=server.url), "echo")
    assert [t.index for t in tasks] == list(range(8))
    assert all(t.env == "echo" and t.split == "train" for t in tasks)
    assert tasks[0].metadata == {"target": "hello"}


def test_num_tasks_indices_split_and_env_name(server):
    spec = ORSSpec(url=server.url, env_name="arithenvironment", num_tasks=3)
    tasks = list_ors_tasks(spec, "arith")
    assert [t.index for t in tasks] == [0, 1, 2]
    assert tasks[0].metadata["expression"] == "a + b" and tasks[0].metadata["answer"] == 42

    picked = list_ors_tasks(ORSSpec(url=server.url, indices=[5, 1], split="train"), "echo")
    assert [(t.index, t.metadata["target"]) for t in picked] == [(5, "the answer"), (1, "world")]

    many = list(range(7, -1, -1)) * 3  # above the range-fetch threshold, with repeats
    assert [t.index for t in list_ors_tasks(ORSSpec(url=server.url, indices=many), "echo")] == many

    test_split = list_ors_tasks(ORSSpec(url=server.url, split="test"), "echo")
    assert [t.metadata["target"] for t in test_split] == ["echo", "repeat this"]

    bare = list_ors_tasks(ORSSpec(url=server.url, num_tasks=2, include_metadata=False), "echo")
    assert [t.metadata for t in bare] == [{}, {}]


def test_listing_errors_name_the_field(server):
    with pytest.raises(ORSConfigError, match=r"envs\.echo\.split: split 'dev' does not exist.*'train', 'test'"):
        list_ors_tasks(ORSSpec(url=server.url, split="dev"), "echo")
    with pytest.raises(ORSConfigError, match=r"envs\.echo\.indices: index 99 is out of range.*8 tasks"):
        list_ors_tasks(ORSSpec(url=server.url, indices=[0, 99]), "echo")
    with pytest.raises(ORSConfigError, match=r"envs\.x\.env_name: no environment 'nosuch'.*echoenvironment"):
        list_ors_tasks(ORSSpec(url=server.url, env_name="nosuch"), "x")


def test_a_split_without_tasks_is_refused_naming_the_field(server):
    """A run of no task would complete and exit 0; it is a config that does not fit the server (exit 2)."""
    empty = r"envs\.e\.split: split 'train' has no tasks on the ORS server at http://127\.0\.0\.1:\d+/"
    with pytest.raises(ORSConfigError, match=empty):
        list_ors_tasks(ORSSpec(url=server.url, env_name="emptysplitenvironment"), "e")
    with pytest.raises(ORSConfigError, match=empty):  # counted, then fetched as a range
        list_ors_tasks(ORSSpec(url=server.url, env_name="emptysplitenvironment", num_tasks=2), "e")
    dev = list_ors_tasks(ORSSpec(url=server.url, env_name="emptysplitenvironment", split="dev"), "e")
    assert [(t.index, t.metadata) for t in dev] == [(0, {"n": 0})]


def test_list_tasks_inside_a_running_loop(server):
    async def main():
        return list_ors_tasks(ORSSpec(url=server.url, num_tasks=1), "echo")

    assert len(asyncio.run(main())) == 1


def test_unreachable_url_fails_fast_naming_url_and_field():
    url = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(ORSConnectionError) as info:
        list_ors_tasks(ORSSpec(url=url, connect_timeout_s=30), "echo")
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert elapsed < 30, elapsed
    assert message.startswith(f"envs.echo.url: cannot reach the ORS server at {url}/"), message


def test_silent_server_hits_the_deadline():
    """A port that accepts connections but never answers: the deadline, not the SDK's retries, ends the wait."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        start = time.monotonic()
        with pytest.raises(ORSConnectionError, match=r"envs\.slow\.url: cannot reach .*no answer within 1\.5 s"):
            list_ors_tasks(ORSSpec(url=url, connect_timeout_s=1.5), "slow")
        assert time.monotonic() - start < 10
    finally:
        listener.close()


def test_catalog_without_api_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("RAYGRPO_NO_SUCH_KEY", raising=False)
    spec = ORSSpec(catalog="Owner/Env", api_key_env="RAYGRPO_NO_SUCH_KEY")
    with pytest.raises(ORSConfigError, match=r"envs\.c\.api_key_env: environment variable RAYGRPO_NO_SUCH_KEY"):
        list_ors_tasks(spec, "c")


# ── load_object ──────────────────────────────────────────────────────────────────────────────────────────────────


def test_load_object_by_module_and_file(tmp_path):
    assert load_object("raygrpo.agent.toolcalls:format_tool_call").__name__ == "format_tool_call"
    echo_cls = load_object(ECHO)
    assert echo_cls.__name__ == "EchoEnvironment" and load_object(ECHO) is echo_cls
    (tmp_path / "mod.py").write_text("class Outer:\n    class Inner:\n        x = 3\n")
    assert load_object("mod.py:Outer.Inner", base_dir=str(tmp_path)).x == 3
    assert load_object(f"{tmp_path}/mod.py:Outer").__name__ == "Outer"


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("no_such_pkg.mod:X", "no module named 'no_such_pkg'"),
        ("raygrpo.agent.toolcalls:nope", "has no attribute 'nope'"),
        ("missing/file.py:X", "does not exist"),
        ("examples/echo/env.py:Nope", "has no attribute 'Nope'"),
        ("just_a_module", "expected 'package.module:Attr'"),
    ],
)
def test_load_object_errors_name_the_spec(spec, needle):
    with pytest.raises(ImportSpecError) as info:
        load_object(spec)
    assert spec in str(info.value) and needle in str(info.value)
