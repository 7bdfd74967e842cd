"""Reading a model: a config.json into a ModelArch (hf_config), its towers, its checkpoint quantisation, the catalog.

Owns: turning published model files into the planner's architecture values (planner.arch). Must not: know engines,
GPUs' speed, layouts or workloads; import any other room. Pure (reads only the package's own data files).
"""
