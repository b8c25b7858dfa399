"""deploy/ renders and validates offline: every kustomize overlay (``kubectl kustomize``)
against the Kubernetes JSON schemas shipped in kubernetes-validate (strict: unknown fields
are errors), the KubeRay RayCluster against its CRD fields and its pod templates against
Kubernetes' PodTemplateSpec; plus what each platform's Deployment must carry, and the
Dockerfiles' sources exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kuberay_schema import RAY_CLUSTER, pod_templates

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.32.0"
pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl (its built-in kustomize) is not installed")


def render(folder: Path) -> list[dict[str, Any]]:
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def validate_k8s(resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


def deployment(resources: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [r for r in resources if r["kind"] == "Deployment"]
    return dep


@pytest.mark.parametrize("overlay", ["cpu", "cuda", "ascend"])
def test_overlay_validates(overlay: str) -> None:
    resources = render(DEPLOY / "overlays" / overlay)
    assert sorted(r["kind"] for r in resources) == [
        "Deployment", "PersistentVolumeClaim", "Service"]
    for resource in resources:
        validate_k8s(resource)
    pod = deployment(resources)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"ironlm-{overlay}:latest"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert pod["terminationGracePeriodSeconds"] >= 30
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])
    assert f"--device={'npu' if overlay == 'ascend' else overlay}" in container["args"]


def test_gpu_and_npu_overlays_ask_for_one_device_per_rank() -> None:
    for overlay, key in (("cuda", "nvidia.com/gpu"), ("ascend", "huawei.com/Ascend910")):
        container = deployment(render(DEPLOY / "overlays" / overlay))["spec"]["template"][
            "spec"]["containers"][0]
        devices = int(container["resources"]["limits"][key])
        assert f"--tensor-parallel-size={devices}" in container["args"]
    ascend = deployment(render(DEPLOY / "overlays" / "ascend"))["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in ascend["containers"][0]["env"]}
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"
    mounts = {m["mountPath"] for m in ascend["containers"][0]["volumeMounts"]}
    assert "/usr/local/Ascend/driver" in mounts


def test_kuberay_cluster_validates() -> None:
    resources = render(DEPLOY / "kuberay")
    kinds = {r["kind"]: r for r in resources}
    assert set(kinds) == {"RayCluster", "Service"}
    validate_k8s(kinds["Service"])
    cluster = kinds["RayCluster"]
    jsonschema.validate(cluster, RAY_CLUSTER)
    for template in pod_templates(cluster):
        validate_k8s({"apiVersion": "v1", "kind": "PodTemplate",
                      "metadata": {"name": "ironlm"}, "template": template})
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    command = " ".join(head["args"])
    assert "$KUBERAY_GEN_RAY_START_CMD" in command
    assert "--distributed-executor-backend ray" in command
    tp = int(re.search(r"--tensor-parallel-size (\d+)", command).group(1))
    pp = int(re.search(r"--pipeline-parallel-size (\d+)", command).group(1))
    gpus = sum(int(g["replicas"]) * int(g["template"]["spec"]["containers"][0]["resources"][
        "limits"]["nvidia.com/gpu"]) for g in cluster["spec"]["workerGroupSpecs"])
    assert tp * pp == gpus  # one GPU per rank, all of them used
    assert kinds["Service"]["spec"]["selector"]["ray.io/node-type"] == "head"


def test_schemas_catch_mistakes() -> None:
    bad = deployment(render(DEPLOY / "overlays" / "cpu"))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_k8s(bad)
    cluster = next(r for r in render(DEPLOY / "kuberay") if r["kind"] == "RayCluster")
    cluster["spec"]["workerGroupSpecs"][0]["replica"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cluster, RAY_CLUSTER)


@pytest.mark.parametrize("platform", ["cpu", "cuda", "ascend"])
def test_dockerfiles_copy_existing_sources(platform: str) -> None:
    text = (DEPLOY / "docker" / f"Dockerfile.{platform}").read_text()
    sources = re.findall(r"^COPY (\S+) ", text, flags=re.M)
    assert sources and all((ROOT / s).exists() for s in sources)
    assert f"./plugins/{platform}" in text and "torch==2.13.0" in text
    assert 'ENTRYPOINT ["ironlm"]' in text
