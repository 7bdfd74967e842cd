"""Discrete-event, iteration-level simulator of vLLM and SGLang serving (filled in by the simulator work)."""
