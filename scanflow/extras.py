"""Optional dependencies: the error that names the extra to install, where a module needs one.

The core install serves, watches and retrains on one machine. The Kubernetes platform needs the official
client (`scanflow[k8s]`), the demo's and the notebooks' plots need matplotlib (`scanflow[demo]`); a
module that imports one of them turns the bare ModuleNotFoundError into this message.
Who calls: scanflow/platform/kubernetes.py, k8s_api.py, scanflow/plots.py, scanflow/drift/report.py.
"""

from __future__ import annotations


def missing_extra(exc: ModuleNotFoundError, extra: str, what: str) -> ModuleNotFoundError:
    """The error to raise when `what` cannot import `exc.name`: it says which extra brings it."""
    package = (exc.name or "").partition(".")[0]  # 'matplotlib', not 'matplotlib.backends'
    return ModuleNotFoundError(f"{what} needs the package {package!r}, which the core install leaves out: "
                               f"pip install 'scanflow[{extra}]'", name=package)
