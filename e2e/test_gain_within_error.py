"""spec.policy.gainWithinError on the local stack (issue #27 part 4): a move made for its gain starts only when that
gain beats the combined uncertainty of the before and after predictions.

Llama-3.1-8B with objective min-gpus, planned for 44 req/s (2048 in, 256 out): 4×TP1, 4 GPUs. The emulator
serves 26.5 req/s once all four engines serve, 40 % under the plan: the operator detects the drift and replans for the
measured load, whose best layout is 3×TP1 (one GPU fewer, 33 % better on min-gpus, above minImprovement 10 %). 3×TP1
is picked from about 23 req/s to 33 (from 34 4×TP1 is: 0 % better, PlanKept); the measured rate reads 0-11 % high
for the first intervals of a rise (28 req/s was planned as 31.0, 30 as 31.1, 27 as 27.4), so 26.5 sits mid-band. Its TPOT intervals (vLLM
single-gpu and tp classes of planner/data/prediction_intervals.json) add up to a combined uncertainty of 37 %, so
nothing changes: one `GainWithinError` Event names both intervals and every Deployment keeps its generation,
replicas and engine command. Then the traffic falls to 10 req/s: every layout the replan can pick on the way down
(2×TP1 at 12–22 req/s, 1×TP1 at 8–11; this parameter file) halves the GPUs or better, beyond the bar; the move starts
(`TransitionStarted` quoting the gate) and status.replan.move records the TPOT interval predicted for the target,
which the TPOT measured on the settled new layout is judged against (JudgedOnTheMovedLayout) (PredictionHit/PredictionMissed; not waited for here).
The layouts and the bars were checked offline with the operator's own planner (stage-6 simulator) at 8–33 req/s and
TPOT/TTFT calibration corrections of 0.6–1.5: the same outcome throughout.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import engine_containers, topology
from .processes import wait_until
from .stack import Emulator, Operator

TOKENS = {"input_tokens": 2048, "output_tokens": 256}
INTERVAL = re.compile(r"before (\d+\.\d) \[(\d+\.\d)–(\d+\.\d)\], after (\d+\.\d) \[(\d+\.\d)–(\d+\.\d)\]")


def _workloads(kube: Kube, namespace: str, name: str) -> dict[str, tuple[int, int, list[Any]]]:
    """Each Deployment's (generation, spec.replicas, engine containers' command + args)."""
    return {d["metadata"]["name"]: (d["metadata"]["generation"], d["spec"]["replicas"],
                                    [(c.get("command"), c.get("args")) for c in engine_containers(d)])
            for d in kube.items("deployments", namespace, selector=f"app.kubernetes.io/instance={name}")}


def _mine(kube: Kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.events(namespace, reason=reason) if e["involvedObject"]["name"] == name]


def _count(events: list[dict[str, Any]]) -> int:
    return sum(int(e.get("count") or 1) for e in events)


@pytest.mark.e2e_seconds(173)
def test_gain_within_error_changes_nothing_and_a_gain_beyond_it_moves(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    name = "gated"
    obj = topology(name, namespace, prometheus_url=cluster.prometheus_url, arrival_rate=44, allowed_layouts=["replicas"],
                   replan_interval="10s", cooldown="10s", input_tokens=2048, output_tokens=256)
    obj["spec"]["objective"] = "min-gpus"
    obj["spec"]["policy"]["gainWithinError"] = True
    # No traffic until all four engines serve (as test_prediction_miss): an engine serving before its peer takes the whole
    # rate for the emulator's first chunk, and the first intervals then read the rate 10-15 % off either way (runs at
    # 27 and 29 req/s were planned for 23.8 and 32.0, each outside 3×TP1's band then, 24.3 to about 32 req/s).
    emulator.set_profile({"phases": [{"rate_rps": 0, **TOKENS}]})
    started_s = time.monotonic()

    def why() -> str:
        status = kube.topology(namespace, name).get("status", {})
        events = "\n".join(f"{e['reason']}: {e.get('message')}" for e in kube.events(namespace))
        return json.dumps({k: status.get(k) for k in ("plan", "observed", "conditions")})[-2500:] + "\n" + events + "\n" + operator.log_tail()

    try:
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))
        wait_until(lambda: kube.condition(namespace, name, "Ready") is not None
                   and (kube.condition(namespace, name, "Ready") or {}).get("status") == "True",
                   timeout_s=180, what="planned 4×TP1 Ready", on_timeout=why)
        plan = kube.topology(namespace, name)["status"]["plan"]
        assert (plan["layout"], plan["gpus"]) == ("4×TP1", 4), plan
        wait_until(lambda: sum(1 for k in emulator.status()["instances"] if k.startswith(f"{namespace}/")) >= 4,
                   timeout_s=60, what="all four emulated engines serving", on_timeout=lambda: json.dumps(emulator.status())[-2000:])
        emulator.set_profile({"phases": [{"rate_rps": 26.5, **TOKENS}]})
        before = _workloads(kube, namespace, name)
        assert before and sum(r for _, r, _ in before.values()) == 4, before
        ready_s = time.monotonic() - started_s

        wait_until(lambda: bool(_mine(kube, namespace, name, "GainWithinError")), timeout_s=240,
                   what="a GainWithinError Event", interval_s=2.0, on_timeout=why)
        gated_s = time.monotonic() - started_s
        (event,) = _mine(kube, namespace, name, "GainWithinError")
        message = event["message"]
        assert event["type"] == "Normal", event
        assert message.startswith("kept 4×TP1 over 3×TP1: 33% better on min-gpus is within the combined uncertainty"), message
        assert "nothing changes" in message, message
        found = INTERVAL.search(message)
        assert found, message
        b, bl, bh, a, al, ah = (float(x) for x in found.groups())
        assert bl < b < bh and al < a < ah, message
        bar = float(re.search(r"combined uncertainty (\d+)%", message).group(1)) / 100   # type: ignore[union-attr]
        assert bar > 0.33, message
        # Nothing changes, then or in the replan intervals after it: same Deployments, generations, replicas, commands.
        time.sleep(10)   # one more replan interval
        status = kube.topology(namespace, name)["status"]
        assert _workloads(kube, namespace, name) == before
        assert status["plan"]["layout"] == "4×TP1" and not status.get("replan", {}).get("transition"), status["plan"]
        assert _count(_mine(kube, namespace, name, "GainWithinError")) == 1, _mine(kube, namespace, name, "GainWithinError")
        assert not _mine(kube, namespace, name, "TransitionStarted")
        assert status.get("observed", {}).get("arrivalRateRps", 0) > 20, status.get("observed")

        # A gain beyond the bar: the traffic falls to 10 req/s, a move to half the GPUs or fewer starts.
        emulator.set_profile({"phases": [{"rate_rps": 10, **TOKENS}]})
        fell_s = time.monotonic()
        wait_until(lambda: bool(_mine(kube, namespace, name, "TransitionStarted")), timeout_s=180,
                   what="TransitionStarted after the traffic fell", interval_s=2.0, on_timeout=why)
        moved_s = time.monotonic() - fell_s
        (started,) = _mine(kube, namespace, name, "TransitionStarted")
        target = re.search(r"changing 4×TP1 → (\S+) at [\d.]+ req/s: .*GPUs 4→([12]),", started["message"])
        assert target and "beyond the combined uncertainty" in started["message"], started
        move: dict[str, Any] = {}

        def recorded() -> bool:
            move.update(kube.topology(namespace, name).get("status", {}).get("replan", {}).get("move") or {})
            return bool(move)

        wait_until(recorded, timeout_s=30, what="status.replan.move", on_timeout=why)
        tpot = move["tpotMs"]
        assert move["layout"] == target.group(1) and tpot["low"] < tpot["value"] < tpot["high"], move
        assert _count(_mine(kube, namespace, name, "GainWithinError")) == 1
        print(f"\nReady {ready_s:.0f} s after the apply; GainWithinError {gated_s:.0f} s after it (bar {bar:.0%}: "
              f"before {b} [{bl}–{bh}], after {a} [{al}–{ah}] ms); TransitionStarted {moved_s:.0f} s after the traffic fell; "
              f"move {move}")
    finally:
        emulator.set_profile({"phases": [{"rate_rps": 2, "input_tokens": 1000, "output_tokens": 200}]})
