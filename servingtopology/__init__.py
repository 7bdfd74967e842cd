"""servingtopology: plan and keep the serving topology of an LLM on Kubernetes.

`servingtopology.planner` is the pure core (planning, performance model, simulator);
`servingtopology.operator` the Kubernetes shell; `servingtopology.spec` the user-facing schema;
`servingtopology.cli` the command line.
"""

__version__ = "0.1.0"
