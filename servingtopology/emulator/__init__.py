"""The engine emulator: vLLM- and SGLang-shaped `/metrics` for engine pods that are not really running.

`servingtopology emulate` (servingtopology/cli/emulate.py) drives it; the e2e harness and demos use it so the
operator's metrics path can be tested without GPUs. It reads engine arguments, never engine code, and its
figures come from a simulator (the pluggable `EngineSimulator`), never from a real engine.
"""
