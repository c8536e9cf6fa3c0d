"""The Helm chart (deploy/helm/inferd), rendered by the real helm for a matrix
of values and each Kubernetes release it supports; every object it renders
checked against the schema the API server would check it with, and the
commands and settings it gives inferd checked against inferd's own CLI and
settings. No cluster is run (docs/kubernetes.md says what that leaves)."""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferd.cli import build_parser, main
from inferd.control.launchers.ray_resources import node_resources
from inferd.settings import Settings, env_name, load_settings, setting_keys
from tests.deploy.chart_support import (
    CHART,
    KUBE_VERSIONS,
    bad_labels,
    container,
    crd_errors,
    expand,
    helm,
    is_custom,
    kinds,
    kube_errors,
    one,
    render,
    values_file,
)
from tests.support import needs

pytestmark = needs("helm")

DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
POD_IP = "10.1.2.3"
GROUPS = [
    {
        "name": "use-h100", "location": "us-east", "region": "us-east-1",
        "gpuType": "H100-80GB", "gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpusPerPod": 8,
        "replicas": 1, "minReplicas": 0, "maxReplicas": 4,
        "resources": {"requests": {"cpu": "16", "memory": "128Gi"}},
    },
    {
        "name": "euw-l40s", "location": "eu-west", "region": "eu-west-1",
        "gpuType": "L40S", "gpuProduct": "NVIDIA-L40S", "gpusPerPod": 4,
        "replicas": 0, "minReplicas": 0, "maxReplicas": 2,
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu"}],
    },
    {
        "name": "apne-l4", "location": "ap-northeast", "region": "ap-northeast-1",
        "gpuType": "L4", "gpuProduct": "NVIDIA-L4", "gpusPerPod": 1,
        "replicas": 2, "minReplicas": 1, "maxReplicas": 8,
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}},
    },
]  # fmt: skip


def merged(base: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# external database or CloudNativePG, 1-3 GPU groups, with and without ServiceMonitor.
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cnpg-3-groups-monitor": {
        "database": {
            "mode": "cloudnativepg",
            "cloudnativepg": {"storage": {"storageClass": "ssd"}},
        },
        "ray": {"workerGroups": GROUPS},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    },
    "external-2-groups-settings": {
        "image": {"repository": "registry.example.com/inferd", "tag": "0.1.0-cuda"},
        "imagePullSecrets": [{"name": "pull"}],
        "serve": {
            "replicas": 3,
            "publicUrl": "https://inferd.example.com",
            "settings": {"autoscale_target_concurrency": 4, "ray_placement": "pack"},
            "tolerations": [{"key": "control", "operator": "Exists"}],
        },
        "ray": {"workerGroups": GROUPS[:2]},
        "serviceMonitor": {"enabled": True, "interval": "15s"},
    },
}


