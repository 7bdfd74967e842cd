"""The operator's entry room, above the reconcile: the process kopf runs. The kopf handlers (handlers.py, the pools'
pool_handlers.py), the entry point (main.py), the kopf adapter (kopf_compat.py), the plan processes' preload
(plan_preload.py) and the operator's own telemetry (telemetry.py). The only room that imports kopf or the Prometheus
client library; nothing below imports it."""
