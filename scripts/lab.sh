#!/usr/bin/env bash
# The local lab: a Proxmox-like node (sshd on 127.0.0.2 + `pct`, `qm`), LXC-like containers and a VM in the
# problem state, and an NVIDIA-style apt repo on 127.0.0.1, so every command of docs/quickstart.md can be tried
# without a cluster. Loopback only; nothing of this machine is changed outside the lab directory.
#
#   scripts/lab.sh up [--no-healthy] [--real-torch] [--vm real|stand-in]
#                                      start it in the background, write the inventory, print how to use it;
#                                      --real-torch adds CT 203 train-cu130 with the real torch 2.14.1 (CUDA
#                                      13.0) and puts the real nvcc 13.0 in the repo (needs /usr/local/cuda-13.0);
#                                      VM 300 gpu-vm is a real QEMU guest (TCG, real qemu-guest-agent) where
#                                      QEMU can run here (qemu-system-x86, qemu-utils, libc6-dev, e2fsprogs,
#                                      debootstrap), else the stand-in VM; --vm chooses
#   scripts/lab.sh status              show where it is and whether sshd, the repo and the VM's agent answer
#   scripts/lab.sh env                 print `export LAB_INVENTORY=... REPO_BASE=...` (eval "$(scripts/lab.sh env)")
#   scripts/lab.sh down                stop everything it started and remove its state
#
# Needs: root, Debian 12 or Ubuntu (apt, dpkg), openssh-server (its sshd binary only; the system service is
# never started), openssh-client, dpkg-dev, apt-utils, gnupg, util-linux, overlayfs, and gcc for the healthy
# container. State: $FLEETFIX_LAB_DIR (default /var/lib/fleetfix-lab). Implementation: tests/lab/cli.py.
set -euo pipefail
repo_root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
case "${1:-}" in
    up|down|status|env) ;;
    *) echo "usage: scripts/lab.sh up [--no-healthy] [--real-torch] [--vm real|stand-in] | status | env | down" >&2; exit 2 ;;
esac
cd "$repo_root"
PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m tests.lab.cli "$@"
