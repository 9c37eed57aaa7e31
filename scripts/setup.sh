#!/usr/bin/env bash
# Creates .venv and installs isoprobe with the extras a command needs, at the versions locked in
# constraints.txt (CPU torch included; refresh the lock with scripts/lock.sh), then uni2ts for
# Moirai without its dependencies (scripts/moirai-requirements.txt: its pins clash with ours).
#
#   bash scripts/setup.sh          # [data,dev,cluster]: runs, sweeps and the tests (both README commands)
#   bash scripts/setup.sh docs     # ... and [docs] too: mkdocs serve / mkdocs build (CI)
#
# Idempotent: re-installs only when pyproject.toml, constraints.txt or the Moirai list changed
# since the last install, or when an extra asked for is not installed yet (extras installed
# before are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin=${PYTHON:-python3}
wanted="data dev cluster"
for extra in "$@"; do
    case "$extra" in
        docs) wanted="$wanted docs" ;;
        *) echo "scripts/setup.sh: unknown extra '$extra' (give nothing, or docs)" >&2; exit 2 ;;
    esac
done
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
stamp=.venv/.isoprobe-installed
installed=""
[ -f "$stamp" ] && installed=$(cat "$stamp")
missing=""
for extra in $wanted; do
    case " $installed " in *" $extra "*) ;; *) missing="$missing $extra" ;; esac
done
if [ ! -f "$stamp" ] || [ -n "$missing" ] || [ pyproject.toml -nt "$stamp" ] \
    || [ constraints.txt -nt "$stamp" ] || [ scripts/moirai-requirements.txt -nt "$stamp" ]; then
    extras=$(printf '%s\n' $installed $wanted | sort -u | tr '\n' ',' | sed 's/,$//')
    echo "isoprobe: installing [$extras] into .venv (versions locked by constraints.txt)"
    .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[$extras]"
    echo "isoprobe: installing uni2ts for Moirai without its dependencies (scripts/moirai-requirements.txt)"
    .venv/bin/python -m pip install --quiet --no-deps -r scripts/moirai-requirements.txt
    printf '%s\n' "$extras" | tr ',' ' ' > "$stamp"
fi
