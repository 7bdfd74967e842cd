"""Drift detection and replan triggers.

Compares the observed workload with the one the current plan assumed, and the observed SLO figures with
the targets and the plan's predictions, once per replan interval. Called by the operator's replanning
glue; its state is a small frozen value the operator keeps in status. Pure: time is an argument.

Scenarios the policy handles so that noise never causes flapping:
- a spike shorter than `persist_intervals` intervals resets the streak: no trigger;
- a sustained shift above `enter_shift` fires once it has lasted `persist_intervals` intervals;
- DriftDetected clears only after `persist_intervals` intervals below `exit_shift` (hysteresis band);
- one episode, one Warning: a drift that is replanned, then still hot while queued requests drain (or detected again
  before the signals were calm for `persist_intervals` intervals), opens no new episode (`DriftVerdict.new_episode`);
- a prompt or output tail (p99) read from a 1-2-5 histogram is only a shift beyond the histogram's resolution
  (HISTOGRAM_TAIL_RESOLUTION): a fixed 2,048-token prompt reads as p99 ≈ 4,970 at steady load;
- after an applied change nothing fires again until `cooldown_s` has passed;
- a new plan replaces the current one only if it is better by `min_improvement`, unless the current
  layout misses the SLO at the observed load.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from servingtopology.planner.layout import Engine
from servingtopology.planner.live.observe import ObservedSlo
from servingtopology.planner.problem import Candidate
from servingtopology.planner.workload import Objective, Slo, Workload

__all__ = [
    "Trigger",
    "DriftPolicy",
    "Shift",
    "DriftState",
    "DriftVerdict",
    "workload_shift",
    "assess_drift",
    "rebaseline",
    "improvement",
    "worth_switching",
    "percent_text",
    "HISTOGRAM_TAIL_RESOLUTION",
]

# TailWithinHistogramResolution: the engines' length histograms (vLLM's request_prompt_tokens, the emulator's) have
# 1-2-5 buckets, and histogram_quantile interpolates linearly inside a bucket, so a p99 read from them can be up to the
# widest bucket ratio (5/2) away from the true one either way (every request at 2,048 tokens: p99 = 2,000 + 0.99 ×
# 3,000 = 4,970, "+143 %"). A tail shift inside that factor is not a shift.
HISTOGRAM_TAIL_RESOLUTION = 2.5


def percent_text(fraction: float, *, up: str = "higher", down: str = "lower") -> str:
    """A relative change as people say it: 0.03 → "3 % higher", −0.03 → "3 % lower" (never a signed "−3 % better")."""
    if not math.isfinite(fraction):
        return f"from nothing to some ({up})" if fraction > 0 else "unknown"
    word = up if fraction >= 0 else down
    return f"{abs(fraction) * 100:.0f} % {word}"


class Trigger(enum.StrEnum):
    WORKLOAD_SHIFT = "WorkloadShift"   # rate, lengths or prefix share moved away from what the plan assumed
    SLO_BREACH = "SloBreach"           # observed TTFT or TPOT above the target
    OVER_CAPACITY = "OverCapacity"     # observed rate above the current layout's SLO capacity


@dataclass(frozen=True, slots=True)
class DriftPolicy:
    """Thresholds: shifts are relative (0.25 = 25 %), the prefix share absolute; SLO ratios are observed/target."""

    persist_intervals: int = 3
    enter_shift: float = 0.25
    exit_shift: float = 0.10
    slo_breach: float = 1.0
    slo_clear: float = 0.9
    cooldown_s: float = 900.0
    min_improvement: float = 0.1
    min_confidence: float = 0.5


@dataclass(frozen=True, slots=True)
class Shift:
    """Relative changes observed/assumed − 1 (prefix share: absolute difference)."""

    rate: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    input_tail: float = 0.0
    prefix_share: float = 0.0

    @property
    def magnitude(self) -> float:
        return max(abs(self.rate), abs(self.input_tokens), abs(self.output_tokens), abs(self.input_tail), abs(self.prefix_share))

    @property
    def dominant(self) -> str:
        """The largest part, said as people say it: "arrival rate 650 % higher", "prefix share 30 points lower"."""
        parts = {"arrival rate": self.rate, "mean prompt length": self.input_tokens, "mean output length": self.output_tokens,
                 "prompt tail (p99)": self.input_tail, "prefix share": self.prefix_share}
        name = max(parts, key=lambda k: abs(parts[k]))
        if name == "prefix share":
            return f"prefix share {abs(self.prefix_share) * 100:.0f} points {'higher' if self.prefix_share >= 0 else 'lower'}"
        return f"{name} {percent_text(parts[name])}"


def _rel(observed: float, assumed: float) -> float:
    if assumed <= 0:
        return 0.0 if observed <= 0 else math.inf
    return observed / assumed - 1.0


def _tail_shift(observed_p99: float, assumed_p99: float) -> float:
    """The relative tail shift, 0 inside the histogram's resolution (TailWithinHistogramResolution)."""
    rel = _rel(observed_p99, assumed_p99)
    if math.isfinite(rel) and 1.0 / HISTOGRAM_TAIL_RESOLUTION <= rel + 1.0 <= HISTOGRAM_TAIL_RESOLUTION:
        return 0.0
    return rel


