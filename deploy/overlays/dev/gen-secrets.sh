#!/bin/sh
# Write deploy/overlays/dev/secrets.env (never committed) with random values, once: the dev overlay's
# Secret `scanflow-secrets` is generated from it. An existing file is kept (the cluster has those values).
set -eu
out="$(dirname "$0")/secrets.env"
if [ -s "$out" ]; then echo "$out exists; keeping it"; exit 0; fi
umask 077
rand() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
printf 'token=%s\npostgres-password=%s\n' "$(rand 32)" "$(rand 24)" > "$out"
echo "wrote $out"
