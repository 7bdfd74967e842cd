"""The pure planning core: catalogs, memory and performance models, the funnel, the simulator.

Imports numpy and the standard library only; no I/O, no clock, no environment. Time is an argument.
"""
