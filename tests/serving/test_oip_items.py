"""`oip_items.parse_items` (the joint check of a coalesced call's v2 items) answers every item exactly as
`parse_item` (one item alone, the replica's v2 route's checks) does: same accepted rows, ids and outputs,
same refusals with the same status and message. Pure: a stand-in catalog, no replica or HTTP."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest

from scanflow.serving.oip import ModelMeta, OipError, TensorMeta
from scanflow.serving.oip_items import Parsed, parse_item, parse_items
from scanflow.serving.payload import PredictRequest

WIDTH = 4
LIMITS: dict[str, Any] = {"n_features": WIDTH, "max_rows": 50, "max_body_bytes": 2_000}


class Catalog:
    """Stands in for OipCatalog: serves `m` (version 1), knows nothing else."""

    def __init__(self, declared: str | None = None) -> None:
        inputs = [TensorMeta("input", declared or "FP32", [-1, WIDTH])]
        outputs = [TensorMeta("label", "INT64", [-1]), TensorMeta("probabilities", "FP64", [-1, 3])]
        self.meta = ModelMeta("m", "1", "mlflow_sklearn", inputs, outputs, declared=declared is not None)

    def known(self, name: str, version: str | None) -> ModelMeta:
        if not self.meta.answers_to(name, version):
            raise OipError(404, f"unknown model {name!r}")
        return self.meta


def _body(data: Any = None, shape: Any = None, datatype: Any = "FP32", **extra: Any) -> bytes:
    data = [0.1, 0.2, 0.3, 0.4] if data is None else data
    tensor = {"name": "input", "shape": [1, WIDTH] if shape is None else shape, "datatype": datatype, "data": data}
    tensor.update(extra.pop("tensor", {}))
    return orjson.dumps({"inputs": [tensor], **extra}, option=orjson.OPT_SERIALIZE_NUMPY)


GOOD = [
    _body(),
    _body(id="client-7"),
    _body([1, 2, 3, 4]),  # integers in a float tensor
    _body([True, 0.5, 0.0, 1.0]),  # a boolean among numbers: numpy reads it as 1.0, alone or stacked
    _body(datatype="FP64", outputs=[{"name": "label"}]),
    _body(parameters={"x": 1}, tensor={"parameters": {}}),
    _body([[0.1, 0.2, 0.3, 0.4]]),  # nested as its shape says
    _body([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], shape=[2, WIDTH]),  # two rows
    _body([1, 2, 3, 4], datatype="INT32"),
    _body(id="é-accented"),
]
BAD = [
    b"not json",
    b"[]",
    _body([0.1, 0.2, 0.3]),  # too few values for its shape
    _body([0.1, 0.2, 0.3], shape=[1, 3]),  # the wrong width
    _body(["a", "b", "c", "d"]),
    _body([True, False, True, True]),  # booleans only
    _body([0.1, None, 0.3, 0.4]),
    _body([1e39, 0.0, 0.0, 0.0]),  # over float32's range
    _body(datatype="BYTES"),
    _body(datatype="FP32", shape=[1.0, 4]),  # a float in the shape
    _body(shape=[True, WIDTH]),
    _body(id=""),
    _body(id="x" * 201),
    _body(id=5),
    _body(parameters=[1]),
    _body(outputs=[{"name": "nope"}]),
    _body(tensor={"name": "other"}),
    _body(tensor={"parameters": 3}),
    _body([0.5, 0.5, 0.5, 0.5], datatype="INT32"),
    b'{"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [NaN, 0, 0, 0]}]}',
    _body([0.1] * 600, shape=[150, WIDTH]),  # over the body limit
]


def _same(a: Parsed, b: Parsed) -> bool:
    if isinstance(a[0], PredictRequest) != isinstance(b[0], PredictRequest):
        return False
    if not isinstance(a[0], PredictRequest):
        return a == b
    (ra, ia), (rb, ib) = a, b  # type: ignore[misc]
    return (
        ra.inputs.dtype == rb.inputs.dtype == np.float32 and np.array_equal(ra.inputs, rb.inputs)
        and ra.request_id == rb.request_id and ra.want_probabilities == rb.want_probabilities
        and ia.meta is ib.meta and np.array_equal(ia.call.rows, ib.call.rows)
        and ia.call.request_id == ib.call.request_id and ia.call.outputs == ib.call.outputs
    )


@pytest.mark.parametrize("declared", [None, "FP32"])
def test_each_item_is_answered_as_parse_item_answers_it(declared: str | None) -> None:
    catalog = Catalog(declared)
    rng = np.random.default_rng(3)
    bodies = GOOD + BAD
    for trial in range(40):  # random mixes: a refused value must not change its neighbours' answers
        picked = [bodies[i] for i in rng.integers(0, len(bodies), size=int(rng.integers(1, 12)))]
        items = [(b, "m", None if trial % 3 else "1") for b in picked]
        items.append((_body(), "other", None))  # an unknown model in every call
        joint = parse_items(items, catalog, **LIMITS)  # type: ignore[arg-type]
        alone = [parse_item(b, n, v, catalog, **LIMITS) for b, n, v in items]  # type: ignore[arg-type]
        for k, (got, want) in enumerate(zip(joint, alone)):
            assert _same(got, want), (trial, k, items[k][0], got, want)


def test_the_common_case_is_accepted_jointly_and_refusals_keep_their_messages() -> None:
    catalog = Catalog()
    items = [(_body([float(i), 0.0, 0.0, 1.0], id=f"r{i}"), "m", None) for i in range(5)]
    out = parse_items(items, catalog, **LIMITS)  # type: ignore[arg-type]
    assert [o[0].inputs[0, 0] for o in out] == [0.0, 1.0, 2.0, 3.0, 4.0]  # type: ignore[union-attr]
    assert [o[0].request_id for o in out] == [f"r{i}" for i in range(5)]  # type: ignore[union-attr]
    # a NaN-free overflow in one item: that item refused with parse_item's message, the others accepted
    items[2] = (_body([1e39, 0.0, 0.0, 0.0]), "m", None)
    out = parse_items(items, catalog, **LIMITS)  # type: ignore[arg-type]
    status, message = out[2]
    assert status == 400 and b"out of range for FP32" in message  # type: ignore[operator]
    assert all(isinstance(o[0], PredictRequest) for k, o in enumerate(out) if k != 2)
    assert math.isclose(out[4][0].inputs[0, 0], 4.0)  # type: ignore[union-attr]
