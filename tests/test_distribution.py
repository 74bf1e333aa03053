"""The distribution as people install it (docs/releasing.md): ``python -m build`` makes an sdist
and a wheel from a copy of this tree; the wheel must carry every file of the package (the CUDA
sources under kernels/ and models/ included), a wheel built from the sdist must be the same
wheel, ``twine check`` must pass on both, the versions must agree, and the installed wheel must
work in a fresh virtual environment with no source tree on the path.

The fresh environment gets its dependencies (torch, numpy, pytest, ...) from the running
environment through one ``.pth`` line naming a folder of links to that environment's
site-packages, this package's own entries left out (its editable finder and metadata), while
the package itself is installed from the built wheel with ``--no-deps``: installing torch
into it took 94 s on the 2-core VM, the whole link folder a fraction of a second
(docs/releasing.md has the numbers)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import pytest_spikecheck

ROOT = Path(__file__).resolve().parents[1]
#: source folder -> where its files land in the wheel (pyproject's [tool.setuptools] package-dir)
WHEEL_PLACES = {
    "pytest_spikecheck": "pytest_spikecheck",
    "models": "pytest_spikecheck/models",
    "kernels": "pytest_spikecheck/kernels",
}
#: what the sdist must carry whatever MANIFEST.in says: sources, kernels, models, tests, licence, changelog, readme
SDIST_NEEDS = {
    "pyproject.toml",
    "MANIFEST.in",
    "LICENSE",
    "CHANGELOG.md",
    "README.md",
    "conftest.py",
    "pytest_spikecheck/__init__.py",
    "kernels/clip.cu",
    "models/gpt.py",
    "tests/test_distribution.py",
}
#: files setuptools writes into every sdist
SDIST_GENERATED = {"PKG-INFO", "setup.cfg"}
#: tree files left out of the sdist on purpose (git's own configuration)
SDIST_LEAVES_OUT = {".gitignore"}
#: folders a walk of the tree skips when git is not there to say what is ignored
_WALK_SKIPS = {
    ".git",
    ".venv",
    "build",
    "dist",
    "out",
    "runs",
    "mutants",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".benchmarks",
    ".cache",
    "run",
}


@dataclass(frozen=True)
class Dist:
    tree: tuple[str, ...]  # the tree's files, relative (what the copy was made of)
    from_git: bool
    sdist: Path
    wheel: Path  # built from the sdist (what `python -m build` makes)
    tree_wheel: Path  # built from the tree copy directly
    work: Path


def tree_files() -> tuple[tuple[str, ...], bool]:
    """The tree's files as git sees them (tracked, and untracked but not ignored), else a walk that
    leaves out the usual build and run output; and whether git said."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
        ).stdout.decode()
        return tuple(sorted({p for p in out.split("\0") if p and (ROOT / p).is_file()})), True
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _WALK_SKIPS and not d.endswith(".egg-info")]
        found += [Path(folder, f).relative_to(ROOT).as_posix() for f in files if not f.endswith((".pyc", ".so"))]
    return tuple(sorted(found)), False


def wheel_needs(tree: tuple[str, ...]) -> set[str]:
    """The wheel paths of the package's files: pytest_spikecheck/ as it is, models/ and kernels/ under it."""
    needs = set()
    for path in tree:
        top, _, rest = path.partition("/")
        if top in WHEEL_PLACES and rest:
            needs.add(f"{WHEEL_PLACES[top]}/{rest}")
    return needs


def _run(command: list, what: str, **kwargs) -> subprocess.CompletedProcess:
    return _run_together([(command, what, kwargs)])[0]


def _run_together(jobs: list[tuple[list, str, dict]]) -> list[subprocess.CompletedProcess]:
    """Run the commands at the same time (each (command, what, Popen keywords)); each must exit 0."""
    with contextlib.ExitStack() as files:  # files, not pipes: a full pipe would stall the one not read yet
        procs = []
        for command, what, kwargs in jobs:
            out, err = files.enter_context(tempfile.TemporaryFile("w+")), files.enter_context(tempfile.TemporaryFile("w+"))
            procs.append(
                (
                    subprocess.Popen([str(c) for c in command], stdout=out, stderr=err, text=True, **kwargs),
                    command,
                    what,
                    out,
                    err,
                )
            )
        results = []
        for proc, command, _, out, err in procs:
            proc.wait()
            out.seek(0), err.seek(0)
            results.append(subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read()))
    for result, (_, _, what, _, _) in zip(results, procs):
        assert result.returncode == 0, f"{what} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
    return results


