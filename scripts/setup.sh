#!/usr/bin/env bash
# Creates .venv and installs isoprobe with its [data,dev] extras at the versions locked in
# constraints.txt (CPU torch included; refresh the lock with scripts/lock.sh).
# Idempotent: re-installs only when pyproject.toml or constraints.txt changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
stamp=.venv/.isoprobe-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    echo "isoprobe: installing into .venv (versions locked by constraints.txt)"
    .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[data,dev]"
    touch "$stamp"
fi
