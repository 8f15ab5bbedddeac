"""The Kubernetes manifests in deploy/kubernetes/ (docs/deployment.md) hold together.

No Kubernetes cluster runs here, and ``kubectl apply --dry-run=client`` asks a
server for the API's schemas, so each document is checked against the
Kubernetes API's own JSON schemas, strict (an unknown or misspelt field is an
error), with ``kubernetes-validate`` (the test extra). Then what no schema
sees: the configuration in the Secret is one weald accepts, each container's
command is one ``weald`` parses, the names the manifests point at each other
with (selectors, volumes, ports, the Secret, the claim) exist, and the paths
the environment names are mounted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from weald.runtime.daemon import parse_config
from weald.runtime.daemon.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
# The oldest Kubernetes version still supported upstream when these were written, and the newest the
# validator knows: the manifests must hold on both.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
_ENV_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                found.append((f"{path.name}: {doc['kind']} {doc['metadata']['name']}", doc))
    return found


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == kind}


def schema_errors(doc: dict[str, Any], version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return f"{path}: {exc.message}"
    return None


def workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in documents() if doc["kind"] in ("StatefulSet", "Deployment")]


def test_there_are_nodes_a_front_and_their_configuration() -> None:
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == ["Deployment", "PersistentVolumeClaim", "Secret", "Service", "StatefulSet"], kinds


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_against_the_kubernetes_api_schemas(version: str) -> None:
    problems = {name: error for name, doc in documents() if (error := schema_errors(doc, version)) is not None}
    assert not problems, problems


def test_the_schema_check_catches_a_misspelt_field_and_a_wrong_type() -> None:
    _, doc = next((name, doc) for name, doc in documents() if doc["kind"] == "StatefulSet")
    misspelt = yaml.safe_load(yaml.safe_dump(doc))
    misspelt["spec"]["replica"] = misspelt["spec"].pop("replicas")
    assert "replica" in (schema_errors(misspelt, VERSIONS[0]) or "")
    wrong = yaml.safe_load(yaml.safe_dump(doc))
    wrong["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "seven thousand"
    assert schema_errors(wrong, VERSIONS[0]) is not None


def test_the_configuration_is_one_weald_accepts_and_holds_the_cluster_s_settings(tmp_path: Path) -> None:
    secret = by_kind("Secret")["weald-config"]
    config = parse_config(secret["stringData"]["weald.toml"], source="deploy/kubernetes/config.yaml", home=tmp_path)
    assert config.store.url is not None
    assert config.store.url.startswith("postgresql://")
    assert config.cluster.secret is not None
    assert config.cluster.listen is None  # each node's --listen is its pod's address


def test_each_container_runs_a_weald_command_that_parses_with_the_variables_it_names() -> None:
    parser = build_parser()
    commands = {}
    for name, doc in workloads():
        for container in doc["spec"]["template"]["spec"]["containers"]:
            args = container["args"]
            assert args[0] == "weald", (name, args)
            declared = {env["name"] for env in container.get("env", [])}
            used = {ref for arg in args for ref in _ENV_REF.findall(arg)}
            assert used <= declared, (name, used - declared)  # Kubernetes leaves an undeclared $(X) as it is
            expanded = [_ENV_REF.sub("x1", arg) for arg in args[1:]]
            expanded = [arg.replace("x1:7400", "10.0.0.1:7400") for arg in expanded]
            parsed = parser.parse_args(expanded)
            commands[doc["kind"]] = parsed
            probe = container.get("readinessProbe", {}).get("exec", {}).get("command")
            if probe:
                assert probe[0] == "weald"
                parser.parse_args(probe[1:])
    node, front = commands["StatefulSet"], commands["Deployment"]
    assert node.command == "serve"
    assert node.listen == "10.0.0.1:7400"
    assert node.node_id == "x1"
    assert not node.front
    assert front.command == "serve"
    assert front.front
    assert front.http.startswith("127.0.0.1:")  # the observer on loopback: reached by port-forward


def test_the_names_the_manifests_point_at_each_other_with_exist() -> None:
    secrets, services, claims = by_kind("Secret"), by_kind("Service"), by_kind("PersistentVolumeClaim")
    for name, doc in workloads():
        spec = doc["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), name
        pod = spec["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        templates = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
        security = pod.get("securityContext", {})
        for volume in volumes.values():
            if "secret" in volume and security.get("runAsUser", 0) != 0:
                # A Secret's files are root's: a pod running as another user reads them through fsGroup.
                assert "fsGroup" in security, (name, "the secret unreadable by the pod's user")
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, (name, volume)
                assert volume["secret"]["defaultMode"] & 0o077 == 0, (name, "the secret readable by its owner only")
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, (name, volume)
        for container in pod["containers"]:
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert set(mounts) <= set(volumes) | templates, (name, set(mounts) - set(volumes) - templates)
            env = {e["name"]: e.get("value") for e in container["env"]}
            # The files and directories the environment names are on mounted volumes.
            for variable in ("WEALD_CONFIG", "WEALD_HOME", "WEALD_SOCKET"):
                if env.get(variable):
                    assert any(
                        env[variable].startswith(path + "/") or env[variable] == path for path in mounts.values()
                    ), (
                        name,
                        variable,
                    )
            ports = {p["name"] for p in container.get("ports", [])}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = container.get(probe, {}).get("tcpSocket", {}).get("port")
                if isinstance(port, str):
                    assert port in ports, (name, probe, port)
        if doc["kind"] == "StatefulSet":
            service = services[spec["serviceName"]]
            assert service["spec"]["selector"].items() <= labels.items()
            container_ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
            assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
