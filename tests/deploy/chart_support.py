"""Rendering the Helm chart (deploy/helm/inferd) and checking what it renders
against the schemas a cluster would check it with: Kubernetes' own OpenAPI
schemas (the `kubernetes-validate` package) for built-in kinds, and each
operator's released CRD for custom resources (vendored in crds/, see
crds/SOURCES.md)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate import utils as kubernetes_schemas
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "inferd"
CRDS = Path(__file__).resolve().parent / "crds"
# Kubernetes releases the chart is checked against (Chart.yaml's kubeVersion
# starts at 1.33).
KUBE_VERSIONS = ("1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0")


def helm_path() -> str | None:
    """scripts/install.sh puts helm beside the environment's Python."""
    beside = Path(sys.executable).with_name("helm")
    return str(beside) if beside.exists() else shutil.which("helm")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = helm_path()
    assert binary, "helm is missing"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def values_file(tmp: Path, name: str, values: Mapping[str, Any]) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def render(
    values: Path, kube_version: str = KUBE_VERSIONS[-1], namespace: str = "serving"
) -> list[dict[str, Any]]:
    done = helm(
        "template", "inferd", str(CHART), "--namespace", namespace,
        "--kube-version", kube_version, "--values", str(values),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


# -- built-in kinds against Kubernetes' schemas ---------------------------------


@functools.cache
def _definitions(version: str) -> Resource[Any]:
    return Resource.from_contents(
        kubernetes_schemas.schema_contents(
            f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version
        )
    )


@functools.cache
def _kube_validator(version: str, kind: str, api_version: str) -> jsonschema.protocols.Validator:
    """kubernetes-validate's strict schema of a kind (unknown fields refused),
    built once: its own `validate` reloads every definition on each call."""
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # apps/v1 -> apps-v1
    schema = kubernetes_schemas.schema_contents(
        f"kubernetes-json-schema/v{version}-local-strict/{kind.lower()}-{group}.json", version
    )
    registry = (_definitions(version) @ (Resource.from_contents(schema) @ Registry())).crawl()
    return jsonschema.Draft202012Validator(schema, registry=registry)


def kube_errors(document: Mapping[str, Any], version: str) -> list[str]:
    validator = _kube_validator(version, document["kind"], document["apiVersion"])
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    ]


# -- custom resources against their CRDs ------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD's structural schema, with unknown fields refused (the API
    server's strict field validation, `kubectl apply`'s default) where the
    CRD does not keep them (x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> a validator of the CRD's served version."""
    validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if not version.get("served"):
                continue
            schema = _strict(version["schema"]["openAPIV3Schema"])
            # metadata is the API server's (ObjectMeta), not the CRD's.
            schema["properties"]["metadata"] = {"type": "object"}
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return validators


def crd_errors(document: Mapping[str, Any]) -> list[str]:
    validator = crd_validators()[(document["apiVersion"], document["kind"])]
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def is_custom(document: Mapping[str, Any]) -> bool:
    return (document["apiVersion"], document["kind"]) in crd_validators()


# -- labels, as the API server checks them ----------------------------------------

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
LABEL_KEY = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$"
)
LABEL_VALUE = re.compile(rf"^({_NAME})?$")


def label_maps(node: Any) -> Iterator[dict[str, Any]]:
    """Every `labels`, `matchLabels` and `nodeSelector` mapping in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("labels", "matchLabels", "nodeSelector") and isinstance(value, dict):
                yield value
            yield from label_maps(value)
    elif isinstance(node, list):
        for item in node:
            yield from label_maps(item)


def bad_labels(document: Mapping[str, Any]) -> list[str]:
    bad = []
    for labels in label_maps(document):
        for key, value in labels.items():
            if len(key.split("/")[-1]) > 63 or not LABEL_KEY.match(key):
                bad.append(f"key {key!r}")
            if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
                bad.append(f"{key}={value!r}")
    return bad


# -- finding things in the rendered chart -----------------------------------------


def one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in documents if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} rendered"
    return found[0]


def kinds(documents: list[dict[str, Any]]) -> list[str]:
    return sorted(doc["kind"] for doc in documents)


def container(pod_spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    for entry in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        if entry["name"] == name:
            return dict(entry)
    raise AssertionError(f"no container {name}")


def expand(args: list[str], env: Mapping[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of a container's args."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], a) for a in args]
