"""Runs MLX's own `mlx.distributed_config` (the `mlx` wheel's `_distributed_utils/config.py`)
on a fixture cluster: every command it would run over ssh is answered from FIXTURE/HOST/ as
`nuvec-launch config --replay FIXTURE` answers it, and the setup commands `--auto-setup` would
run are printed (`[replay] not run: ...`) instead of run.

Usage: python mlx_config.py FIXTURE [mlx.distributed_config options...]
"""

import os
import shlex
import subprocess
import sys

from mlx._distributed_utils import config

FIXTURE = sys.argv[1]
FILES = {
    ("system_profiler", "SPThunderboltDataType", "-json"): "thunderbolt.json",
    ("networksetup", "-listallhardwareports"): "hardware-ports.txt",
    ("ibv_devices",): "ibv_devices.txt",
    ("ipconfig", "getifaddr", "en0"): "en0.txt",
    ("ipconfig", "getifaddr", "en1"): "en1.txt",
}


def fake_run(command, capture_output=False, text=False, stdout=None, stderr=None):
    assert command[0] == "ssh", command
    words = command[1:]
    while words[0] == "-o":
        words = words[2:]
    host, remote = words[0], tuple(words[1:])
    home = os.path.join(FIXTURE, host)
    code, out = 0, b""
    if not os.path.isdir(home):
        code = 255
    elif remote == ("echo", "success"):
        out = b"success\n"
    elif remote == ("sudo", "ls"):
        code = 1 if os.path.exists(os.path.join(home, "no-sudo")) else 0
    elif remote in FILES:
        path = os.path.join(home, FILES[remote])
        if os.path.exists(path):
            out = open(path, "rb").read()
        else:
            code = 1
    elif len(remote) == 1 and not capture_output:
        print(f"[replay] not run: {shlex.join(command)}")
        sys.stdout.flush()
    else:
        raise AssertionError(f"unexpected command {command}")
    if text:
        out = out.decode()
    return subprocess.CompletedProcess(command, code, out if capture_output else None, None)


config.run = fake_run
sys.argv = ["mlx.distributed_config"] + sys.argv[2:]
config.main()