def workload_shift(assumed: Workload, observed: Workload) -> Shift:
    """How far the observed workload moved from the assumed one."""
    return Shift(
        rate=_rel(observed.arrival_rate_rps or 0.0, assumed.arrival_rate_rps or 0.0),
        input_tokens=_rel(observed.input_tokens.expected_tokens, assumed.input_tokens.expected_tokens),
        output_tokens=_rel(observed.output_tokens.expected_tokens, assumed.output_tokens.expected_tokens),
        input_tail=_tail_shift(observed.input_tokens.p99_tokens, assumed.input_tokens.p99_tokens),
        prefix_share=observed.prefix_share - assumed.prefix_share,
    )


@dataclass(frozen=True, slots=True)
class DriftState:
    """What persists between intervals (kept in status so a restarted operator carries on)."""

    streak: int = 0                   # consecutive intervals over the enter thresholds
    calm: int = 0                     # consecutive intervals under the exit thresholds
    detected: bool = False
    last_change_s: float | None = None
    trigger: Trigger | None = None
    episode: bool = False             # a drift was announced and the signals have not been calm since (one Warning each)

    def to_dict(self) -> dict[str, object]:
        return {"streak": self.streak, "calm": self.calm, "detected": self.detected, "lastChangeS": self.last_change_s,
                "trigger": self.trigger.value if self.trigger else None, "episode": self.episode}

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> DriftState:
        last, trig = data.get("lastChangeS"), data.get("trigger")
        return DriftState(streak=int(str(data.get("streak", 0))), calm=int(str(data.get("calm", 0))),
                          detected=bool(data.get("detected", False)), last_change_s=None if last is None else float(str(last)),
                          trigger=Trigger(str(trig)) if trig else None, episode=bool(data.get("episode", False)))


@dataclass(frozen=True, slots=True)
class DriftVerdict:
    state: DriftState
    replan: bool                 # act now: detected, still hot, and out of cooldown
    hot: bool                    # this interval was over an enter threshold
    magnitude: float             # the largest shift or breach ratio − 1 of this interval
    message: str
    new_episode: bool = False    # DriftDetected became true outside an open episode: the one Warning of this episode


def _slo_ratio(observed: ObservedSlo | None, slo: Slo) -> float:
    if observed is None:
        return 0.0
    ratios = [o / t for o, t in ((observed.ttft_ms, slo.ttft_ms), (observed.tpot_ms, slo.tpot_ms)) if o is not None and t > 0]
    return max(ratios, default=0.0)


