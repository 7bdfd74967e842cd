"""The Kubernetes shell around the planner: CRD models, manifest builders, the kopf operator.

The only package that imports kopf, kubernetes and prometheus_api_client. Importable as
`servingtopology.operator` only (a top-level `operator` would shadow the stdlib module).
"""
