"""The sensors workflow: a training job, an inference service with its backup, and the four agents.

`workflow` is what `scanflow validate workflows/sensors/workflow.py` and `scanflow deploy` read;
workflow.yaml beside it is its exact YAML form (regenerate it with `python -m scanflow.examples.sensors.workflow`;
a test checks the two are equal). The four standard agents (scanflow.standard): nothing in them knows this
dataset; they learn it from the reference data the training job logs.
"""

from __future__ import annotations

from pathlib import Path

from scanflow.spec import SLO, Job, Resources, Service, Workflow
from scanflow.standard import standard_agents

MODEL_NAME = "sensors"
SLO_SENSORS = SLO(latency_ms=50.0, percentile=99.0, error_rate=0.01)

train_job = Job(
    name="train",
    entrypoint="scanflow.examples.sensors.train:train",
    params={"model_name": MODEL_NAME, "alias": "challenger"},
    resources=Resources(cpu=1.0, memory="1Gi"),
    timeout_s=600.0,
)

sensors_service = Service(
    name="sensors",
    model_uri=f"models:/{MODEL_NAME}@champion",
    replicas=1,
    min_replicas=1,
    max_replicas=4,
    threads=1,
    resources=Resources(cpu=1.0, memory="512Mi"),
    slo=SLO_SENSORS,
    backup="sensors-backup",
)

# The backup serves the same champion from its own replica: it takes traffic when the primary is down.
backup_service = Service(
    name="sensors-backup",
    model_uri=f"models:/{MODEL_NAME}@champion",
    replicas=1,
    min_replicas=1,
    max_replicas=1,
    threads=1,
    resources=Resources(cpu=0.5, memory="512Mi"),
    slo=SLO_SENSORS,
)

# The MAPE-K chain of the four reference agents (scanflow.standard spells it out; scanflow/standard/*.py implement
# the actuators). The Executor's duplicate check gets no tolerance: readings differ by any amount or
# not at all. The gate may give up 2 points of clean accuracy (default 1): a recalibrated sensor moves
# every later reading, and a retrain on ~80 labelled recalibrated readings measured 0.9-1.0 points
# below the champion on clean readings (the fault classes overlap) for a gain of ~70 on drifted ones.
agents = standard_agents("sensors", executor={"duplicate_tolerance": 0.0}, promotion={"clean_tolerance": 0.02})

workflow = Workflow(
    name="sensors",
    jobs=[train_job],
    services=[sensors_service, backup_service],
    agents=agents,
    labels={"app": "sensors", "scenario": "recalibration"},
)

YAML_PATH = Path(__file__).with_name("workflow.yaml")

if __name__ == "__main__":
    YAML_PATH.write_text(workflow.to_yaml())
    print(f"wrote {YAML_PATH}")
