"""The operator's API room: the ServingTopology resource's models (resource.py) and the CRD generated from them
(crd.py). Imports the planner and the spec only; nothing here talks to a cluster."""
