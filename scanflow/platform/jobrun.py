"""`python -m scanflow.platform.jobrun pkg.module:function`: the former entry of Kubernetes Job containers.

Kept so Jobs created by older manifests still start; the one job runner is
scanflow.platform.jobrunner (params from SCANFLOW_JOB_PARAMS when no --params is given).
"""

from __future__ import annotations

import sys

from scanflow.platform.jobrunner import main

if __name__ == "__main__":
    sys.exit(main())
