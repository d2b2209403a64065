"""The cluster files of `cluster/`, checked offline with Ray's own code (no Ray runtime, no cloud, no Kubernetes).

- `ray up` files (aws.yaml, gcp.yaml): `prepare_config` + `validate_config` (ray-schema.json), then Ray's autoscaler
  v2 config reader (`AutoscalingConfig`), which answers what each node type really gets: resources, docker run
  options, set-up commands.
- KubeRay manifests (the RayCluster, and the RayJob's `rayClusterSpec` wrapped as one): the translator Ray's
  autoscaler runs on KubeRay (`_derive_autoscaling_config_from_ray_cr`, which calls `validate_config`), then the same
  v2 reader, as Ray's `KubeRayConfigReader` does.
- runtime_env.yaml: `ray.runtime_env.RuntimeEnv` and Ray's working_dir packer.

Every kind of check has broken variants that Ray's code rejects, so a check that passes has been shown able to fail.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from raygrpo.docker.guard import MODE_ENV, shell_script

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"
RAY_UP_FILES = ["aws.yaml", "gcp.yaml"]
#: `ray up` worker node types and the custom resource each carries.
RAY_UP_WORKERS = {"gpu": "learner_gpu", "docker_host": "docker_host", "sandbox_client": "sandbox_client"}
#: KubeRay worker groups and the custom resource each carries.
KUBERAY_GROUPS = {"gpu": "learner_gpu", "docker-host": "docker_host", "sandbox-client": "sandbox_client"}
#: The node type name Ray's KubeRay translator gives the head group.
KUBERAY_HEAD = "headgroup"
STOP_WAIT = "RAY_JOB_STOP_WAIT_TIME_S"
LEASE_DIR = "/mnt/shared/raygrpo-leases"
SHARED = "/mnt/shared"
PVC = "raygrpo-shared"
SECRET = "raygrpo-secrets"
#: HOME of the rayproject/ray images cluster/Dockerfile builds on: where Ray puts a `ray up` file_mount's `~/`.
CONTAINER_HOME = "/home/ray"

Mutation = Callable[[dict[str, Any]], None]


def _load(relative: str) -> dict[str, Any]:
    """One YAML document of cluster/ (the files are single documents)."""
    return yaml.safe_load((CLUSTER / relative).read_text())


# ── ray up ──────────────────────────────────────────────────────────────────────────────────────────────────────


def _ray_up(cfg: dict[str, Any]) -> Any:
    """Validate a `ray up` config the way `ray up` does, and return Ray's autoscaler v2 view of it.

    `AutoscalingConfig` itself runs `prepare_config` + `validate_config`; they are called first here as well so a
    failure names them. `skip_content_hash`: the file_mounts name a folder on the user's machine (the auth token).
    """
    from ray.autoscaler._private.util import prepare_config, validate_config
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    validate_config(prepare_config(copy.deepcopy(cfg)))
    return AutoscalingConfig(copy.deepcopy(cfg), skip_content_hash=True)


def _joined(commands: list[str]) -> str:
    return "\n".join(commands)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
def test_ray_up_file_passes_ray_validation(name: str) -> None:
    """The file is a valid `ray up` config (schema, defaults merged) with exactly the four node types."""
    config = _ray_up(_load(name))
    types = config.get_node_type_configs()
    assert config.get_head_node_type() == "head"
    assert set(types) == {"head", *RAY_UP_WORKERS}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
def test_ray_up_node_types(name: str) -> None:
    """Head with CPU 0 (no actor lands there), every worker type from 0 nodes with its custom resource, integer
    resource values, the GPU type with a GPU, and an idle timeout set in the file (not Ray's default)."""
    raw = _load(name)
    config = _ray_up(raw)
    types = config.get_node_type_configs()
    assert types["head"].resources == {"CPU": 0}
    assert "--num-cpus=0" in _joined(config.get_head_start_ray_commands())
    for node_type, custom in RAY_UP_WORKERS.items():
        spec = types[node_type]
        assert spec.min_worker_nodes == 0, node_type
        assert spec.max_worker_nodes >= 1, node_type
        assert spec.resources.get(custom) == 1, node_type
        assert spec.resources.get("CPU", 0) >= 1, node_type
        assert all(type(v) is int for v in spec.resources.values()), spec.resources
    assert types["gpu"].resources.get("GPU", 0) >= 1
    assert "GPU" not in types["docker_host"].resources and "GPU" not in types["sandbox_client"].resources
    assert "idle_timeout_minutes" in raw
    assert config.get_idle_timeout_s() and config.get_idle_timeout_s() > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
def test_ray_up_docker_host_installs_docker(name: str) -> None:
    """The docker_host type's own set-up installs the Docker CLI and the compose v2 plugin when missing and checks
    that `docker compose` reaches the host daemon, whose socket (and /tmp, for compose bind mounts) the container
    gets. No other type gets the Docker socket."""
    config = _ray_up(_load(name))
    setup = _joined(config.get_worker_setup_commands("docker_host"))
    assert "docker.io" in setup
    assert "cli-plugins/docker-compose" in setup
    assert "docker compose version" in setup and "docker info" in setup
    run_options = " ".join(config.get_docker_config("docker_host").get("worker_run_options", []))
    assert "-v /var/run/docker.sock:/var/run/docker.sock" in run_options
    assert "-v /tmp:/tmp" in run_options
    # The sandboxes' firewall: installed by the set-up as root, with NET_ADMIN in the host's network namespace
    # (Ray runs the container with --net=host), and the actors told so.
    assert "--cap-add=NET_ADMIN" in run_options and f"-e {MODE_ENV}=external" in run_options
    assert 'sudo "$(command -v python)" -m raygrpo.docker.guard install' in setup
    for node_type in ("head", "gpu", "sandbox_client"):
        docker = config.get_docker_config(node_type)
        options = " ".join(docker.get("run_options", []) + docker.get("worker_run_options", []))
        assert "docker.sock" not in options, node_type


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
def test_ray_up_shared_storage_and_stop_wait(name: str) -> None:
    """Every node mounts the shared storage on the host, sees it at /mnt/shared in its container and checks it is
    writable; the head exports RAY_JOB_STOP_WAIT_TIME_S, above Ray's default, before `ray start --head`; the GPU type
    runs its own image."""
    from ray.dashboard.modules.job.job_supervisor import JobSupervisor

    config = _ray_up(_load(name))
    for node_type in ("head", *RAY_UP_WORKERS):
        init = _joined(config.get_initialization_commands(node_type))
        assert re.search(rf"mount -t nfs\S* .* {SHARED}\b", init), node_type
        docker = config.get_docker_config(node_type)
        assert f"-v {SHARED}:{SHARED}" in docker.get("run_options", []), node_type
    for node_type in RAY_UP_WORKERS:
        assert f"test -w {SHARED}" in _joined(config.get_worker_setup_commands(node_type)), node_type
    assert f"test -w {SHARED}" in _joined(config.get_head_setup_commands())
    assert config.get_docker_config("gpu")["image"] != config.get_docker_config("head")["image"]

    head_start = _joined(config.get_head_start_ray_commands())
    match = re.search(rf"export [^;]*\b{STOP_WAIT}=(\d+)[^;]*;.*ray start --head", head_start, re.DOTALL)
    assert match, head_start
    assert int(match.group(1)) > JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
def test_ray_up_token_auth_in_every_container_shell(name: str) -> None:
    """Token auth is in the environment of every node's container (`docker run -e`), not only of `ray start`: a shell
    of `ray exec` / `ray attach` (`ray status`, `raygrpo reap --address auto`) has RAY_AUTH_MODE=token, without which
    Ray's CLI sends no token and the GCS rejects it, and RAY_AUTH_TOKEN_PATH naming the token that file_mounts copies
    into the container's home (the image's HOME, /home/ray). No command sets another mode."""
    raw = _load(name)
    config = _ray_up(raw)
    (mount,) = [remote for remote in raw["file_mounts"] if "auth" in remote]
    token_path = f"{CONTAINER_HOME}/{mount.removeprefix('~/')}/auth_token"
    for node_type in ("head", *RAY_UP_WORKERS):
        docker = config.get_docker_config(node_type)
        options = docker["run_options"] + docker.get("worker_run_options", [])
        assert "-e RAY_AUTH_MODE=token" in options, node_type
        assert f"-e RAY_AUTH_TOKEN_PATH={token_path}" in options, node_type
    commands = [*config.get_head_start_ray_commands(), *config.get_worker_start_ray_commands()]
    assert not [c for c in commands if re.search(r"RAY_AUTH_MODE=(?!token\b)", c)], commands


#: The Compute Engine `Instance` fields the GCP node configs set, and the JSON type the API takes for each
#: (https://cloud.google.com/compute/docs/reference/rest/v1/instances); Ray passes node_config to `instances.insert`
#: as it is, so a wrong shape fails only when a node launches.
GCE_FIELD_TYPES: dict[str, type] = {"machineType": str, "disks": list, "guestAccelerators": list, "metadata": dict,
                                    "scheduling": dict, "serviceAccounts": list}


@pytest.mark.timeout(60)
def test_gcp_node_configs_have_compute_api_shapes() -> None:
    """Every GCP node_config field has the type the Compute Engine API takes (`scheduling` an object, not a list),
    the GPU type does not live-migrate, and list fields hold objects."""
    types = _load("gcp.yaml")["available_node_types"]
    for node_type, spec in types.items():
        node_config = spec["node_config"]
        assert set(node_config) <= set(GCE_FIELD_TYPES), node_type
        for field, value in node_config.items():
            assert isinstance(value, GCE_FIELD_TYPES[field]), (node_type, field, value)
            if isinstance(value, list):
                assert all(isinstance(item, dict) for item in value), (node_type, field)
        assert isinstance(node_config.get("metadata", {}).get("items", []), list), node_type
    gpu = types["gpu"]["node_config"]
    assert gpu["guestAccelerators"] and gpu["scheduling"]["onHostMaintenance"] == "TERMINATE"


#: RAM (MiB) of the GCE machine types gcp.yaml uses, as the Compute Engine API reports it (`memoryMb`).
GCE_MACHINE_MIB = {"n2-standard-8": 32768, "n1-standard-16": 61440, "n2-standard-16": 65536, "e2-standard-4": 16384}
#: What EC2's DescribeInstanceTypes reports of the instance types aws.yaml uses (the fields Ray reads).
EC2_INSTANCE_TYPES: list[dict[str, Any]] = [
    {"InstanceType": "m5.2xlarge", "VCpuInfo": {"DefaultVCpus": 8}, "MemoryInfo": {"SizeInMiB": 32768}},
    {"InstanceType": "g5.4xlarge", "VCpuInfo": {"DefaultVCpus": 16}, "MemoryInfo": {"SizeInMiB": 65536},
     "GpuInfo": {"Gpus": [{"Name": "A10G", "Manufacturer": "NVIDIA", "Count": 1}]}},
    {"InstanceType": "m5.4xlarge", "VCpuInfo": {"DefaultVCpus": 16}, "MemoryInfo": {"SizeInMiB": 65536}},
    {"InstanceType": "c5.xlarge", "VCpuInfo": {"DefaultVCpus": 4}, "MemoryInfo": {"SizeInMiB": 8192}},
]


def _ray_memory(mib: int) -> int:
    """The `memory` Ray's AWS node provider gives a worker type of `mib` MiB: what the object store leaves."""
    from ray._private.ray_constants import DEFAULT_OBJECT_STORE_MEMORY_PROPORTION

    return int(mib * 2**20 * (1 - DEFAULT_OBJECT_STORE_MEMORY_PROPORTION))


def _ray_up_after_fillout(name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The `ray up` file after the provider's resource fill-out that `ray up` runs before launching anything.

    AWS: Ray's own `AWSNodeProvider.fillout_available_node_types_resources`, with EC2's instance type listing as EC2
    reports it (`EC2_INSTANCE_TYPES`; no cloud here). Google Cloud's fill-out adds only TPU resources (none here), and
    its module needs googleapiclient, so the file is taken as it is.
    """
    cfg = _load(name)
    if name != "aws.yaml":
        return cfg
    from ray.autoscaler._private.aws import node_provider

    monkeypatch.setattr(node_provider, "list_ec2_instances", lambda region, credentials=None: EC2_INSTANCE_TYPES)
    return node_provider.AWSNodeProvider.fillout_available_node_types_resources(cfg)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
def test_ray_up_worker_types_offer_memory(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker type offers `memory` (bytes) once `ray up` has resolved the file, so an actor that asks memory
    (an env pool's `memory`) can be placed and the autoscaler adds its node: on AWS Ray's fill-out gives it from the
    instance type (the file leaves it to Ray), on Google Cloud, whose provider fills in nothing, the file names it:
    70% of the machine type's RAM, as Ray's AWS provider computes it."""
    raw = _load(name)
    types = _ray_up(_ray_up_after_fillout(name, monkeypatch)).get_node_type_configs()
    for node_type in RAY_UP_WORKERS:
        memory = types[node_type].resources.get("memory", 0)
        node_config = raw["available_node_types"][node_type]["node_config"]
        if name == "aws.yaml":
            assert "memory" not in raw["available_node_types"][node_type]["resources"], node_type
            mib = next(t["MemoryInfo"]["SizeInMiB"] for t in EC2_INSTANCE_TYPES
                       if t["InstanceType"] == node_config["InstanceType"])
        else:
            mib = GCE_MACHINE_MIB[node_config["machineType"]]
        assert memory == _ray_memory(mib), (node_type, memory)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
def test_ray_up_nodes_can_pull_the_image(name: str) -> None:
    """Ray never runs `docker login`: every node logs its Docker in to the registry of the image it runs, on the host
    before Ray pulls (initialization_commands), with the cloud identity its node_config gives it (an instance profile
    on AWS, a service account on Google Cloud), and every image is in that one registry."""
    raw = _load(name)
    config = _ray_up(raw)
    for node_type in ("head", *RAY_UP_WORKERS):
        registry = config.get_docker_config(node_type)["image"].split("/")[0]
        init = _joined(config.get_initialization_commands(node_type))
        node_config = raw["available_node_types"][node_type]["node_config"]
        if name == "aws.yaml":
            region = re.fullmatch(r"[\w-]+\.dkr\.ecr\.([\w-]+)\.amazonaws\.com", registry)
            assert region, registry
            login = (rf"aws ecr get-login-password --region {region.group(1)} \|\s*"
                     rf"docker login --username AWS --password-stdin {re.escape(registry)}(\s|$)")
            assert re.search(login, init), (node_type, init)
            assert set(node_config["IamInstanceProfile"]) & {"Name", "Arn"}, node_type
        else:
            assert re.fullmatch(r"[\w-]+-docker\.pkg\.dev", registry), registry
            assert re.search(rf"gcloud auth configure-docker {re.escape(registry)} -q(\s|$)", init), (node_type, init)
            (account,) = node_config["serviceAccounts"]
            assert account["email"].endswith(".iam.gserviceaccount.com"), node_type
            assert "https://www.googleapis.com/auth/cloud-platform" in account["scopes"], node_type


def _set_ray_up(path: tuple[str, ...], value: Any) -> Mutation:
    def mutate(cfg: dict[str, Any]) -> None:
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


def _rename_ray_up_key(node_type: str, old: str, new: str) -> Mutation:
    def mutate(cfg: dict[str, Any]) -> None:
        spec = cfg["available_node_types"][node_type]
        spec[new] = spec.pop(old)
    return mutate


RAY_UP_BROKEN: list[tuple[str, Mutation, type[Exception]]] = [
    ("fractional custom resource",
     _set_ray_up(("available_node_types", "docker_host", "resources", "docker_host"), 0.5), jsonschema.ValidationError),
    ("misspelled node type key", _rename_ray_up_key("docker_host", "min_workers", "min_worker"),
     jsonschema.ValidationError),
    ("per-type docker run_options (only worker_run_options exists there)",
     _set_ray_up(("available_node_types", "docker_host", "docker", "run_options"), ["-v /a:/a"]),
     jsonschema.ValidationError),
    ("min_workers above max_workers", _set_ray_up(("available_node_types", "docker_host", "min_workers"), 100),
     ValueError),
    ("unknown head type", _set_ray_up(("head_node_type",), "no-such-type"), ValueError),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", RAY_UP_FILES)
@pytest.mark.parametrize("label,mutate,error", RAY_UP_BROKEN, ids=[b[0] for b in RAY_UP_BROKEN])
def test_ray_up_broken_variant_is_rejected(name: str, label: str, mutate: Mutation, error: type[Exception]) -> None:
    """Ray's validation rejects each broken variant of the file (so the passing checks above can fail)."""
    cfg = _load(name)
    mutate(cfg)
    with pytest.raises(error):
        _ray_up(cfg)


# ── KubeRay ─────────────────────────────────────────────────────────────────────────────────────────────────────


def _as_ray_cluster(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """A RayCluster custom resource as the Kubernetes API returns it (with a namespace) around `spec`."""
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": "default"},
            "spec": copy.deepcopy(spec)}


def _kuberay_cluster(which: str) -> dict[str, Any]:
    """The RayCluster of raycluster.yaml, or the RayJob's `spec.rayClusterSpec` wrapped as a RayCluster."""
    if which == "raycluster":
        doc = _load("kuberay/raycluster.yaml")
        assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
        return _as_ray_cluster(doc["spec"], doc["metadata"]["name"])
    doc = _load("kuberay/rayjob.yaml")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    return _as_ray_cluster(doc["spec"]["rayClusterSpec"], doc["metadata"]["name"])


def _kuberay_autoscaling(cr: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What Ray's autoscaler makes of a RayCluster: the translated autoscaling config (validated against Ray's schema
    by the translator and again here) and the v2 node type configs (`KubeRayConfigReader` builds an
    `AutoscalingConfig` from the translation; the v2 autoscaler reads `get_node_type_configs()`)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr
    from ray.autoscaler._private.util import validate_config
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    translated = _derive_autoscaling_config_from_ray_cr(copy.deepcopy(cr))
    validate_config(translated)
    return translated, AutoscalingConfig(copy.deepcopy(translated)).get_node_type_configs()


def _pods(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Pod spec of the head (`headgroup`) and of each worker group, by group name."""
    pods = {KUBERAY_HEAD: spec["headGroupSpec"]["template"]["spec"]}
    pods.update({g["groupName"]: g["template"]["spec"] for g in spec["workerGroupSpecs"]})
    return pods


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["raycluster", "rayjob"])
def test_kuberay_spec_through_ray_translator(which: str) -> None:
    """Ray's KubeRay translator and v2 reader accept the cluster: head CPU 0, each worker group from 0 pods with its
    custom resource (integers), the gpu group with a GPU, idle timeouts as the manifest sets them."""
    cr = _kuberay_cluster(which)
    translated, types = _kuberay_autoscaling(cr)
    assert set(types) == {KUBERAY_HEAD, *KUBERAY_GROUPS}
    assert types[KUBERAY_HEAD].resources["CPU"] == 0
    assert translated["idle_timeout_minutes"] == cr["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] / 60
    groups = {g["groupName"]: g for g in cr["spec"]["workerGroupSpecs"]}
    for group, custom in KUBERAY_GROUPS.items():
        spec = types[group]
        assert spec.min_worker_nodes == 0, group
        assert spec.max_worker_nodes >= 1, group
        assert spec.resources.get(custom) == 1, group
        assert spec.resources.get("CPU", 0) >= 1 and spec.resources.get("memory", 0) > 0, group
        assert all(type(v) is int for v in spec.resources.values()), spec.resources
        assert spec.idle_timeout_s == groups[group]["idleTimeoutSeconds"], group
    assert types["gpu"].resources.get("GPU") == 1
    assert "GPU" not in types["docker-host"].resources and "GPU" not in types["sandbox-client"].resources


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["raycluster", "rayjob"])
def test_kuberay_spec_structure(which: str) -> None:
    """What Ray's translator does not read but the cluster needs: autoscaler v2 named explicitly, no rollouts on the
    head, the shared PVC at /mnt/shared and the secrets by envFrom in every Ray container, the stop wait on the head,
    memory requests and limits, restartPolicy Never, and the docker-host group's Docker-in-Docker sidecar."""
    spec = _kuberay_cluster(which)["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"
    assert spec["autoscalerOptions"]["upscalingMode"] == "Default"
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for group in spec["workerGroupSpecs"]:
        assert 0 == group["minReplicas"] <= group["maxReplicas"], group["groupName"]
        assert "idleTimeoutSeconds" in group, group["groupName"]
    for name, pod in _pods(spec).items():
        ray_container = pod["containers"][0]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        mounts = {m["mountPath"]: m["name"] for m in ray_container["volumeMounts"]}
        assert claims.get(mounts.get(SHARED)) == PVC, name
        assert {"secretRef": {"name": SECRET}} in ray_container["envFrom"], name
        resources = ray_container["resources"]
        assert resources["requests"]["memory"] and resources["limits"]["memory"], name
        assert pod["restartPolicy"] == "Never", name
    head_env = {e["name"]: e.get("value") for e in _pods(spec)[KUBERAY_HEAD]["containers"][0].get("env", [])}
    assert int(head_env[STOP_WAIT]) >= 60

    docker_pod = _pods(spec)["docker-host"]
    ray_container, sidecars = docker_pod["containers"][0], docker_pod["containers"][1:]
    dind = next(c for c in sidecars if "dind" in c["image"])
    assert dind["securityContext"]["privileged"] is True
    env = {e["name"]: e.get("value") for e in ray_container["env"]}
    port = re.search(r"--host=tcp://127\.0\.0\.1:(\d+)", " ".join(dind["args"]))
    assert port and env["DOCKER_HOST"] == f"tcp://127.0.0.1:{port.group(1)}"
    # The sidecar installs raygrpo's firewall chain in the pod's network namespace before its daemon starts, the
    # very commands `docker_guard.ensure` would run (checked in a namespace of its own by test_sandbox_network).
    assert dind["command"] == ["sh", "-c"] and dind["args"][0].startswith(shell_script() + " && exec dockerd")
    assert env[MODE_ENV] == "external"
    tmp = {m["mountPath"]: m["name"] for m in dind["volumeMounts"]}["/tmp"]
    assert {m["mountPath"]: m["name"] for m in ray_container["volumeMounts"]}["/tmp"] == tmp
    gpu = _pods(spec)["gpu"]["containers"][0]["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.timeout(60)
def test_rayjob_fields() -> None:
    """The RayJob deletes its cluster after the job (after a TTL), retries with a fresh cluster, resumes from the
    checkpoints in --out on shared storage (raygrpo's own CLI parser accepts the entrypoint), passes a runtime_env
    Ray accepts, and carries exactly raycluster.yaml's cluster spec."""
    from ray.runtime_env import RuntimeEnv

    from raygrpo.cli.app import _parser

    job = _load("kuberay/rayjob.yaml")["spec"]
    assert job["shutdownAfterJobFinishes"] is True
    assert type(job["ttlSecondsAfterFinished"]) is int and job["ttlSecondsAfterFinished"] > 0
    assert type(job["backoffLimit"]) is int and job["backoffLimit"] >= 1
    argv = shlex.split(job["entrypoint"])
    assert argv[:2] == ["raygrpo", "train"]
    args = _parser().parse_args(argv[1:])
    assert args.command == "train" and args.resume is True
    assert args.out.startswith(f"{SHARED}/") and args.config.startswith(f"{SHARED}/")
    runtime_env = yaml.safe_load(job["runtimeEnvYAML"])
    assert RuntimeEnv(**runtime_env)["env_vars"][STOP_WAIT] == "60"
    assert runtime_env["env_vars"]["RAYGRPO_LEASE_DIR"] == LEASE_DIR  # the ledger on the shared volume
    assert job["rayClusterSpec"] == _load("kuberay/raycluster.yaml")["spec"]


@pytest.mark.timeout(60)
def test_kuberay_pvc() -> None:
    """The shared volume every pod mounts: a ReadWriteMany claim named as the pods name it."""
    pvc = _load("kuberay/pvc.yaml")
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["metadata"]["name"] == PVC
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def _group(name: str, change: Callable[[dict[str, Any]], None]) -> Mutation:
    def mutate(cr: dict[str, Any]) -> None:
        change(next(g for g in cr["spec"]["workerGroupSpecs"] if g["groupName"] == name))
    return mutate


def _drop_cpu(group: dict[str, Any]) -> None:
    group["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "4Gi"}}


KUBERAY_BROKEN: list[tuple[str, Mutation, type[Exception]]] = [
    ("fractional custom resource",
     _group("docker-host", lambda g: g["rayStartParams"].update(resources='"{\\"docker_host\\": 0.5}"')),
     AssertionError),
    ("custom resource given as a string",
     _group("docker-host", lambda g: g["rayStartParams"].update(resources='"{\\"docker_host\\": \\"1\\"}"')),
     AssertionError),
    ("resources without the outer quotes", _group("sandbox-client", lambda g: g["rayStartParams"].update(
        resources='{"sandbox_client": 1}')), json.JSONDecodeError),
    ("maxReplicas below minReplicas", _group("gpu", lambda g: g.update(minReplicas=3, maxReplicas=1)),
     AssertionError),
    ("no CPU for a group", _group("sandbox-client", _drop_cpu), ValueError),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["raycluster", "rayjob"])
@pytest.mark.parametrize("label,mutate,error", KUBERAY_BROKEN, ids=[b[0] for b in KUBERAY_BROKEN])
def test_kuberay_broken_variant_is_rejected(which: str, label: str, mutate: Mutation, error: type[Exception]) -> None:
    """Ray's translator or its v2 autoscaler config rejects each broken variant of the cluster spec."""
    cr = _kuberay_cluster(which)
    mutate(cr)
    with pytest.raises(error):
        _kuberay_autoscaling(cr)


# ── the README's run config on these clusters ──────────────────────────────────────────────────────────────────


def _readme_run_config() -> dict[str, Any]:
    """The example run config of cluster/README.md's section 3 (its first YAML block)."""
    readme = (CLUSTER / "README.md").read_text()
    section = readme[readme.index("## 3. The run config on a cluster"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block, "no YAML block in section 3"
    return yaml.safe_load(block.group(1))


def _readme_demands() -> dict[str, dict[str, float]]:
    """What each actor of the README's example asks Ray for, by config field, read by raygrpo's own config models and
    counted as raygrpo's placement check counts it (`actor_resources`)."""
    from raygrpo.config.policy import VLLMServeConfig
    from raygrpo.config.train import LearnerConfig
    from raygrpo.driver.placement import actor_resources
    from raygrpo.specs.pool import PoolSpec

    run = _readme_run_config()
    demands = {}
    for env, spec in run["envs"].items():
        if "pool" in spec:
            pool = PoolSpec(**spec["pool"])
            assert pool.num_cpus, f"envs.{env}.pool.num_cpus"  # else workers.actor_num_cpus: set it in the example
            demands[f"envs.{env}.pool"] = actor_resources(pool.num_cpus, memory=int(pool.memory or 0),
                                                          resources=pool.resources)
    serve = VLLMServeConfig(**run["policy"]["serve"])
    demands["policy.serve"] = actor_resources(serve.num_cpus, serve.num_gpus, resources=serve.resources)
    learner = LearnerConfig(**run["train"]["learner"])
    demands["train.learner"] = actor_resources(learner.num_cpus, learner.num_gpus, resources=learner.resources)
    return demands


def _node_types(which: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, float]]:
    """Resources of each worker type Ray's autoscaler may add, for a `ray up` file (as `ray up` resolves it) or the
    KubeRay RayCluster."""
    if which in RAY_UP_FILES:
        types = _ray_up(_ray_up_after_fillout(which, monkeypatch)).get_node_type_configs()
    else:
        types = _kuberay_autoscaling(_kuberay_cluster(which))[1]
        types.pop(KUBERAY_HEAD)
    return {name: {k: float(v) for k, v in spec.resources.items()} for name, spec in types.items() if name != "head"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", [*RAY_UP_FILES, "raycluster"])
def test_readme_run_config_fits_the_cluster(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """raygrpo's placement check, which fails a run at start when no node type can hold an actor, accepts every actor
    of the README's example on the cluster (an env pool with `memory` included)."""
    from raygrpo.driver.placement import check_fits

    check_fits(_readme_demands(), nodes=[], node_types=list(_node_types(which, monkeypatch).values()))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", [*RAY_UP_FILES, "raycluster"])
def test_readme_custom_resource_sets_actors_per_node(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the README says of its example holds: the per-actor amount of a node type's custom resource sets how many
    actors share a node, i.e. no other resource (a GPU, CPUs, memory) lets fewer of them onto it."""
    types = _node_types(which, monkeypatch)
    for field, demand in _readme_demands().items():
        custom = {k: v for k, v in demand.items() if k not in ("CPU", "GPU", "memory")}
        (node_type,) = [name for name, offer in types.items() if set(custom) <= set(offer)]
        offer = types[node_type]
        by_custom = min(math.floor(offer[k] / v + 1e-9) for k, v in custom.items())
        by_all = min(math.floor(offer.get(k, 0.0) / v + 1e-9) for k, v in demand.items())
        assert by_custom >= 1 and by_all == by_custom, (field, node_type, demand, offer)


# ── runtime_env.yaml ────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(60)
def test_runtime_env_accepted_by_ray() -> None:
    """runtime_env.yaml is a runtime_env Ray accepts; its env_vars hold the stop wait and nothing secret-looking
    (Ray's runtime_env agent logs them)."""
    from ray.runtime_env import RuntimeEnv

    data = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    env = RuntimeEnv(**data)
    assert env["env_vars"] == {STOP_WAIT: "60", "RAYGRPO_LEASE_DIR": LEASE_DIR}
    assert not [k for k in env["env_vars"] if re.search(r"KEY|TOKEN|SECRET|PASSWORD", k)]
    assert "working_dir" not in data  # given on the command line (`--working-dir .`)


@pytest.mark.timeout(60)
def test_job_supervisor_gets_runtime_env_env_vars() -> None:
    """Ray's job manager gives the JobSupervisor actor the job's runtime_env env_vars, so the supervisor, which reads
    RAY_JOB_STOP_WAIT_TIME_S from its environment when `ray job stop` comes, sees runtime_env.yaml's value."""
    from ray.dashboard.modules.job.job_manager import JobManager

    data = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    manager = object.__new__(JobManager)  # the method only reads `self` for an opt-in log setting
    supervisor_env = JobManager._get_supervisor_runtime_env(manager, data, "raysubmit_test")
    assert supervisor_env["env_vars"][STOP_WAIT] == "60"


@pytest.mark.timeout(60)
def test_runtime_env_excludes_with_ray_packer(tmp_path: Path) -> None:
    """Ray's working_dir packer, given the excludes, leaves out environments, run outputs, git, caches and weights,
    and keeps the code, configs and task suites."""
    from ray._private.runtime_env.packaging import _zip_files

    excludes = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())["excludes"]
    tree = tmp_path / "repo"
    kept = ["raygrpo/cli/app.py", "examples/harbor_local/tasks/t1/task.toml", "examples/echo/train.yaml",
            "cluster/aws.yaml", "pyproject.toml"]
    dropped = [".venv/lib/python3.12/site.py", "runs/echo/metrics.jsonl", ".git/HEAD", "raygrpo/__pycache__/app.pyc",
               "models/smol.gguf", "models/tiny/model.safetensors", "raygrpo.egg-info/PKG-INFO",
               ".pytest_cache/README.md"]
    for rel in kept + dropped:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("x")
    package = tmp_path / "package.zip"
    _zip_files(str(tree), excludes, str(package), include_gitignore=False)
    names = set(zipfile.ZipFile(package).namelist())
    assert set(kept) <= names
    assert not names & set(dropped), names & set(dropped)


@pytest.mark.timeout(60)
def test_readme_states_ray_limits() -> None:
    """cluster/README.md quotes Ray's working_dir size limit and stop wait default as Ray's code has them, and keeps
    the job-submission commands the cluster tests run (tests/test_cluster_job.py)."""
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE
    from ray.dashboard.modules.job.job_supervisor import JobSupervisor

    readme = (CLUSTER / "README.md").read_text()
    assert f"{GCS_STORAGE_MAX_SIZE // 2**20} MiB" in readme
    assert f"{JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S} s" in readme
    assert "## Submitting a job\n" in readme
    submit = readme[readme.index("## Submitting a job"):]
    job_test = (Path(__file__).with_name("test_cluster_job.py")).read_text()
    for flags in ("--working-dir", "--runtime-env", "--no-wait"):
        assert flags in submit and f'"{flags}"' in job_test
    for command in ("ray job status", "ray job logs", "ray job stop"):
        assert command in submit
        assert f'"job", "{command.split()[-1]}"' in job_test
