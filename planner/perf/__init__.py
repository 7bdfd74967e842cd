"""Performance: memory per rank, the step model (step.py), the analytic estimates, predictions, the closed loop, mixed-GPU PD
and the deployment fit.

Owns: how long a step takes and what a layout serves at a load. Must not: search or rank layouts, keep live state or
import search, live, pool, sim or fidelity. Pure.
"""
