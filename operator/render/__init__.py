"""The operator's render room: from a plan to Kubernetes objects. Manifests (manifests.py), pod templates
(pod_template.py), the network knobs (network.py), the tenancy pod policy (tenancy.py), the object size bound
(object_size.py) and the serving sets a layout becomes (sets.py; what the cluster shows of them is
cluster/cluster_view.py). The engine command lines themselves are pure and live in the planner
(planner/engines/command.py). Nothing here imports the entry, the reconcile or the cluster seam (import-linter)."""
