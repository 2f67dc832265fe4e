"""The autonomic demo (S1-S4). Owned by the scenarios area."""

from pathlib import Path


def run_demo(*, json_output: bool = False, quick: bool = False, home: Path = Path(".scanflow/demo")) -> bool:
    raise NotImplementedError
