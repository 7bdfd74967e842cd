"""The search: candidate tables, the PD space and ratio, the funnel (stages 1-5), limits, advice, the decision and its record.

Owns: which layout is chosen and why, in words a person can file. Must not: simulate (stage 6 is a function passed
in), keep live state or import live, pool, sim or fidelity. Pure.
"""
