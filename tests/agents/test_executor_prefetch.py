"""The Executor's load-once cache (`ModelLoads.once`): what `retrain` starts loading while the training job runs
(the champion, the clean splits) is what `evaluate_and_promote` gets, and a failed load is retried."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest

from scanflow.standard.model_loads import ModelLoads


def test_once_runs_a_key_once_and_shares_the_result() -> None:
    calls: list[str] = []
    gate = threading.Event()

    def load(v: str) -> str:
        gate.wait(5.0)
        calls.append(v)
        return f"model {v}"

    cache: dict[str, Future[Any]] = {}
    _once = ModelLoads("m").once
    first = _once(cache, "3", load, "3")
    second = _once(cache, "3", load, "3")  # asked again while the first load still runs
    gate.set()
    assert second is first and first.result(5.0) == "model 3"
    assert _once(cache, "3", load, "3").result(5.0) == "model 3"
    assert _once(cache, "4", load, "4").result(5.0) == "model 4"
    assert calls == ["3", "4"]


def test_once_retries_a_failed_load() -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("MLflow unreachable")
        return "loaded"

    cache: dict[str, Future[Any]] = {}
    _once = ModelLoads("m").once
    with pytest.raises(OSError, match="unreachable"):
        _once(cache, "k", flaky).result(5.0)
    assert _once(cache, "k", flaky).result(5.0) == "loaded"
    assert _once(cache, "k", flaky).result(5.0) == "loaded" and len(attempts) == 2


def test_keep_only_forgets_every_other_version() -> None:
    loads = ModelLoads("m")
    for v in ("1", "2", "3"):
        loads.once(loads._models, v, str, v).result(5.0)
    loads.keep_only("2")
    assert list(loads._models) == ["2"]