def assess_drift(state: DriftState, *, shift: Shift, observed_slo: ObservedSlo | None, slo: Slo, observed_rate_rps: float,
                 capacity_rps: float | None, confidence: float, now_s: float, policy: DriftPolicy) -> DriftVerdict:
    """Fold one interval into the drift state and say whether to replan now.

    An interval with confidence below `min_confidence` leaves the state as it is (neither hot nor calm).
    """
    slo_ratio = _slo_ratio(observed_slo, slo)
    load = observed_rate_rps / capacity_rps if capacity_rps and capacity_rps > 0 else 0.0
    triggers = []
    if shift.magnitude >= policy.enter_shift:
        triggers.append((Trigger.WORKLOAD_SHIFT, shift.magnitude, f"workload shift: {shift.dominant}"))
    if slo_ratio >= policy.slo_breach:
        triggers.append((Trigger.SLO_BREACH, slo_ratio - 1.0,
                         f"observed latency {percent_text(slo_ratio - 1.0, up='over', down='under')} its SLO"))
    if load > 1.0:
        triggers.append((Trigger.OVER_CAPACITY, load - 1.0, f"load {observed_rate_rps:.3g} req/s, over the "
                         f"{capacity_rps:.3g} req/s the running layout carries within the SLO"))
    calm = shift.magnitude < policy.exit_shift and slo_ratio < policy.slo_clear and load <= 1.0 - policy.exit_shift
    if confidence < policy.min_confidence:
        return DriftVerdict(state, replan=False, hot=False, magnitude=0.0,
                            message=f"confidence {confidence:.2f} below {policy.min_confidence:.2f}: interval not counted")
    hot = bool(triggers)
    trigger, magnitude, why = max(triggers, key=lambda t: t[1]) if triggers else (None, shift.magnitude, "within thresholds")
    streak = state.streak + 1 if hot else 0
    calm_n = state.calm + 1 if calm else 0
    detected = state.detected
    if not detected and streak >= policy.persist_intervals:
        detected = True
    elif detected and calm_n >= policy.persist_intervals:
        detected = False
    new_episode = detected and not state.detected and not state.episode
    episode = (state.episode or detected) and calm_n < policy.persist_intervals
    new = replace(state, streak=streak, calm=calm_n, detected=detected, trigger=trigger if hot else state.trigger if detected else None,
                  episode=episode)
    cooling = state.last_change_s is not None and now_s - state.last_change_s < policy.cooldown_s
    replan = detected and streak >= policy.persist_intervals and not cooling
    if replan:
        message = f"{why} for {streak} intervals"
    elif hot and cooling:
        message = f"{why}; in cooldown for another {policy.cooldown_s - (now_s - (state.last_change_s or 0.0)):.0f} s"
    elif hot:
        message = f"{why} ({streak}/{policy.persist_intervals} intervals)"
    else:
        message = why
    return DriftVerdict(new, replan=replan, hot=hot, magnitude=magnitude, message=message, new_episode=new_episode)


def rebaseline(state: DriftState, *, now_s: float, changed: bool) -> DriftState:
    """After a replan: the streak starts over; an applied change also starts the cooldown. The episode stays open
    until the signals are calm (queued requests still drain after a change)."""
    return replace(state, streak=0, calm=0, detected=False, trigger=None, last_change_s=now_s if changed else state.last_change_s)


def improvement(current: Candidate, best: Candidate, *, objective: Objective) -> float:
    """The relative gain of `best` over `current` under the objective (0.25 = 25 % better)."""
    if objective is Objective.MIN_GPUS:
        return current.layout.gpus / max(best.layout.gpus, 1) - 1.0
    cur = current.prediction.goodput_per_gpu
    return best.prediction.goodput_per_gpu / cur - 1.0 if cur > 0 else math.inf


def worth_switching(current: Candidate | None, best: Candidate, *, objective: Objective, min_improvement: float,
                    engine: Engine) -> tuple[bool, str]:
    """Whether to move from the current layout to `best`, and why (the sentence goes into Events, naming the layouts in
    `engine`'s words: Layout.label_for)."""
    if current is None:
        return True, "nothing runs yet"
    if best.layout == current.layout:
        return False, f"{current.layout.label_for(engine)} is still the best layout for the observed workload"
    if not current.prediction.meets_slo:
        if best.prediction.meets_slo:
            return True, f"{current.layout.label_for(engine)} misses the SLO at the observed load"
        return False, "no layout meets the SLO at the observed load"
    gain = improvement(current, best, objective=objective)
    if gain >= min_improvement:
        return True, f"{percent_text(gain, up='better', down='worse')} on {objective.value} (minImprovement {min_improvement:.0%})"
    if gain < 0:
        return False, f"{best.layout.label_for(engine)} would be {percent_text(gain, up='better', down='worse')} on {objective.value}"
    return False, (f"{best.layout.label_for(engine)} would be only {percent_text(gain, up='better', down='worse')} on {objective.value}, "
                   f"under minImprovement {min_improvement:.0%}")
