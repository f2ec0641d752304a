#!/bin/sh
# Build the operator image (ghcr.io/hpc-bridge/operator:<version>) from this checkout, as CI does, without docker or
# a registry: a Debian root made by debootstrap, hpc-bridge with its operator extra, written as a docker-archive
# tarball. The recipe and what the image holds: tests/harness/operator_image.py (docs/operator.md, The image).
#
#   sudo scripts/build-operator-image.sh [--out operator.tar]
#   docker load -i operator.tar                  # or: ctr -n k8s.io images import operator.tar
#
# Needs root (debootstrap, chroot, an overlay mount), debootstrap, GNU tar, and a Python with pip and setuptools
# (the checkout's .venv when there is one). Layers are cached by content under ~/.cache/hpcbridge/images
# ($HPCBRIDGE_CACHE_DIR overrides it): a second build of the same checkout takes seconds.
set -eu
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && python=${PYTHON:-.venv/bin/python}
exec "$python" -m tests.harness.operator_image "$@"
