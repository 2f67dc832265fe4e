"""Load a model for serving: resolve a registry URI to one exact version, download it, and wrap it
as a plain `predict(float32 (n, f)) -> (classes, probabilities)` function.

Who calls: the replica at start-up and on `POST /admin/model` (always from a worker thread: MLflow
and torch block). A registered version whose files differ from the digest the Executor recorded when
it promoted them (scanflow.tracking.model_digest) is refused before anything in it is unpickled. Resolving `models:/name@alias` to `models:/name/<version>` *before* loading means
the version we report is exactly the one we loaded, even if the alias moves meanwhile.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

PredictFn = Callable[[np.ndarray], tuple[list, np.ndarray | None]]

_VERSION_RE = re.compile(r"^models:/(?P<name>[^/@]+)/(?P<version>\d+)$")
_ALIAS_RE = re.compile(r"^models:/(?P<name>[^/@]+)@(?P<alias>[\w-]+)$")
_LATEST_RE = re.compile(r"^models:/(?P<name>[^/@]+)(/latest)?$")


class ModelLoadError(RuntimeError):
    """The model URI cannot be resolved or loaded; the message says which and why."""


@dataclass(frozen=True)
class LoadedModel:
    uri: str  # as asked
    resolved_uri: str  # what was loaded (models:/name/N for registry URIs)
    version: str  # registry version, or the run id / URI when not registered
    n_features: int | None
    predict: PredictFn
    # What the standard protocols publish (scanflow.serving.oip): the registered model name (None for
    # runs:/ and path URIs), the MLflow flavor it was loaded with, and its MLflow signature (or None).
    name: str | None = None
    flavor: str = "python_function"
    signature: Any = None


def registered_name(uri: str) -> str | None:
    """'models:/digits@champion' | 'models:/digits/3' | 'models:/digits' -> 'digits'; None otherwise.

    Why from the URI: a replica must answer to its model's name before the model has loaded
    (`GET /v2/models/{name}/ready` says "not yet" rather than "unknown model")."""
    for rx in (_VERSION_RE, _ALIAS_RE, _LATEST_RE):
        if m := rx.match(uri):
            return m["name"]
    return None


def as_probabilities(scores: np.ndarray) -> np.ndarray:
    """Class probabilities from a classifier's per-class outputs, row by row.

    The rule: a row that already is a distribution (every value in [0, 1], summing to 1 within 1e-3)
    is kept as it is (a softmax head, sklearn's predict_proba); any other row is taken as logits and
    goes through a softmax (max-subtracted, so large logits do not overflow). Why here and not in the
    model call: only the requests that ask for probabilities pay for it, and the classes (argmax) are
    the same either way."""
    p = np.asarray(scores, dtype=np.float64)
    if p.ndim != 2 or not p.size:
        return p
    is_dist = (p >= 0.0).all(axis=1) & (p <= 1.0).all(axis=1) & (np.abs(p.sum(axis=1) - 1.0) <= 1e-3)
    if is_dist.all():
        return p
    e = np.exp(p - p.max(axis=1, keepdims=True))
    soft = e / e.sum(axis=1, keepdims=True)
    return np.where(is_dist[:, None], p, soft)


def resolve_uri(uri: str) -> tuple[str, str | None]:
    """models:/name@alias | models:/name[/latest] | models:/name/N -> (models:/name/N, "N").

    Other URIs (runs:/, paths) come back unchanged with version None. Needs MLFLOW_TRACKING_URI.
    """
    if m := _VERSION_RE.match(uri):
        return uri, m["version"]
    if not uri.startswith("models:/"):
        return uri, None
    from mlflow import MlflowClient

    client = MlflowClient()
    try:
        if m := _ALIAS_RE.match(uri):
            version = str(client.get_model_version_by_alias(m["name"], m["alias"]).version)
            return f"models:/{m['name']}/{version}", version
        if m := _LATEST_RE.match(uri):
            versions = client.search_model_versions(f"name='{m['name']}'")
            if not versions:
                raise ModelLoadError(f"registered model {m['name']!r} has no versions")
            version = str(max(int(v.version) for v in versions))
            return f"models:/{m['name']}/{version}", version
    except ModelLoadError:
        raise
    except Exception as exc:  # mlflow raises its own exception types, plus connection errors
        raise ModelLoadError(f"cannot resolve {uri!r}: {exc}") from exc
    raise ModelLoadError(f"model URI {uri!r}: use models:/NAME/VERSION, models:/NAME@ALIAS or models:/NAME")


def _n_features(meta: object, local_path: str) -> int | None:
    """Features per row, from the signature (tensor shape or column count), else the input example."""
    sig = getattr(meta, "signature", None)
    if sig is not None and sig.inputs is not None:
        specs = sig.inputs.inputs
        if len(specs) == 1 and getattr(specs[0], "shape", None):
            shape = specs[0].shape
            if len(shape) == 2 and shape[-1] > 0:
                return int(shape[-1])
        elif len(specs) > 1:
            return len(specs)
    try:
        example = meta.load_input_example(local_path)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an unreadable example only means we cannot check widths
        return None
    if example is not None:
        arr = np.asarray(example)
        if arr.ndim == 2:
            return int(arr.shape[1])
    return None


def _torch_predict(module: object) -> PredictFn:
    import torch

    module.eval()  # type: ignore[attr-defined]

    def predict(x: np.ndarray) -> tuple[list, np.ndarray | None]:
        with torch.inference_mode():
            out = module(torch.from_numpy(x))  # type: ignore[operator]
        out_np = out.numpy()
        if out_np.ndim == 2 and out_np.shape[1] > 1:
            return out_np.argmax(axis=1).tolist(), out_np
        return out_np.reshape(len(x)).tolist(), None

    return predict


def _pyfunc_predict(model: object) -> PredictFn:
    def predict(x: np.ndarray) -> tuple[list, np.ndarray | None]:
        out = np.asarray(model.predict(x))  # type: ignore[attr-defined]
        if out.ndim == 2 and out.shape[1] > 1:
            return out.argmax(axis=1).tolist(), out
        return out.reshape(len(x)).tolist(), None

    return predict


def load_model(uri: str) -> LoadedModel:
    """Blocking: resolve, download and load; raise ModelLoadError with the reason on failure."""
    import mlflow
    from mlflow.models import Model

    from scanflow.tracking.model_digest import ModelIntegrityError, recorded_digest, verify

    resolved, version = resolve_uri(uri)
    try:
        local_path = mlflow.artifacts.download_artifacts(artifact_uri=resolved)
        name = registered_name(resolved)
        if name is not None and version is not None:
            verify(local_path, recorded_digest(name, str(version)), f"model {resolved}")
        meta = Model.load(local_path)
        flavor = "pytorch" if "pytorch" in meta.flavors else "python_function"
        if flavor == "pytorch":
            import mlflow.pytorch

            predict = _torch_predict(mlflow.pytorch.load_model(local_path, map_location="cpu"))
        else:
            predict = _pyfunc_predict(mlflow.pyfunc.load_model(local_path))
    except ModelLoadError:
        raise
    except ModelIntegrityError as exc:
        raise ModelLoadError(str(exc)) from exc
    except Exception as exc:
        raise ModelLoadError(f"cannot load model {uri!r} ({resolved}): {exc}") from exc
    if version is None:
        version = getattr(meta, "run_id", None) or resolved
    n = _n_features(meta, local_path)
    # Warm up once (first torch call allocates), so the first client does not pay for it.
    if n is not None:
        predict(np.zeros((2, n), dtype=np.float32))
    return LoadedModel(uri=uri, resolved_uri=resolved, version=str(version), n_features=n, predict=predict,
                       name=registered_name(resolved), flavor=flavor, signature=getattr(meta, "signature", None))
