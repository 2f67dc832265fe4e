"""A process that owns a LocalPlatform, deploys one service and then waits to be SIGKILLed: the
stand-in for an Executor killed mid-flight (tests/platform_local/test_adopt.py).

Usage: python plat_owner.py HOME TRACKING_URI TOKEN SPEC_JSON
Prints one line `READY <status json>` once the service serves, then sleeps until killed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from scanflow.platform.local import LocalPlatform
from scanflow.spec import Service


def main() -> None:
    home, tracking, token, spec_json = sys.argv[1:5]
    plat = LocalPlatform(Path(home), tracking_uri=tracking, token=token)
    st = plat.deploy(Service.model_validate_json(spec_json))
    print("READY " + json.dumps(dataclasses.asdict(st)), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
