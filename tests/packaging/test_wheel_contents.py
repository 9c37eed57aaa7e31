"""The built wheel holds every module of the source tree and every bundled model's files.

The wheel is built, as .ci/check_wheel.sh builds it, from a copy of the repository's top-level
files, ``isoprobe/`` and ``hydra_plugins/`` (no stale ``build/`` folder)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT

#: source folder -> the package it installs as
SOURCES = {"isoprobe": "isoprobe", "hydra_plugins": "hydra_plugins"}
BUNDLED = ROOT / "isoprobe" / "models" / "bundled"


def copy_sources(destination: Path) -> None:
    """The files a wheel is built from, as a fresh clone has them."""
    destination.mkdir()
    for path in ROOT.iterdir():
        if path.is_file():
            shutil.copy2(path, destination)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, destination / folder, symlinks=True, ignore=ignore)


def build_wheel(tmp_path: Path, extra: str) -> Path:
    """The wheel of a copy of the sources with one more file, ``extra``."""
    source, dist = tmp_path / "src", tmp_path / "dist"
    copy_sources(source)
    (source / extra).parent.mkdir(parents=True)
    (source / extra).write_text("0 1 2\n")
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    command += ["--no-build-isolation", "-w", str(dist), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = dist.glob("isoprobe-*.whl")
    return wheel


def expected_files() -> set[str]:
    """Every module of the source tree and every bundled file, as paths inside the wheel."""
    expected = set()
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*.py"):
            expected.add(f"{package}/{path.relative_to(ROOT / folder).as_posix()}")
    for path in BUNDLED.rglob("*"):
        if path.is_file():
            expected.add(f"isoprobe/{path.relative_to(ROOT / 'isoprobe').as_posix()}")
    return expected


#: a file of a kind and depth no bundled model has yet, added to the copy the wheel is built from
NEW_BUNDLED_FILE = "isoprobe/models/bundled/new-model-mini/tokenizer/vocab.txt"


def test_the_wheel_holds_every_package_module_and_bundled_file(tmp_path):
    with zipfile.ZipFile(build_wheel(tmp_path, extra=NEW_BUNDLED_FILE)) as wheel:
        files = set(wheel.namelist())
    expected = expected_files() | {NEW_BUNDLED_FILE}
    assert any(name.startswith("isoprobe/models/llm/") for name in expected)
    assert any(name.endswith(".safetensors") for name in expected)
    missing = sorted(expected - files)
    assert not missing, f"the wheel lacks {len(missing)} files, e.g. {missing[:10]}"
