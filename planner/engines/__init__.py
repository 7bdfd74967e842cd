"""Engine facts: capabilities per release, argument and command-line rendering, defaults, role knobs, metric names, kernel tables.

Owns: what vLLM and SGLang (and their routers) accept, default to and expose, read from generated data files. Must not:
predict performance, search layouts or import any room other than the value modules. Pure.
"""
