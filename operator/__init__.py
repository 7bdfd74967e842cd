"""The Kubernetes shell around the planner: CRD models, manifest builders, the kopf operator.

The only package that imports kopf and kubernetes, and talks to Prometheus (operator/live/prometheus_http.py). Importable as
`servingtopology.operator` only (a top-level `operator` would shadow the stdlib module).
"""
