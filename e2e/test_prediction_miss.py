"""A move whose measured result misses its prediction raises the next move's bar (issue #27 part 4), on the local stack.

Llama-3.1-8B on TP1 replicas only, objective min-gpus, spec.policy.gainWithinError, planned for 70 req/s (2048 in,
256 out): N×TP1 (6 or 7 by the parameter file: 6 under the fit of 2026-12-02, 7 under the measured all-reduce fit).
Once its N engines serve, the emulator serves 30 req/s with its engines slower than the model (EngineSlowdown: weights
and per-step overhead ×1.5). The operator replans for the measured load: 3×TP1, 100 % or more better on min-gpus, beyond
the combined uncertainty of the two TPOT intervals (45-70 %), so it moves, in place. Three intervals measured on the settled 3×TP1
(JudgedOnTheMovedLayout) put TPOT outside the interval predicted for 3×TP1: status.replan.move says by how much, a PredictionMissed Event
says so, and status.calibration shows one missed move and the ×1.5 widening it puts on every interval of the next bar.
Then the traffic falls to 13.8 req/s: 2×TP1 is 50 % better (one TP1 carries 11.2-12.1 req/s uncalibrated, less with
the factors runs on Poisson arrivals learned, so 2×TP1 either way), within the bar of the widened intervals: nothing
changes, one GainWithinError Event quotes the widening, and its bar is the one the quoted intervals give widened ×1.5 —
the live stack carried the miss into the gate. Whether that gain would have cleared the unwidened bar depends on the
parameter file's intervals (it did under the fit of 2026-12-02: 39–48 % against 50 %; under the measured all-reduce fit
its wider single-GPU classes put it at 52–58 %, and no TP1-only move of this scenario lies between the two bars by a
safe margin), so it is printed, not asserted; that one missed move flips a decision the unwidened bar would allow is
the gate's own rule, asserted on the same functions in tests/planner/live/test_loop.py and tests/operator/test_replan.py.
The layouts were checked offline with the operator's planner at 13–20 req/s, uncalibrated and calibrated (weights ×1.5
to ×2, gemm ×1.2). At 16 req/s the learned factors (gemm ×1.46, weights
×1.72) left 3×TP1 the best layout: PlanKept, not a gated move. By then the operator has calibrated
itself on the steady intervals at 3×TP1 (status.calibration Applied, a step term above 1: the slowdown learned).
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import pytest
import yaml

from .cluster import LocalCluster
from .conftest import Kube
from .objects import topology
from .processes import wait_until
from .stack import Emulator, Operator

TOKENS = {"input_tokens": 2048, "output_tokens": 256}
SLOWDOWN = {"weights": 1.5, "overhead": 1.5}
INTERVAL = re.compile(r"before (\d+\.\d) \[(\d+\.\d)–(\d+\.\d)\], after (\d+\.\d) \[(\d+\.\d)–(\d+\.\d)\]")


def _mine(kube: Kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.events(namespace, reason=reason) if e["involvedObject"]["name"] == name]


@pytest.mark.e2e_seconds(310)
def test_a_missed_prediction_shows_in_status_and_raises_the_next_moves_bar(
        cluster: LocalCluster, operator: Operator, emulator: Emulator, kube: Kube, namespace: str) -> None:
    name = "missed"
    obj = topology(name, namespace, prometheus_url=cluster.prometheus_url, arrival_rate=70, allowed_layouts=["replicas"],
                   replan_interval="15s", cooldown="10s", **TOKENS)
    obj["spec"]["objective"] = "min-gpus"
    obj["spec"]["slo"]["tpotMs"] = {"p95": 100}
    obj["spec"]["search"] = {"layouts": ["replicas"], "tp": [1], "pp": [1]}
    obj["spec"]["policy"]["gainWithinError"] = True
    # No traffic until all N engines serve: a pod Ready before its peers would take the whole rate for the emulator's
    # first 20 s chunk and queue (a latency the layout never has).
    emulator.set_profile({"phases": [{"rate_rps": 0, **TOKENS}]})
    started_s = time.monotonic()

    def status() -> dict[str, Any]:
        return dict(kube.topology(namespace, name).get("status", {}))

    def why() -> str:
        s = status()
        events = "\n".join(f"{e['reason']}: {e.get('message')}" for e in kube.events(namespace))
        return json.dumps({k: s.get(k) for k in ("plan", "observed", "calibration", "conditions")})[-3000:] + "\n" + \
            json.dumps((s.get("replan") or {}).get("move")) + "\n" + events + "\n" + operator.log_tail()

    try:
        cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(obj))
        wait_until(lambda: (kube.condition(namespace, name, "Ready") or {}).get("status") == "True",
                   timeout_s=180, what="planned N×TP1 Ready", on_timeout=why)
        first = re.fullmatch(r"(\d+)×TP1", status()["plan"]["layout"])
        assert first and int(first.group(1)) in (6, 7) and status()["plan"]["gpus"] == int(first.group(1)), status()["plan"]
        engines = int(first.group(1))
        wait_until(lambda: sum(1 for k in emulator.status()["instances"] if k.startswith(f"{namespace}/")) == engines,
                   timeout_s=60, what=f"{engines} emulated engines serving", on_timeout=lambda: json.dumps(emulator.status())[-2000:])
        # 28 req/s, in the middle of 3×TP1's band under either parameter file: 2×TP1 carries up to 24.2 / 22.3 req/s
        # (−14 / −20 %), 3×TP1 36.3 / 33.5 (+30 / +20 %); a 15 s interval's measured rate strays by up to ±12 % after the
        # onset's queue (a run: 27.1, 30.9, 27.9, 23.3, 25.6 at 27 req/s), the two a replan plans on (OnsetExcluded) a
        # little less. At 25 req/s a run planned for 23.5 and moved to 2×TP1. The miss holds at any rate of that band: the
        # engines slowed ×1.4 gave a p95 TPOT 1.49-1.61× the model's at 26-34 req/s, against the interval's upper bound of
        # 1.30× (2026-12-02 fit) or 1.43× (the measured all-reduce fit's wider single-GPU class), hence ×1.5.
        emulator.set_profile({"phases": [{"rate_rps": 28, **TOKENS, "slowdown": SLOWDOWN}]})
        ready_s = time.monotonic() - started_s

        # The move: N×TP1 → 3×TP1 for its gain, beyond the bar; its predicted TPOT interval is recorded.
        wait_until(lambda: bool(_mine(kube, namespace, name, "TransitionStarted")), timeout_s=240,
                   what="TransitionStarted to 3×TP1", interval_s=2.0, on_timeout=why)
        (started,) = _mine(kube, namespace, name, "TransitionStarted")
        assert f"changing {engines}×TP1 → 3×TP1" in started["message"] and "beyond the combined uncertainty" in started["message"], started
        assert "nominal 80% intervals TTFT [" in started["message"], started   # the change's figures carry their intervals
        moved_s = time.monotonic() - started_s

        # The miss: three intervals measured on the settled 3×TP1 (JudgedOnTheMovedLayout) put TPOT outside the predicted interval.
        wait_until(lambda: bool(_mine(kube, namespace, name, "PredictionMissed") or _mine(kube, namespace, name, "PredictionHit")),
                   timeout_s=200, what="the move judged (PredictionMissed)", interval_s=2.0, on_timeout=why)
        assert not _mine(kube, namespace, name, "PredictionHit"), why()
        (missed,) = _mine(kube, namespace, name, "PredictionMissed")
        assert missed["type"] == "Warning" and "after the move to 3×TP1: TPOT measured" in missed["message"], missed
        assert "outside the interval, a miss" in missed["message"] and "1 missed moves widen the next move's bar" in missed["message"]
        move = status()["replan"]["move"]
        tpot = move["tpotMs"]
        assert move["layout"] == "3×TP1" and move["hit"] is False, move
        assert not tpot["low"] <= move["measuredTpotMs"] <= tpot["high"], move
        said = re.search(r"ms predicted \(([+-]\d+)%\)", missed["message"])      # by how much, in the Event and in status
        assert said and abs(float(said.group(1)) - move["errorPercent"]) <= 1.0, (missed, move)
        assert abs(move["errorPercent"] - pure_error(move)) <= 0.2 and move["errorPercent"] > 0, move
        shown = status().get("calibration") or {}
        assert shown.get("missedMoves") == 1 and shown.get("intervalWidening") == 1.5, shown   # the raised bar
        judged_s = time.monotonic() - started_s

        # The raised bar: the traffic falls to 13.8 req/s, 2×TP1 would be 50 % better: beyond the unwidened intervals' bar,
        # within the widened one: nothing changes, one GainWithinError. 13.8 req/s: 2×TP1 whether the self-calibration
        # has been applied by then or not (1×TP1 carries 12.1 req/s uncalibrated, −12 %; 2×TP1 15.8 to 21.5 req/s with
        # the factors runs on Poisson arrivals learned, gemm ×1.16 to ×1.91, +14 % or more). (With arrivals as regular
        # as `--burstiness 16` the engines queue less than the model's Poisson arrivals: a run learned gemm ×0.56, so
        # 1×TP1 carried 15.3 req/s and the operator moved there.)
        emulator.set_profile({"phases": [{"rate_rps": 13.8, **TOKENS, "slowdown": SLOWDOWN}]})
        fell_s = time.monotonic()
        wait_until(lambda: bool(_mine(kube, namespace, name, "GainWithinError")) or len(_mine(kube, namespace, name, "TransitionStarted")) > 1,
                   timeout_s=240, what="GainWithinError after the traffic fell", interval_s=2.0, on_timeout=why)
        assert len(_mine(kube, namespace, name, "TransitionStarted")) == 1, why()
        (gated,) = _mine(kube, namespace, name, "GainWithinError")
        message = gated["message"]
        assert message.startswith("kept 3×TP1 over 2×TP1: 50% better on min-gpus is within the combined uncertainty"), message
        assert "widened ×1.50 by 1 missed moves" in message and "nothing changes" in message, message
        found = INTERVAL.search(message)
        assert found, message
        _, bl, bh, _, al, ah = (float(x) for x in found.groups())
        bar = float(re.search(r"combined uncertainty (\d+)%", message).group(1)) / 100   # type: ignore[union-attr]
        log_half = math.hypot(math.log(bh / bl) / 2, math.log(ah / al) / 2)   # the intervals quoted, unwidened
        unwidened, widened = math.expm1(log_half), math.expm1(1.5 * log_half)
        # The bar is the quoted intervals' widened ×1.5 (their bounds are rounded to 0.1 ms, the bar to 1 %).
        assert bar > 0.5 and abs(bar - widened) <= 0.02, (unwidened, widened, bar, message)
        assert status()["plan"]["layout"] == "3×TP1"
        gated_s = time.monotonic() - fell_s
        # Self-calibration: the steady intervals at 3×TP1 are its points (at 30 req/s after the move, at 13.8 once the
        # GainWithinError re-based the drift); the fit learned the engines' slowdown.
        wait_until(lambda: (status().get("calibration") or {}).get("state") == "Applied", timeout_s=150,
                   what="status.calibration Applied", interval_s=2.0, on_timeout=why)
        cal = status()["calibration"]
        assert cal["state"] == "Applied" and cal["pointsUsed"] >= cal["minimumPoints"] == 3, cal
        # Slower steps learned (which of gemm and weights carries it, the points of one layout cannot tell apart: a run
        # gave weights ×1.72 and gemm ×1.46, another gemm ×1.91 and weights at its ×0.5 bound), and TPOT fitted closer.
        assert max(cal["corrections"]["gemm"], cal["corrections"]["weights"]) > 1.1, cal
        assert cal["residualPercent"]["tpot"] < cal["uncalibratedResidualPercent"]["tpot"], cal
        assert cal["fittedAt"] and "fitted on" in cal["message"], cal
        print(f"\nReady {ready_s:.0f} s after the apply; TransitionStarted at {moved_s:.0f} s; PredictionMissed at {judged_s:.0f} s "
              f"({move['errorPercent']:+.0f} %: {move['measuredTpotMs']} ms against [{tpot['low']:.1f}, {tpot['high']:.1f}]); "
              f"GainWithinError {gated_s:.0f} s after the traffic fell (bar {unwidened:.0%} unwidened, {bar:.0%} widened); "
              f"calibration {cal['message']}")
    finally:
        emulator.set_profile({"phases": [{"rate_rps": 2, "input_tokens": 1000, "output_tokens": 200}]})


def pure_error(move: dict[str, Any]) -> float:
    """measured / predicted − 1 in %, rounded as status rounds it."""
    return round((move["measuredTpotMs"] / move["tpotMs"]["value"] - 1.0) * 100.0, 1)