@pytest.fixture(scope="module")
def rendered(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """case -> Kubernetes version -> the rendered objects.

    The templates do not depend on the Kubernetes version (the first case
    shows it, rendered for each): the others are rendered once, for the
    oldest release, and validated against every release's schemas."""
    tmp = tmp_path_factory.mktemp("values")
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for index, (case, change) in enumerate(CASES.items()):
        path = values_file(tmp, case, merged(DEFAULTS, change))
        if index == 0:
            out[case] = {version: render(path, version) for version in KUBE_VERSIONS}
        else:
            documents = render(path, KUBE_VERSIONS[0])
            out[case] = {version: documents for version in KUBE_VERSIONS}
    return out


def test_rendering_does_not_depend_on_the_kubernetes_release(rendered: dict[str, Any]) -> None:
    by_version = rendered["defaults"]
    assert all(by_version[v] == by_version[KUBE_VERSIONS[0]] for v in KUBE_VERSIONS)


def test_releases_before_1_33_are_refused(tmp_path: Path) -> None:
    """Native sidecars (the serve pod's Ray node) are stable from 1.33."""
    done = helm("template", "inferd", str(CHART), "--kube-version", "1.32.0",
                "--values", str(values_file(tmp_path, "defaults", DEFAULTS)))  # fmt: skip
    assert done.returncode != 0 and "kubeVersion" in done.stderr, done.stderr


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_passes(case: str, tmp_path: Path) -> None:
    done = helm("lint", "--strict", str(CHART), "--values",
                str(values_file(tmp_path, case, merged(DEFAULTS, CASES[case]))))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_matrix_renders_what_each_case_asks_for(rendered: dict[str, Any]) -> None:
    latest = {case: by_version[KUBE_VERSIONS[-1]] for case, by_version in rendered.items()}
    assert kinds(latest["defaults"]) == [
        "Deployment", "PodDisruptionBudget", "RayCluster", "Service",
    ]  # fmt: skip
    assert kinds(latest["cnpg-3-groups-monitor"]) == [
        "Cluster", "Deployment", "PodDisruptionBudget", "RayCluster", "Service", "ServiceMonitor",
    ]  # fmt: skip
    for case, groups in (
        ("defaults", 1),
        ("cnpg-3-groups-monitor", 3),
        ("external-2-groups-settings", 2),
    ):
        assert len(one(latest[case], "RayCluster")["spec"]["workerGroupSpecs"]) == groups


def test_built_in_objects_pass_each_kubernetes_release_schema(rendered: dict[str, Any]) -> None:
    checked = 0
    for case, by_version in rendered.items():
        for version, documents in by_version.items():
            for document in documents:
                if is_custom(document):
                    continue
                errors = kube_errors(document, version)
                assert errors == [], f"{case}, Kubernetes {version}, {document['kind']}"
                checked += 1
    assert checked == len(CASES) * len(KUBE_VERSIONS) * 3  # Deployment, Service, PDB


def test_strict_validation_refuses_what_the_api_server_would(rendered: dict[str, Any]) -> None:
    """The two checkers above can fail: an unknown field and a wrong type are refused."""
    documents = rendered["cnpg-3-groups-monitor"][KUBE_VERSIONS[-1]]
    deployment = copy.deepcopy(one(documents, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    deployment["spec"]["replicas"] = "two"
    errors = kube_errors(deployment, KUBE_VERSIONS[0])
    assert any("livenessprobe" in e for e in errors) and any("'two'" in e for e in errors), errors
    ray = copy.deepcopy(one(documents, "RayCluster"))
    ray["spec"]["workerGroupSpecs"][0]["gpus"] = 8
    ray["spec"]["workerGroupSpecs"][1]["minReplicas"] = "none"
    errors = crd_errors(ray)
    assert any("gpus" in e for e in errors) and any("minReplicas" in e for e in errors), errors


def test_custom_resources_pass_their_operators_crds(rendered: dict[str, Any]) -> None:
    seen = set()
    for case, by_version in rendered.items():
        for document in by_version[KUBE_VERSIONS[-1]]:
            if is_custom(document):
                assert crd_errors(document) == [], f"{case}: {document['kind']}"
                seen.add(document["kind"])
    assert seen == {"RayCluster", "Cluster", "ServiceMonitor"}


def test_labels_and_selectors_are_valid_and_match(rendered: dict[str, Any]) -> None:
    for case, by_version in rendered.items():
        documents = by_version[KUBE_VERSIONS[-1]]
        for document in documents:
            assert bad_labels(document) == [], f"{case}: {document['kind']}"
        deployment = one(documents, "Deployment")
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        selectors = [
            deployment["spec"]["selector"]["matchLabels"],
            one(documents, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
            one(documents, "Service")["spec"]["selector"],
        ]
        for kind in ("ServiceMonitor",):
            selectors += [
                d["spec"]["selector"]["matchLabels"] for d in documents if d["kind"] == kind
            ]
        for selector in selectors:
            assert selector.items() <= pod_labels.items(), (
                f"{case}: {selector} selects no serve pod"
            )


def test_serve_runs_two_or_more_instances_with_a_budget_and_health_probes(
    rendered: dict[str, Any],
) -> None:
    for case, by_version in rendered.items():
        documents = by_version[KUBE_VERSIONS[-1]]
        deployment = one(documents, "Deployment")
        assert deployment["spec"]["replicas"] >= 2, case
        assert one(documents, "PodDisruptionBudget")["spec"]["minAvailable"] >= 1
        serve = container(deployment["spec"]["template"]["spec"], "serve")
        port = serve["ports"][0]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert serve[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}, probe
        assert serve["resources"]["requests"], case
        service = one(documents, "Service")
        assert service["spec"]["ports"][0]["targetPort"] == port["name"]
        assert serve["securityContext"]["runAsNonRoot"] is True


def _env(entry: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, str]:
    """A container's environment as the kubelet gives it: secrets by name, the pod IP."""
    env = {}
    for var in entry.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[f"{ref['name']}/{ref['key']}"]
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", var
            env[var["name"]] = POD_IP
    return env


SECRETS = {
    "inferd-admin/admin-key": "infd_admin_" + "k" * 40,
    "inferd-database/url": "postgresql://inferd:pw@db.example.com:5432/inferd",
    "inferd-db-app/uri": "postgresql://inferd:pw@inferd-db-rw.serving:5432/inferd",
}
# What the chart sets besides inferd's settings: the downward API's pod IP
# (for $(POD_IP)) and the NVIDIA runtime's device list.
NOT_SETTINGS = {"POD_IP", "NVIDIA_VISIBLE_DEVICES"}


def _serve_settings(documents: list[dict[str, Any]]) -> tuple[Settings, set[str]]:
    serve = container(one(documents, "Deployment")["spec"]["template"]["spec"], "serve")
    env = _env(serve, SECRETS)
    assert serve["command"] == ["inferd"]
    args = build_parser().parse_args(expand(serve["args"], env))
    assert args.command == "serve"
    overrides = {key: getattr(args, key) for key in setting_keys()}
    settings = load_settings(env=env, overrides=overrides)
    flags = {key for key, value in overrides.items() if value is not None}
    return settings, flags | {name for name in env if name not in NOT_SETTINGS}


def test_serve_command_and_environment_are_settings_inferd_serve_reads(
    rendered: dict[str, Any],
) -> None:
    names = {env_name(key) for key in setting_keys()}
    for case, by_version in rendered.items():
        documents = by_version[KUBE_VERSIONS[-1]]
        serve = container(one(documents, "Deployment")["spec"]["template"]["spec"], "serve")
        unknown = {var["name"] for var in serve["env"]} - names - NOT_SETTINGS
        assert unknown == set(), f"{case}: not settings of inferd serve: {unknown}"
        settings, _ = _serve_settings(documents)
        assert settings.clustered, case  # PostgreSQL: the instances elect a leader
        assert settings.launcher == "ray"
        assert settings.ray_address == "inferd-ray-head-svc.serving.svc:6379"
        assert settings.host == POD_IP and settings.ray_node_ip_address == POD_IP
        # Replicas on other pods report here: never to a loopback address.
        assert settings.registry_url == f"http://{POD_IP}:8080/internal/registry"
        assert settings.admin_key_value() == SECRETS["inferd-admin/admin-key"]
    settings, _ = _serve_settings(rendered["external-2-groups-settings"][KUBE_VERSIONS[-1]])
    assert settings.public_url == "https://inferd.example.com"
    assert (settings.autoscale_target_concurrency, settings.ray_placement) == (4, "pack")
    settings, _ = _serve_settings(rendered["cnpg-3-groups-monitor"][KUBE_VERSIONS[-1]])
    assert settings.database_url == SECRETS["inferd-db-app/uri"]
    assert settings.public_url == "http://inferd.serving.svc:8080"


def test_values_schema_refuses_the_settings_the_chart_sets_itself(
    rendered: dict[str, Any],
) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    names = schema["properties"]["serve"]["properties"]["settings"]["propertyNames"]
    _, chart_sets = _serve_settings(rendered["defaults"][KUBE_VERSIONS[-1]])
    chart_keys = {name.removeprefix("INFERD_").lower() for name in chart_sets if name.isupper()}
    chart_keys |= {name for name in chart_sets if not name.isupper()}
    assert set(names["not"]["enum"]) == chart_keys
    assert chart_keys <= set(setting_keys())


def _dry_run(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`inferd node start ... --dry-run`: the `ray start` it would run."""
    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.verb) == ("node", "start")
    capsys.readouterr()
    assert main([*args[: args.index("--")], "--dry-run", *args[args.index("--") :]]) == 0
    ray_start = shlex.split(capsys.readouterr().out.splitlines()[-1])
    flags = dict(a.removeprefix("--").split("=", 1) for a in ray_start[2:] if "=" in a)
    return {
        "resources": json.loads(flags["resources"]),
        "num_gpus": int(flags["num-gpus"]),
        "flags": ray_start[2:],
    }


def test_ray_pods_run_inferd_node_start_declaring_their_group(
    rendered: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pods that ask for no GPU see none (NVIDIA_VISIBLE_DEVICES=void):
    # detection finds nothing there, as it does on this machine.
    monkeypatch.setattr("inferd.node.cli.detect_gpus", lambda: [])
    documents = rendered["cnpg-3-groups-monitor"][KUBE_VERSIONS[-1]]
    ray = one(documents, "RayCluster")
    assert ray["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    address = "inferd-ray-head-svc.serving.svc:6379"

    head = ray["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head_env = _env(head, SECRETS)
    assert head_env["NVIDIA_VISIBLE_DEVICES"] == "void"
    declared = _dry_run(expand(head["args"], head_env), capsys)
    assert "--head" in declared["flags"] and "--num-cpus=0" in declared["flags"]
    assert declared["num_gpus"] == 0

    sidecar = container(one(documents, "Deployment")["spec"]["template"]["spec"], "ray-node")
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar beside `inferd serve`
    declared = _dry_run(expand(sidecar["args"], _env(sidecar, SECRETS)), capsys)
    assert f"--address={address}" in declared["flags"] and "--num-cpus=0" in declared["flags"]
    assert not any(key.startswith("gpu_type:") for key in declared["resources"])

    groups = ray["spec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == [g["name"] for g in GROUPS]
    for group, want in zip(groups, GROUPS, strict=True):
        pod = group["template"]["spec"]
        worker = pod["containers"][0]
        declared = _dry_run(expand(worker["args"], _env(worker, SECRETS)), capsys)
        expected = node_resources(want["location"], want["gpuType"], want["gpusPerPod"])
        assert declared["resources"] == expected
        assert declared["num_gpus"] == want["gpusPerPod"]
        assert f"--address={address}" in declared["flags"] and "--block" in declared["flags"]
        # KubeRay (and its autoscaler) are told what the node declares.
        assert {k: float(v) for k, v in group["resources"].items()} == expected
        assert group["labels"] == {
            "inferd.dev/location": want["location"], "inferd.dev/gpu-type": want["gpuType"],
        }  # fmt: skip
        gpus = worker["resources"]
        assert (
            gpus["requests"]["nvidia.com/gpu"]
            == gpus["limits"]["nvidia.com/gpu"]
            == want["gpusPerPod"]
        )
        assert pod["nodeSelector"] == {
            "topology.kubernetes.io/region": want["region"],
            "nvidia.com/gpu.product": want["gpuProduct"],
        }
        assert (group["minReplicas"], group["maxReplicas"]) == (
            want["minReplicas"],
            want["maxReplicas"],
        )


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"serve": {"replicas": 1}}, "replicas"),
        ({"ray": {"workerGroups": []}}, "workerGroups"),
        ({"ray": {"workerGroups": [dict(GROUPS[0], gpuType="cpu")]}}, "gpuType"),
        ({"ray": {"workerGroups": [dict(GROUPS[0], gpusPerPod=0)]}}, "gpusPerPod"),
        ({"serve": {"settings": {"host": "0.0.0.0"}}}, "'host'"),
        ({"serve": {"settings": {"Bad-Key": 1}}}, "'Bad-Key'"),
        ({"database": {"mode": "sqlite"}}, "mode"),
        ({"adminKey": {"existingSecret": ""}}, "existingSecret"),
    ],
    ids=[
        "one-instance",
        "no-gpu-group",
        "cpu-group",
        "zero-gpus",
        "reserved-setting",
        "malformed-setting",
        "sqlite",
        "no-admin-secret",
    ],
)
def test_values_schema_refuses_bad_values(
    change: dict[str, Any], complaint: str, tmp_path: Path
) -> None:
    done = helm("template", "inferd", str(CHART), "--values",
                str(values_file(tmp_path, "bad", merged(DEFAULTS, change))))  # fmt: skip
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert complaint in done.stderr, done.stderr


def test_node_start_parser_accepts_the_rendered_worker_flags_only() -> None:
    """The parse above is real: a flag the CLI lacks is refused."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["node", "start", "--address", "h:1", "--location", "x", "--gpus", "8"]
        )
