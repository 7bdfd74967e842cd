"""`servingtopology plan SPEC --manifests DIR`: the operator's objects for a ServingTopology, one file each, whose engine
commands are the ones `plan --json` prints for the same resource; a bad spec writes nothing and exits 2 naming the field.
(e2e/test_manifests.py has the real API server accept them and compares them with what the operator applies.)"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from servingtopology.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_manifests_of_a_pinned_resource_are_its_pin_one_file_per_object_in_apply_order(tmp_path: Path,
                                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from servingtopology.cli.commands import role_commands
    from servingtopology.operator.api.resource import parse_topology_spec
    from servingtopology.spec import to_layout, to_problem

    resource = yaml.safe_load((EXAMPLES / "vllm-pinned-pd.yaml").read_text())
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / "vllm-pinned-pd.yaml"), "--manifests", str(out), "--no-simulate", "--no-progress"]) == 0
    assert f"to {out}/" in capsys.readouterr().err
    files = sorted(out.glob("*.yaml"))
    objects = [yaml.safe_load(f.read_text()) for f in files]
    assert [f.name[:3] for f in files] == [f"{i:02d}-" for i in range(1, len(files) + 1)]
    assert all(o["metadata"]["namespace"] == resource["metadata"]["namespace"] and "ownerReferences" not in o["metadata"]
               for o in objects)
    engines = {o["metadata"]["labels"]["servingtopology.io/role"]: o for o in objects
               if o["kind"] == "Deployment" and o["metadata"]["labels"]["servingtopology.io/role"] in ("prefill", "decode")}
    assert set(engines) == {"prefill", "decode"} and any(o["kind"] == "Service" for o in objects)
    # The pin, with the engine commands the CLI prints for that layout (the one renderer both use).
    spec = parse_topology_spec(resource["spec"])
    pinned = to_layout(spec, spec.pinned)
    for rc in role_commands(spec, to_problem(spec, pinned=pinned), pinned):
        deployment = engines[rc.role.value]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert deployment["spec"]["replicas"] == rc.count == resource["spec"]["pinned"][rc.role.value]["count"]
        assert shlex.join([*container["command"], *container["args"]]) == rc.leader, rc.role   # the shell line the CLI prints
    assert pinned.label in files[0].read_text()   # the header names the layout, unescaped


def test_a_bad_spec_writes_nothing_and_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = yaml.safe_load((EXAMPLES / "vllm-replicas.yaml").read_text())
    obj["spec"]["hardware"]["gpu"] = "h100_typo"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(obj))
    assert main(["plan", str(bad), "--manifests", str(tmp_path / "out")]) == 2
    assert "spec.hardware.gpu" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _manifest_layout(directory: Path) -> str:
    """The layout the written objects render, from their header."""
    header = sorted(directory.glob("*.yaml"))[0].read_text().splitlines()[0]
    return header.split(" (", 1)[1].rsplit(", ", 1)[0]


@pytest.mark.parametrize(("example", "flags"), [
    # a Pinned resource: the table and record are its pin (9 objects for 1P2D@TP2), never a searched 2×TP1
    ("vllm-pinned-pd.yaml", ["--no-simulate"]),
    # allowedLayouts [replicas]: what is written is what is printed, with the operator's stage 6
    ("vllm-replicas.yaml", []),
    # a what-if flag moves both: the objects are planned at the load the table states
    ("vllm-replicas.yaml", ["--no-simulate", "--rate", "90"]),
])
def test_the_printed_plan_and_the_written_objects_are_one_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str,
                                                                   flags: list[str]) -> None:
    out = tmp_path / "out"
    assert main(["plan", str(EXAMPLES / example), "--manifests", str(out), "--json", "--no-progress", *flags]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["best"]["label"] == _manifest_layout(out)
    assert plan["decision_record"]["decision"] == plan["best"]["label"]
    if "--rate" in flags:
        assert "at 90 req/s" in plan["reasons"][0]


def test_a_resource_planned_alone_honours_its_policy_as_its_manifests_do(capsys: pytest.CaptureFixture[str]) -> None:
    # allowedLayouts [replicas]: no PD layout is offered, as an alternative or at all; the record says why it is absent
    assert main(["plan", str(EXAMPLES / "vllm-replicas.yaml"), "--json", "--no-simulate", "--no-progress"]) == 0
    plan = json.loads(capsys.readouterr().out)
    kinds = {plan["best"]["layout_spec"]["kind"], *(a["layout_spec"]["kind"] for a in plan["alternatives"])}
    assert kinds == {"replicas"}
    assert "narrowed by a resource's policy.allowedLayouts" in plan["record"]
    # policy.mode Pinned pins spec.pinned without --manifests too
    assert main(["plan", str(EXAMPLES / "vllm-pinned-pd.yaml"), "--json", "--no-simulate", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["label"] == "1P2D@TP2"


def _resource_with(tmp_path: Path, **changes: object) -> Path:
    """examples/vllm-pinned-pd.yaml with `metadata` or `spec` keys replaced."""
    obj = yaml.safe_load((EXAMPLES / "vllm-pinned-pd.yaml").read_text())
    for where, value in changes.items():
        section, key = where.split("__")
        obj[section][key] = value
    path = tmp_path / "resource.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


@pytest.mark.parametrize(("where", "value", "field"), [
    # a newline would end the header's comment line and inject YAML into every file
    ("metadata__namespace", "default\nkind: Secret", "metadata.namespace"),
    # `$` alone matches before a final newline: the name too is matched whole
    ("metadata__name", "llama\n", "metadata.name"),
    # what the API server would refuse as a namespace
    ("metadata__namespace", "Team_A", "metadata.namespace"),
    ("metadata__namespace", ["default"], "metadata.namespace"),
])
def test_manifests_refuse_a_name_or_namespace_the_api_server_would_and_write_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, value: object, field: str) -> None:
    out = tmp_path / "out"
    assert main(["plan", str(_resource_with(tmp_path, **{where: value})), "--manifests", str(out), "--no-simulate",
                 "--no-progress"]) == 2
    assert f"{field}:" in capsys.readouterr().err
    assert not out.exists()


def test_manifests_refuse_templates_the_operator_would_refuse_naming_each_field(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # the High case of the tenancy review: a 7-GPU sidecar at a system priority; the operator refuses it (PodTemplateRefused)
    template = {"spec": {"priorityClassName": "system-node-critical",
                         "containers": [{"name": "side", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 7}}}]}}
    path = _resource_with(tmp_path, spec__podTemplate=template)
    out = tmp_path / "out"
    assert main(["plan", str(path), "--manifests", str(out), "--no-simulate", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "spec.podTemplate.spec.priorityClassName:" in err and "PodTemplateRefused" in err
    assert 'spec.podTemplate.spec.containers[0].resources.limits["nvidia.com/gpu"]: PodTemplateRefused: 7' in err
    assert not out.exists()
    # a grant the chart may give lifts what it grants; a system- class and GPUs stay refused whatever is granted
    assert main(["plan", str(path), "--manifests", str(out), "--no-simulate", "--no-progress", "--grant", "Priority"]) == 2
    err = capsys.readouterr().err
    assert "priorityClassName" in err and "nvidia.com/gpu" in err and not out.exists()
    fine = _resource_with(tmp_path, spec__podTemplate={"spec": {"priorityClassName": "batch-high"}})
    assert main(["plan", str(fine), "--manifests", str(out), "--no-simulate", "--no-progress"]) == 2
    assert "needs grant Priority" in capsys.readouterr().err
    assert main(["plan", str(fine), "--manifests", str(out), "--no-simulate", "--no-progress", "--grant", "Priority"]) == 0


def test_manifests_refuse_objects_over_the_api_servers_annotation_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # each annotation within the CRD's 4 KiB, 64 of them: together over apimachinery's 256 KiB (ObjectTooLarge)
    annotations = {f"example.com/a{i:02d}": "x" * 4096 for i in range(64)}
    path = _resource_with(tmp_path, spec__podTemplate={"metadata": {"annotations": annotations}})
    out = tmp_path / "out"
    assert main(["plan", str(path), "--manifests", str(out), "--no-simulate", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "ObjectTooLarge" in err and "262,144" in err and not out.exists()


def test_an_unknown_grant_is_refused_naming_the_allowed_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(EXAMPLES / "vllm-pinned-pd.yaml"), "--manifests", str(tmp_path / "out"), "--grant", "Root"]) == 2
    err = capsys.readouterr().err
    assert "--grant:" in err and "Privileged" in err
