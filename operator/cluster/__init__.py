"""The operator's cluster room, below the reconcile: the seams a pass calls. The `Cluster` seam (cluster.py:
server-side apply, owned objects, Events; the only module below the entry that imports the Kubernetes client), what it
shows of the serving sets (cluster_view.py), the nodes' GPU capacity (capacity.py) and the plan worker processes
(plan_worker.py). Must not import the reconcile, the entry room or kopf."""