def _copy_tree(tree: tuple[str, ...], to: Path) -> Path:
    for path in tree:
        (to / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, to / path)
    return to


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Dist:
    missing = [name for name in ("build", "twine") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not installed: they are in the dev extra (make setup-dev)")
    work = tmp_path_factory.mktemp("distribution")
    tree, from_git = tree_files()
    # at the same time, each from its own copy of the tree (setuptools writes build/ and egg-info
    # into the folder it builds): the sdist and a wheel from it (what `python -m build` makes),
    # and a wheel from the tree itself
    build = [sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check"]
    _run_together(
        [
            ([*build, "--outdir", work / "from-sdist", _copy_tree(tree, work / "src")], "python -m build", {}),
            (
                [*build, "--wheel", "--outdir", work / "from-tree", _copy_tree(tree, work / "src-wheel")],
                "python -m build --wheel",
                {},
            ),
        ]
    )
    (sdist,) = (work / "from-sdist").glob("*.tar.gz")
    (wheel,) = (work / "from-sdist").glob("*.whl")
    (tree_wheel,) = (work / "from-tree").glob("*.whl")
    return Dist(tree, from_git, sdist, wheel, tree_wheel, work)


def _wheel_files(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as z:
        return {name: hashlib.sha256(z.read(name)).hexdigest() for name in z.namelist() if not name.endswith("/")}


def test_the_wheel_carries_every_file_of_the_package(dist: Dist) -> None:
    names = {n for n in _wheel_files(dist.wheel) if ".dist-info/" not in n}
    needs = wheel_needs(dist.tree)
    assert needs - names == set(), f"missing from the wheel (package data in pyproject.toml?): {sorted(needs - names)}"
    assert names - needs == set(), f"in the wheel but not in the tree: {sorted(names - needs)}"
    # what the code opens by name is among them (the CUDA sources, read by importlib.resources)
    assert {
        "pytest_spikecheck/kernels/clip.cu",
        "pytest_spikecheck/kernels/cuda_emulator.h",
        "pytest_spikecheck/kernels/emulator_driver.cpp",
        "pytest_spikecheck/models/gpt.py",
    } <= names
    info = {n.split("/", 1)[1] for n in _wheel_files(dist.wheel) if ".dist-info/" in n}
    assert {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "licenses/LICENSE"} <= info


def test_a_wheel_built_from_the_sdist_is_the_wheel_built_from_the_tree(dist: Dist) -> None:
    from_sdist, from_tree = _wheel_files(dist.wheel), _wheel_files(dist.tree_wheel)
    assert sorted(from_sdist) == sorted(from_tree)
    assert [n for n in from_sdist if from_sdist[n] != from_tree[n]] == []


def test_the_sdist_carries_the_tree(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as tar:
        top = f"pytest_spikecheck-{pytest_spikecheck.__version__}/"
        members = [m for m in tar.getmembers() if m.isfile()]
        assert all(m.name.startswith(top) for m in members)
        names = {m.name[len(top) :] for m in members}
    generated = SDIST_GENERATED | {n for n in names if n.startswith("pytest_spikecheck.egg-info/")}
    assert SDIST_NEEDS - names == set()
    if dist.from_git:  # exactly git's view of the tree: nothing ignored (run folders, build output) slips in
        tree = set(dist.tree) - SDIST_LEAVES_OUT
        assert tree - names == set(), f"missing from the sdist (MANIFEST.in): {sorted(tree - names)}"
        assert names - tree - generated == set(), f"in the sdist but not in the tree: {sorted(names - tree - generated)}"


def test_twine_check_passes_on_both(dist: Dist) -> None:
    result = _run([sys.executable, "-m", "twine", "check", "--strict", dist.sdist, dist.wheel], "twine check")
    assert result.stdout.count("PASSED") == 2, result.stdout


def _metadata_version(text: str) -> str:
    return re.search(r"^Version: (\S+)$", text, re.M).group(1)


def changelog_releases(text: str) -> list[tuple[str, str | None]]:
    """(version, status) of each ``## `` heading of CHANGELOG.md, top first: status is
    "unreleased", a date (YYYY-MM-DD) or None (the pre-distribution 0.1.0). A heading of
    another shape is a ValueError (docs/releasing.md, "The changelog")."""
    releases = []
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.fullmatch(r"## (\d+\.\d+\.\d+)(?: \((unreleased|\d{4}-\d{2}-\d{2})\))?", line)
            if not m:
                raise ValueError(f"CHANGELOG.md: a release heading is '## X.Y.Z (unreleased|YYYY-MM-DD)', not {line!r}")
            releases.append((m.group(1), m.group(2)))
    return releases


def test_the_versions_agree(dist: Dist) -> None:
    version = pytest_spikecheck.__version__
    with zipfile.ZipFile(dist.wheel) as z:
        assert _metadata_version(z.read(f"pytest_spikecheck-{version}.dist-info/METADATA").decode()) == version
    with tarfile.open(dist.sdist) as tar:
        assert _metadata_version(tar.extractfile(f"pytest_spikecheck-{version}/PKG-INFO").read().decode()) == version
    releases = changelog_releases((ROOT / "CHANGELOG.md").read_text())
    assert releases[0][0] == version, f"CHANGELOG.md's top section is {releases[0][0]}, the code says {version}"
    assert [s for _, s in releases[1:] if s == "unreleased"] == [], "only the top section may be unreleased"
    numbers = [tuple(map(int, v.split("."))) for v, _ in releases]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)


def test_a_changelog_heading_of_another_shape_is_refused() -> None:
    assert changelog_releases("# Changelog\n\n## 0.3.0 (unreleased)\n\n## 0.2.0 (2026-12-02)\n") == [
        ("0.3.0", "unreleased"),
        ("0.2.0", "2026-12-02"),
    ]
    with pytest.raises(ValueError, match="not '## Unreleased'"):
        changelog_releases("## Unreleased\n")


_PROBE = """
import hashlib, importlib.metadata as md, importlib.resources, importlib.util, json, sys
import pytest_spikecheck
from pytest_spikecheck.clipping.cupy_backend import cupy_unavailable_reason, kernel_source
from pytest_spikecheck.training.store import package_digest
kernels = importlib.resources.files("pytest_spikecheck.kernels")
print(json.dumps({
    "package": pytest_spikecheck.__file__,
    "models": importlib.util.find_spec("pytest_spikecheck.models").origin,
    "kernels": str(kernels),
    "sources": {p.name: hashlib.sha256(kernel_source(p.name).encode()).hexdigest()
                for p in kernels.iterdir() if p.name.endswith((".cu", ".h", ".cpp"))},
    "clip_cu_has_kernels": "__global__" in kernel_source(),
    "cupy": cupy_unavailable_reason(),
    "digest": package_digest(),
    "version": pytest_spikecheck.__version__,
    "metadata_version": md.version("pytest-spikecheck"),
    "distributions": sum(d.metadata["Name"] == "pytest-spikecheck" for d in md.distributions()),
    "torch": md.version("torch"),
    "sys_path": sys.path,
}))
"""

_DOWNSTREAM_CONFTEST = """
from pytest_spikecheck import RareTokenBurst, Scenario, spikecheck_scenario

@spikecheck_scenario
def short():
    return Scenario.preset("phase-19").replace(steps=12).with_breaks(RareTokenBurst(count=3, at_step=8))
"""

_DOWNSTREAM_TEST = """
import importlib.metadata
import sys
from pathlib import Path

import pytest_spikecheck
from pytest_spikecheck import assert_clip_contains


def test_the_installed_plugin_trains_and_judges(short, request):
    plugin = request.config.pluginmanager.get_plugin("spikecheck")  # loaded through the wheel's entry point
    assert Path(plugin.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())
    assert Path(pytest_spikecheck.__file__).resolve().is_relative_to(Path(sys.prefix).resolve())
    assert len(short.metrics) == 12
    assert_clip_contains(short, max_norm=1.0)


def test_spikecheck_train_on_a_preset():
    # what bin/spikecheck runs (its console_scripts entry point), in this process: a second
    # process would import torch a second time (docs/releasing.md)
    (spikecheck,) = importlib.metadata.entry_points(group="console_scripts", name="spikecheck")
    assert spikecheck.value == "pytest_spikecheck.cli:main"
    assert spikecheck.load()(["train", "../exp", "--out", "../run", "--quiet"]) == 0
"""


def _fresh_venv(work: Path, wheel: Path) -> tuple[Path, Path]:
    """A virtual environment with the wheel installed (no deps) and the running environment's
    site-packages, this package left out, on its path through one .pth line. (python, purelib)"""
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], "python -m venv")
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    links = work / "deps"
    links.mkdir()
    for site in dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]):
        for entry in sorted(Path(site).iterdir()):
            if entry.name.startswith(("pytest_spikecheck", "__editable__", "__pycache__")) or entry.suffix == ".pth":
                continue  # this package's editable finder and metadata, and .pth files (never processed there anyway)
            if not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry)
    (purelib / "_spikecheck_test_deps.pth").write_text(f"{links}\n")
    python = venv / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "-q",
            "--disable-pip-version-check",
            wheel,
        ],
        "pip install the wheel",
    )
    return python, purelib


