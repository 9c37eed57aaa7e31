#!/usr/bin/env bash
# The built wheel on its own: build it (from a copy of the sources, so no stale build/ folder
# can fill a gap), install it without dependencies into a fresh venv and, from outside the
# repository, import every module it holds and probe the bundled LLM zero-shot.
# The dependencies come from .venv's site-packages on PYTHONPATH: Python reads no .pth file
# there, so .venv's editable install of the repository stays out of sight.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python="$repo/.venv/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir "$work/src"
find "$repo" -maxdepth 1 -type f -exec cp {} "$work/src/" \;  # pyproject.toml, setup.py, README.md
cp -R "$repo/isoprobe" "$repo/hydra_plugins" "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" "$work/src"

"$python" -m venv --without-pip "$work/venv"
"$python" -m pip --python "$work/venv/bin/python" install --quiet --no-deps "$work"/dist/isoprobe-*.whl
deps=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# One process imports, from the wheel, every module of the source tree, then runs run.py as
# `python run.py ...` would, but without putting the script's folder (the repository) on
# sys.path; configs/ is read from there.
cd "$work"
export PYTHONPATH="$deps" HF_HUB_OFFLINE=1 WANDB_MODE=offline
"$work/venv/bin/python" - "$work/venv" "$repo/run.py" <<'PY'
import importlib
import runpy
import sys
from pathlib import Path

import isoprobe

venv, script = sys.argv[1:3]
if not isoprobe.__file__.startswith(venv):
    sys.exit(f"isoprobe was imported from {isoprobe.__file__}, not from the installed wheel")


def module_names(folder: Path, package: str) -> list[str]:
    """The dotted names of the modules in the source folder that holds ``package``."""
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join((package, *parts)))
    return names


repo = Path(script).parent
names = module_names(repo / "isoprobe", "isoprobe")
names += module_names(repo / "hydra_plugins", "hydra_plugins")
for name in names:
    importlib.import_module(name)
print(f"wheel: imported the repository's {len(names)} modules from {isoprobe.__path__[0]}")

sys.argv = [
    script, "model=llm", "model.checkpoint=bundled", "model.num_samples=2",
    "model.forecast_on_validation=false", "task=probe", "trainer=cpu",
    "trainer.enable_progress_bar=false", "logger=none", "callbacks=probe",
    "callbacks.probe.measures=[isotropy]", "callbacks.probe.num_windows=4",
    "callbacks.probe.isotropy.metrics.metrics=[cos_inter,isoscore]",
    "data.context_length=32", "data.prediction_length=8", "data.max_eval_windows=4",
    f"paths.root_dir={venv}/..",
]
runpy.run_path(script, run_name="__main__")
PY
test -s "$work"/logs/probe/runs/*/probe_metrics.csv
echo "wheel: model=llm task=probe ran from the installed wheel"
