"""A plain FastAPI app around `predictions_router`, with a background flusher: run as a subprocess.

Used by the tracking tests (and the benchmark) as "the process holding the log" that gets SIGKILLed.
Not a test module itself. MLflow is found through MLFLOW_TRACKING_URI.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

import uvicorn
from fastapi import FastAPI

from scanflow.tracking.api import predictions_router
from scanflow.tracking.feedback import FeedbackLog
from scanflow.tracking.feedback_api import feedback_router
from scanflow.tracking.predictions import PredictionLog


def flush_forever(log: PredictionLog, experiment: str, batch_size: int, interval_s: float) -> None:
    while True:
        try:
            result = log.flush_to_mlflow(experiment, batch_size=batch_size, max_batches=1)
            if result.batches == 0:
                time.sleep(interval_s)
        except Exception:  # keep flushing after transient MLflow errors, as a Tracker would
            logging.getLogger("predictions_app").exception("flush failed")
            time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token", default="secret-token")
    p.add_argument("--experiment", default="")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--flush-interval", type=float, default=0.05)
    p.add_argument("--max-records", type=int, default=100)
    p.add_argument("--feedback", type=int, default=0, help="1: mount the feedback log (same database) too")
    args = p.parse_args()

    log = PredictionLog(args.db)
    app = FastAPI()
    app.include_router(predictions_router(log, args.token, max_records=args.max_records))
    if args.feedback:
        app.include_router(feedback_router(FeedbackLog(args.db), args.token))
    if args.experiment:
        threading.Thread(
            target=flush_forever,
            args=(log, args.experiment, args.batch_size, args.flush_interval),
            daemon=True,
        ).start()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
