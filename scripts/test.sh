#!/usr/bin/env bash
# Set up everything (scripts/setup.sh --all) and run the whole test suite: unit tests and the integration
# tests that drive real processes and daemons. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --all
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
