"""The operator's runtime room: the process around the reconcile. The kopf handlers (handlers.py), the entry point
(main.py), the plan worker processes (plan_worker.py, plan_preload.py), the kopf adapter (kopf_compat.py), the
cluster seam (cluster.py) and what it shows of the serving sets (cluster_view.py), the capacity reads (capacity.py)
and the operator's own telemetry (telemetry.py)."""
