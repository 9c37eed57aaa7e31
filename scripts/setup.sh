#!/usr/bin/env bash
# Creates .venv and installs isoprobe with its [data,dev,cluster,docs] extras at the versions locked
# in constraints.txt (CPU torch included; refresh the lock with scripts/lock.sh), then uni2ts for
# Moirai without its dependencies (scripts/moirai-requirements.txt: its pins clash with ours).
# Idempotent: re-installs only when pyproject.toml, constraints.txt or the Moirai list changed
# since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
stamp=.venv/.isoprobe-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ] \
    || [ scripts/moirai-requirements.txt -nt "$stamp" ]; then
    echo "isoprobe: installing into .venv (versions locked by constraints.txt)"
    .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[data,dev,cluster,docs]"
    echo "isoprobe: installing uni2ts for Moirai without its dependencies (scripts/moirai-requirements.txt)"
    .venv/bin/python -m pip install --quiet --no-deps -r scripts/moirai-requirements.txt
    touch "$stamp"
fi
