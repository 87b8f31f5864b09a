#!/usr/bin/env bash
# Build the root filesystems whose python3 the grading suite can run on, to test a host whose
# Python is another version than this one's: Ubuntu 24.04 (Python 3.12) and Debian 13 (3.13),
# each with pytest 8 from PyPI. Gradings run on the sandbox's interpreter (the host's own by
# default), so the grading code must hold on each. Safe to run again: a root that is there is
# kept. Needs root and the network (Ubuntu's and Debian's archives, PyPI), at setup only.
#
#   bash scripts/python-roots.sh [DIR]        # default /var/lib/tempering/roots
#   TEMPERING_TEST_GRADING_ROOTFS=DIR/noble bash scripts/test.sh tests/reward
set -euo pipefail
cd "$(dirname "$0")/.."
roots=${1:-/var/lib/tempering/roots}
PYTEST=${PYTEST:-pytest==8.4.2}

command -v debootstrap >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
        >/dev/null
}
[ -x .venv/bin/python ] || bash scripts/setup.sh

build() {  # name suite mirror [script]; says "built DIR" or why not, and fails then
    local dir=$roots/$1
    if [ -x "$dir/usr/bin/python3" ] && [ -e "$dir/.tempering-root" ]; then
        echo "python-roots: $dir is there ($(chroot "$dir" python3 --version))"
        return
    fi
    echo "python-roots: building $dir ($2)"
    rm -rf "$dir"
    mkdir -p "$roots"
    # Ubuntu's archive is signed by a key Debian's debootstrap does not hold.
    if ! debootstrap --variant=minbase --include=python3 ${4:+--no-check-gpg} "$2" "$dir" "$3" \
            ${4:+"$4"} > "$roots/$1.log" 2>&1; then
        echo "python-roots: could not build $dir ($3 unreachable?); see $roots/$1.log" >&2
        rm -rf "$dir"
        return 1
    fi
    # pytest for that root's python3, from PyPI (pure Python, so this venv's pip can fetch it)
    .venv/bin/python -m pip install -q --no-compile --target "$dir/usr/lib/python3/dist-packages" \
        "$PYTEST"
    touch "$dir/.tempering-root"
    echo "python-roots: $dir has $(chroot "$dir" python3 -c \
        'import sys, pytest; print("Python", sys.version.split()[0], "pytest", pytest.__version__)')"
}

status=0
build noble noble http://archive.ubuntu.com/ubuntu /usr/share/debootstrap/scripts/gutsy || status=1
build trixie trixie http://deb.debian.org/debian || status=1
exit $status
