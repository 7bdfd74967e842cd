"""Pools: several models on mixed GPU kinds priced per hour, the MILP, the moves between pool plans, the service split and
the pool record.

Owns: which member gets which GPUs. Must not: import live, sim or fidelity. Pure.
"""
