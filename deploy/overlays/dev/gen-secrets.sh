#!/bin/sh
# Write deploy/overlays/dev/secrets.env (never committed) with random values, once: the dev overlay's
# Secret `scanflow-secrets` is generated from it. One token and/or MLflow login per component (keys:
# scanflow/deploy_secrets.py). An existing file is kept (the cluster has those values); one from before
# per-component credentials (a single `token=`) is refused: delete it and run again.
# PYTHON: an interpreter with scanflow's dependencies (default: the checkout's .venv, else python3).
set -eu
out="$(dirname "$0")/secrets.env"
if [ -s "$out" ] && ! grep -q '^auth-tokens=' "$out"; then
  echo "$out holds a single shared token (old format): delete it and run again" >&2; exit 1
fi
if [ -s "$out" ] && ! grep -q '^tracker-store-password=' "$out"; then
  echo "$out has no per-agent database passwords (older format): delete it and run again" >&2; exit 1
fi
root="$(cd "$(dirname "$0")/../../.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ] && [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; fi
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec "${py:-python3}" -m scanflow.deploy_secrets --format kube "$out"
