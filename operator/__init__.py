"""The Kubernetes shell around the planner: CRD models, manifest builders, the kopf operator.

The only package that imports kopf and kubernetes, and talks to Prometheus (operator/live/prometheus_http.py). Importable as
`servingtopology.operator` (pyproject's package-dir mapping). With the repository root on sys.path (`PYTHONPATH=.`, a
tool reading the source tree) this folder would shadow the standard library's `operator`, which Python imports at start;
so when it is imported under that name it loads the standard library's module in its own place and defines nothing.
"""

import sys as _sys

if __name__ == "operator":  # imported as the stdlib's name: put the real module in sys.modules (the import returns it)
    from importlib.machinery import PathFinder as _PathFinder

    _folder_parent = __path__[0].rsplit("/", 1)[0]
    _search = [p for p in _sys.path if (p or ".").rstrip("/") not in (_folder_parent, ".", "")]
    _spec = _PathFinder.find_spec("operator", _search)
    if _spec is None or _spec.loader is None:
        raise ImportError("the standard library's operator module was not found beside this folder's shadow")
    _stdlib = type(_sys)("operator")
    _stdlib.__spec__ = _spec
    _stdlib.__file__ = _spec.origin
    _stdlib.__loader__ = _spec.loader
    _sys.modules["operator"] = _stdlib
    _spec.loader.exec_module(_stdlib)
