"""A container's start inside its pod's namespaces (run by tests/harness/cluster.py under `nsenter
--net` + `unshare -m`): mount its volumes into the image root, chroot, chdir, exec its argv with exactly
the env the kubelet resolved. A separate small program so nothing of the harness lingers in the child."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main(spec_file: str) -> None:
    with open(spec_file) as f:
        spec = json.load(f)
    root = spec["rootfs"]
    for src, path in spec["mounts"]:
        target = os.path.join(root, path.lstrip("/"))
        if os.path.isfile(src):  # a single file (compose's ./init.sql:/docker-entrypoint-initdb.d/10.sql)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        else:
            os.makedirs(target, exist_ok=True)
        subprocess.run(["mount", "--bind", src, target], check=True)
    os.chroot(root)
    os.chdir(spec["workdir"])
    env = spec["env"]
    os.execvpe(spec["argv"][0], spec["argv"], env)


if __name__ == "__main__":
    main(sys.argv[1])
