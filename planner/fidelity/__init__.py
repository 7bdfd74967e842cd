"""Fidelity: the public benchmark rows as cases, deployment points and the scores of predictions against measurements.

Owns: how well the model predicts what was measured (validate, calibrate, the benchmarks). The top room: nothing in the
planner imports it. Pure.
"""
