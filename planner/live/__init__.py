"""The live loop's pure parts: the replan loop itself (`loop.step`, one call per interval, with its policy, memory and
effects), observing an interval, drift, the deployment's live calibration, error bars and the gate, the replan decision
and transitions.

Owns: what the operator decides from what it measured. Must not: read a cluster or Prometheus (the operator passes the
samples in), import pool, sim or fidelity. Pure; time is an argument.
"""