def _torch_pin() -> str:
    """The torch version the Makefile installs (``TORCH := torch==X``)."""
    return re.search(r"^TORCH\s*:=\s*torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def test_the_installed_wheel_works_outside_the_tree(dist: Dist) -> None:
    python, purelib = _fresh_venv(dist.work, dist.wheel)
    home = dist.work / "outside"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST", "VIRTUAL_ENV"))}
    env.update(
        PYTHONSAFEPATH="1",
        PYTHONNOUSERSITE="1",
        SPIKECHECK_CACHE_DIR=str(dist.work / "cache"),
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
    )
    run = {"cwd": home, "env": env}

    probe = json.loads(_run([python, "-c", _PROBE], "the probe", **run).stdout)
    site = purelib.resolve()
    for key in ("package", "models", "kernels"):  # the wheel's copy, not the tree's
        assert Path(probe[key]).resolve().is_relative_to(site), (key, probe[key])
    assert not [p for p in probe["sys_path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert probe["distributions"] == 1
    assert probe["version"] == probe["metadata_version"] == pytest_spikecheck.__version__
    assert probe["torch"].split("+")[0] == _torch_pin()
    tree_kernels = {
        p.name: hashlib.sha256(p.read_text("utf-8").encode()).hexdigest()
        for p in (ROOT / "kernels").iterdir()
        if p.name.endswith((".cu", ".h", ".cpp"))
    }
    assert probe["sources"] == tree_kernels and probe["clip_cu_has_kernels"]
    assert probe["cupy"] is None or isinstance(probe["cupy"], str)  # asked without a crash, GPU or not
    # the run store's key for "the same source" (training/store.py) is the tree's: runs cached by a
    # clone are valid for the installed wheel and back
    from pytest_spikecheck.training.store import package_digest

    assert probe["digest"] == package_digest()

    (home / "exp").mkdir()
    (home / "exp" / "config.yaml").write_text("preset: phase-19\nsteps: 3\n")
    downstream = home / "downstream"
    downstream.mkdir()
    (downstream / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\nfilterwarnings = error\n")
    (downstream / "conftest.py").write_text(textwrap.dedent(_DOWNSTREAM_CONFTEST))
    (downstream / "test_downstream.py").write_text(textwrap.dedent(_DOWNSTREAM_TEST))
    tested = _run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--spikecheck"], "pytest --spikecheck", cwd=downstream, env=env
    )
    assert "2 passed" in tested.stdout
    meta = json.loads((home / "run" / "run.json").read_text())
    assert meta["package_version"] == pytest_spikecheck.__version__
    assert len((home / "run" / "metrics.jsonl").read_text().splitlines()) == 3
    checked = _run([python.parent / "spikecheck", "check", "run/metrics.jsonl"], "spikecheck check", **run)
    assert "3 logged steps" in checked.stdout and "every value finite" in checked.stdout
