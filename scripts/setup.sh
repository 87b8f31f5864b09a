#!/usr/bin/env bash
# Set up Tempering on a Debian or Ubuntu machine, as root. Safe to run again: it installs only
# what is missing, and reinstalls the Python package only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "setup: run as root (the local sandbox backend sets cgroup limits)" >&2
    exit 1
fi

# System packages: bubblewrap (namespaces), btrfs-progs (copy-on-write volumes), a C compiler
# with static libc (the sandbox init), the sandbox's default Python with pytest, venv for ours,
# procps for ps in tests, slirp4netns (the user-mode network stack of network=True sandboxes)
# and iproute2 (`ip`, which the network tests run inside sandboxes).
arch_lib=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)   # copy-on-write volumes (forks)
command -v cc >/dev/null || need+=(gcc)
[ -e "/usr/lib/$arch_lib/libc.a" ] || need+=(libc6-dev)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3 python3-pytest)
# Python.h: the red-team suite builds a C extension in a sandbox, as an agent could.
ls /usr/include/python3*/Python.h >/dev/null 2>&1 || need+=(python3-dev)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v ps >/dev/null || need+=(procps)
command -v slirp4netns >/dev/null || need+=(slirp4netns)
command -v nsenter >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
command -v dockerd >/dev/null || need+=(docker.io)           # the docker backend's engine
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# udev makes /dev/net/tun 0666 on standard systems; machines without udev leave it 0600, and the
# network stack runs as the unprivileged sandbox uid (the local backend also fixes it on use).
[ -c /dev/net/tun ] && chmod 0666 /dev/net/tun

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: Tempering needs Python >= 3.11; $python is $("$python" --version 2>&1)" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.tempering-installed
digest=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
    echo "setup: installing the tempering package into .venv"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e '.[dev,train,ray]'
    echo "$digest" > "$stamp"
fi
.venv/bin/tempering doctor >/dev/null 2>&1 || .venv/bin/tempering doctor

# The docker backend: start the engine when none answers (no systemd here, or it is down), then
# build the default image from this host's packages (cached: a no-op when it exists).
if [ "${TEMPERING_NO_DOCKER:-0}" != 1 ]; then
    if ! docker info >/dev/null 2>&1; then
        echo "setup: starting dockerd"
        mkdir -p /var/log/tempering
        nohup dockerd >/var/log/tempering/dockerd.log 2>&1 &
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    fi
    if docker info >/dev/null 2>&1; then
        .venv/bin/tempering image build >/dev/null || .venv/bin/tempering image build
    else
        echo "setup: dockerd did not start (see /var/log/tempering/dockerd.log); the docker" \
             "backend's tests will be skipped" >&2
    fi
fi
