"""The live loop's pure parts: observing an interval, drift, the deployment's live calibration, error bars and the gate,
the replan decision and transitions.

Owns: what the operator decides from what it measured. Must not: read a cluster or Prometheus (the operator passes the
samples in), import pool, sim or fidelity. Pure; time is an argument.
"""
