"""The one metric vocabulary (planner/engines/metric_names.py) against the capability data generated from the released
packages (planner/data/engine_caps), release by release; the operator's PromQL and the emulator's exposition read
only names of it (tests/operator/test_metrics_promql.py, tests/emulator/test_emulator_engine.py)."""

from __future__ import annotations

import pytest

from servingtopology.planner.engines.caps import available_versions, load_caps
from servingtopology.planner.engines.metric_names import LEGACY, RouterMetric, SglangMetric, VllmMetric, vocabulary
from servingtopology.planner.layout import Engine


def exported(series: str, declared: set[str]) -> bool:
    """A series as Prometheus scrapes it is a declared metric, or a counter's `_total` series of one (the capability data
    names counters as the client library declares them, without `_total`)."""
    return series in declared or (series.endswith("_total") and series.removesuffix("_total") in declared)


def _declared(kind: str, version: str) -> set[str]:
    return {m.name for m in load_caps(kind, version).metrics}


@pytest.mark.parametrize(("names", "kind"), [(VllmMetric, "vllm"), (SglangMetric, "sglang"), (RouterMetric, "smg")])
def test_every_current_name_is_one_the_newest_covered_release_exports(names, kind) -> None:
    newest = available_versions(kind)[-1]
    declared = _declared(kind, newest)
    missing = [m.value for m in names if m.value not in LEGACY and not exported(m.value, declared)]
    assert not missing, f"{kind} {newest} exports none of {missing}"


def test_every_legacy_name_is_one_only_an_older_covered_release_exports() -> None:
    for name in LEGACY:
        kind = name.split(":", 1)[0]
        versions = available_versions(kind)
        assert not exported(name, _declared(kind, versions[-1])), f"{name} is exported by the newest {kind} ({versions[-1]})"
        older = [v for v in versions[:-1] if exported(name, _declared(kind, v))]
        assert older, f"{name}: no covered {kind} release exports it; drop it from the vocabulary"


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_each_covered_release_exports_a_name_for_every_figure_kind_of_the_vocabulary(kind) -> None:
    """Per release: every current name, or for a legacy-renamed one its legacy spelling, is exported (a release drops
    no figure the readers rely on without the vocabulary naming what it used instead)."""
    current_to_legacy = {VllmMetric.KV_CACHE_USAGE: VllmMetric.GPU_CACHE_USAGE, VllmMetric.INTER_TOKEN_LATENCY: VllmMetric.TIME_PER_OUTPUT_TOKEN,
                         VllmMetric.PREFIX_CACHE_HITS: VllmMetric.GPU_PREFIX_CACHE_HITS,
                         VllmMetric.PREFIX_CACHE_QUERIES: VllmMetric.GPU_PREFIX_CACHE_QUERIES}
    engine = Engine(kind)
    own = [n for n in vocabulary(engine) if n.startswith(f"{kind}:") and n not in LEGACY]
    for version in available_versions(kind):
        declared = _declared(kind, version)
        missing = [n for n in own if not exported(n, declared) and not exported(current_to_legacy.get(n, n), declared)]
        assert not missing, f"{kind} {version} exports neither {missing} nor their older names"


def test_the_vocabulary_names_each_series_once() -> None:
    for engine in Engine:
        names = vocabulary(engine)
        assert len(names) == len(set(names)), engine
        assert all(n.startswith((f"{engine.value}:", "smg_")) for n in names), engine
