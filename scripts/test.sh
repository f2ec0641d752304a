#!/usr/bin/env bash
# Set up everything (scripts/setup.sh --all), lint, and run the whole test suite: unit tests and the
# integration tests that drive real processes and daemons. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --all
.venv/bin/ruff check bridge tests bench scripts
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
