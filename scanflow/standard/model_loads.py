"""The models and champion reference the promotion gate needs, each loaded once, ahead of time.

`retrain` starts loading the champion on a background thread while the training job runs in its own
process, so evaluation after the job only loads the challenger (imports and model loads are most of an
evaluation's time). One `ModelLoads` per registered model; the Executor holds one for its workflow's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from scanflow.agent import PermanentError, TemporaryError


class ModelLoads:
    """Loads of one registered model's versions and of its champion's reference, once per version.

    `model_name`: the registered model (the Executor makes one per running agent, once its workflow is known).
    """

    def __init__(self, model_name: str, workers: int = 2) -> None:
        self._model_name = model_name
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="prefetch")
        self._lock = threading.Lock()
        self._models: dict[str, Future[Any]] = {}  # version -> its loading (scanflow.serving.model.LoadedModel)
        self._references: dict[str, Future[Any]] = {}  # version -> its reference (scanflow.tracking.reference)

    def once(self, cache: dict[str, Future[Any]], key: str, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """fn(*args) on the pool, once per key; a failed one is tried again on the next call."""
        with self._lock:
            fut = cache.get(key)
            if fut is None or (fut.done() and fut.exception() is not None):
                fut = cache[key] = self._pool.submit(fn, *args)
            return fut

    def model(self, version: str) -> Future[Any]:
        """The loading of `version` (started now unless already started)."""
        return self.once(self._models, version, self._load_version, version)

    def champion(self) -> str:
        """The version the champion alias names now (TemporaryError until there is one)."""
        from scanflow.tracking.registry import CHAMPION, get_alias_version

        champion = get_alias_version(self._model_name, CHAMPION)
        if champion is None:
            raise TemporaryError(f"no champion of {self._model_name!r} yet", delay_s=2.0)
        return champion

    def champion_reference(self) -> Any:
        """The serving champion's reference (PermanentError: its training job logged none)."""
        from scanflow.tracking.reference import ReferenceError

        champion = self.champion()
        try:
            return self.once(self._references, champion, self._load_reference, champion).result()
        except ReferenceError as exc:
            raise PermanentError(str(exc)) from None

    def prefetch_champion(self) -> None:
        """Background: start loading the current champion's model. Best effort: evaluation loads whatever
        this did not (an error here only costs the time it would have saved)."""
        self._pool.submit(lambda: self.model(self.champion()))

    def evaluate(self, version: str, x_clean: np.ndarray, y_clean: np.ndarray, x_d: np.ndarray, y_d: np.ndarray,
                 task: str) -> Any:
        """`version` scored on the clean and the drifted holdout (accuracy, or R^2 for regression)."""
        from scanflow.policies.retrain import Evaluation, score

        m = self.model(version).result()
        metric = "r2" if task == "regression" else "accuracy"

        def on(x: np.ndarray, y: np.ndarray) -> float:
            return score(task, y, m.predict(np.ascontiguousarray(x, dtype=np.float32))[0])

        return Evaluation(on(x_clean, y_clean), on(x_d, y_d), version, metric)

    def keep_only(self, version: str) -> None:
        """Forget every loaded model but `version` (the champion: the next evaluation needs it)."""
        with self._lock:
            for v in [v for v in self._models if v != version]:
                self._models.pop(v, None)

    def _load_version(self, version: str) -> Any:
        from scanflow.serving.model import load_model

        return load_model(f"models:/{self._model_name}/{version}")

    def _load_reference(self, version: str) -> Any:
        """The reference data of a model version: its schema, and clean labelled rows it never trained on
        (the promotion gate's clean part). Read from MLflow, where the training job logged it."""
        from scanflow.tracking.reference import reference_for_version

        return reference_for_version(self._model_name, version)
