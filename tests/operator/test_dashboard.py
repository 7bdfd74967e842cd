"""The chart's Grafana dashboard: every panel's PromQL parses with Prometheus' own parser (promtool, from Debian's
prometheus package), every metric a panel reads is one the operator exports (its registry) or a covered engine or
router release exports (planner/data/engine_caps, generated from the released packages), the panels the issue asks
for are there, and the chart ships it as a ConfigMap for Grafana's sidecar behind an on/off switch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import CHART, helm_template

from servingtopology.operator.entry.telemetry import TOPOLOGY_LABELS, new_metrics
from servingtopology.planner.engines.caps import available_versions, load_caps

DASHBOARD = CHART / "dashboards" / "servingtopology.json"

# Grafana's variables, replaced by what Grafana would put there before Prometheus sees the query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "3h", "${datasource}": "prometheus"}
# PromQL words that look like metric names: functions, aggregations, keywords (prometheus/promql/parser).
PROMQL_WORDS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count", "count_over_time", "count_values", "deriv", "delta", "exp", "floor", "group", "histogram_quantile", "idelta",
    "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log2", "log10", "max", "max_over_time", "min",
    "min_over_time", "predict_linear", "quantile", "quantile_over_time", "rate", "resets", "round", "scalar", "sort", "sort_desc",
    "sqrt", "stddev", "stdvar", "sum", "sum_over_time", "time", "timestamp", "topk", "vector", "by", "without", "on", "ignoring",
    "group_left", "group_right", "and", "or", "unless", "bool", "offset", "inf", "nan",
}


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out += panel.get("panels", [])   # a collapsed row holds its panels
    return out


def expressions(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel or annotation title, PromQL with Grafana's variables substituted) for every target of every panel and
    every Prometheus annotation."""
    out = [(p["title"], substitute(t["expr"])) for p in panels(dash) for t in p.get("targets", []) if t.get("expr")]
    return out + [(a["name"], substitute(a["expr"])) for a in dash["annotations"]["list"] if a.get("expr")]


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return re.sub(r"\$\{?(\w+)\}?", "x", expr)   # the dashboard's own variables sit inside =~ matchers


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: words outside strings, label matchers, grouping lists and ranges
    that are not PromQL functions or keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    words = re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)", text)
    return {w for w in words if w.lower() not in PROMQL_WORDS}


def exported_names() -> set[str]:
    """Sample names the operator's registry exposes, and those of every covered engine and router release."""
    names: set[str] = set()
    for family in new_metrics().registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    for kind in ("vllm", "sglang", "vllm-router", "sglang-router", "smg"):
        for version in available_versions(kind):
            for m in load_caps(kind, version).metrics:
                if m.type == "counter":
                    names.add(m.name if m.name.endswith("_total") else f"{m.name}_total")
                elif m.type == "histogram":
                    names |= {f"{m.name}_{s}" for s in ("bucket", "sum", "count")}
                else:
                    names.add(m.name)
    return names


def promtool_check(exprs: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on a recording rule per expression: Prometheus' parser reads every `expr`."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install -y prometheus (.ci/run installs it)"
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def test_every_panel_expression_parses_with_promtool(tmp_path: Path) -> None:
    exprs = [e for _, e in expressions(dashboard())]
    assert len(exprs) >= 20
    done = promtool_check(exprs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


@pytest.mark.parametrize("broken", [
    'sum(rate(servingtopology_reconciles_total[1m])',                    # unbalanced parenthesis
    'servingtopology_plan_gpus{topology=~"a"',                          # unclosed matcher
    'histogram_quantile(0.95, sum by (le) rate(vllm:e2e_request_latency_seconds_bucket[1m]))',  # by without a call
    'rate(servingtopology_plan_gpus[1x])',                               # a bad duration
])
def test_the_promtool_check_fails_on_a_broken_expression(broken: str, tmp_path: Path) -> None:
    exprs = [e for _, e in expressions(dashboard())] + [broken]
    done = promtool_check(exprs, tmp_path)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr, done.stdout + done.stderr


def test_every_metric_a_panel_reads_is_exported_by_the_operator_or_a_covered_engine() -> None:
    known = exported_names()
    dash = dashboard()
    used = {(title, name) for title, expr in expressions(dash) for name in metric_names(expr)}
    for variable in dash["templating"]["list"]:
        if variable["type"] == "query":   # label_values(SELECTOR, LABEL): the label must be one the operator's series carry
            selector, label = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["definition"]).groups()  # type: ignore[union-attr]
            used |= {(variable["name"], n) for n in metric_names(substitute(selector))}
            assert label in TOPOLOGY_LABELS, variable
    unknown = sorted((t, n) for t, n in used if n not in known)
    assert not unknown, unknown
    names = {n for _, n in used}
    assert {"servingtopology_predicted_ttft_seconds", "vllm:time_to_first_token_seconds_bucket",
            "sglang:time_to_first_token_seconds_bucket", "servingtopology_plan_info"} <= names


def test_the_metric_name_extraction_sees_through_functions_matchers_and_grouping() -> None:
    expr = substitute('histogram_quantile(0.95, sum by (le, namespace) (rate(vllm:time_to_first_token_seconds_bucket'
                      '{namespace=~"$namespace", le!="+Inf"}[$__rate_interval]))) / on (namespace) group_left (x) foo_total')
    assert metric_names(expr) == {"vllm:time_to_first_token_seconds_bucket", "foo_total"}
    assert "not_a_metric_anywhere" not in exported_names()


def test_the_dashboard_has_the_panels_the_issue_asks_for_and_each_has_a_unit_and_a_description() -> None:
    dash = dashboard()
    graphs = [p for p in panels(dash) if p["type"] != "row"]
    titles = " | ".join(p["title"] for p in graphs)
    for wanted in ("TTFT", "TPOT", "Prediction error", "Layout", "P:D", "Transition phase", "Transitions started",
                   "Pass and plan duration", "Failures", "Prefix-cache hit rate", "KV-cache usage"):
        assert wanted in titles, (wanted, titles)
    # The resource's own SLO as a line on the latency panels, read from the operator's series of spec.slo.
    for title, metric in (("TTFT", "servingtopology_slo_ttft_seconds"), ("TPOT", "servingtopology_slo_tpot_seconds")):
        (panel,) = [p for p in graphs if p["title"].startswith(title)]
        assert any(metric in t["expr"] for t in panel["targets"]), panel["title"]
    # Replans as annotations on every panel: when a transition to a new layout started.
    (replans,) = [a for a in dash["annotations"]["list"] if a["name"] == "Replans"]
    assert "servingtopology_transitions_total" in replans["expr"] and "$topology" in replans["expr"] and replans["enable"]
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))
    for p in graphs:
        assert p["description"] and p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert all("$topology" in t["expr"] for t in p["targets"]) or p["title"].startswith(("Pass", "Passes", "Failures", "Decisions")), p["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "namespace", "topology"}


def test_the_chart_ships_the_dashboard_for_the_grafana_sidecar_behind_a_switch() -> None:
    (cm,) = [d for d in helm_template() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["servingtopology.json"]) == dashboard()
    (cm,) = [d for d in helm_template("grafanaDashboard.namespace=monitoring", "grafanaDashboard.labels.grafana_dashboard=yes",
                                       "grafanaDashboard.annotations.grafana_folder=LLM")
             if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert not [d for d in helm_template("grafanaDashboard.enabled=false") if d["kind"] == "ConfigMap"]
