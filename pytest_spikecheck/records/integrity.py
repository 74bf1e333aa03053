"""Run folders that prove they are whole: written aside and moved into place, with a manifest.

:meth:`Run.save <pytest_spikecheck.records.run.Run.save>` writes a run's files into a fresh
folder beside the target and renames it into place (:func:`save_folder`), so a kill during a save
leaves the old folder or the new one, never half of each. ``run.json`` carries a ``manifest``
(:func:`manifest_of`): the size and sha256 of ``metrics.jsonl``, ``events.json``,
``batches.jsonl`` and ``config.yaml``, the step count, and a digest of the rest of ``run.json``
itself. Every reader that reuses a run (the run store, so the plugin's disk cache and a sweep's
resume; ``diagnose``, ``compare`` and ``check`` of a run folder) checks it (:func:`problem`):

- a cache (:class:`~pytest_spikecheck.training.store.RunStore`) treats a damaged entry, or one
  without a manifest, as absent: one warning line, then the run is trained again;
- a user's run folder that fails its manifest is refused in one line (:class:`DamagedRunError`,
  a :class:`~pytest_spikecheck.errors.ConfigError`). A folder without a manifest (written before
  manifests, or by hand: only ``metrics.jsonl`` is required) is read as it is.

The manifest guards against accidents (a cut file, an interrupted copy, a file of another run
beside this one), not against someone who rewrites the manifest too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from pytest_spikecheck.errors import ConfigError

#: The key of the manifest in run.json.
MANIFEST_KEY = "manifest"
#: The files a manifest lists (those present when the run was saved).
MANIFEST_FILES = ("metrics.jsonl", "events.json", "batches.jsonl", "config.yaml")
#: Every file a run folder may hold: a save replaces a folder that holds only these, and refuses
#: one that holds anything else (a user's files are never deleted). ``store.json`` is the run
#: store's provenance file.
RUN_FILES = (*MANIFEST_FILES, "run.json", "store.json")


class DamagedRunError(ConfigError):
    """A run folder whose files do not match its manifest (one line: which file, how)."""

    why: str = ""


def _digest(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def meta_digest(meta: Mapping[str, Any]) -> str:
    """sha256 of run.json's content other than its manifest, as JSON would read it back."""
    rest = {k: v for k, v in meta.items() if k != MANIFEST_KEY}
    text = json.dumps(json.loads(json.dumps(rest, default=str)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def manifest_of(folder: Path, meta: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """The manifest of the run files written in ``folder`` (before run.json is written)."""
    files = {}
    for name in MANIFEST_FILES:
        if (folder / name).is_file():
            size, digest = _digest(folder / name)
            files[name] = {"bytes": size, "sha256": digest}
    return {"steps": int(steps), "files": files, "run_json_sha256": meta_digest(meta)}


def problem(folder: Path, meta: Mapping[str, Any], *, required: bool) -> str | None:
    """What is wrong with the run folder ``folder`` whose run.json holds ``meta``, in words (None:
    it is whole). ``required``: a folder without a manifest is damaged (a cache's entries always
    have one), else it is read as it is (an older or hand-written folder)."""
    manifest = meta.get(MANIFEST_KEY) if isinstance(meta, Mapping) else None
    if manifest is None:
        return "its run.json has no manifest (cut, or written by an older version)" if required else None
    if not isinstance(manifest, Mapping) or not isinstance(manifest.get("files"), Mapping):
        return "its run.json's manifest is not a manifest"
    for name, want in manifest["files"].items():
        path = folder / str(name)
        if not path.is_file():
            return f"{name} is missing"
        size, digest = _digest(path)
        if not isinstance(want, Mapping) or size != want.get("bytes"):
            return (
                f"{name} holds {size} bytes, its manifest says {want.get('bytes') if isinstance(want, Mapping) else '?'} "
                f"(cut or changed after it was saved)"
            )
        if digest != want.get("sha256"):
            return f"{name} is not the file that was saved (its content digest differs)"
    for name in MANIFEST_FILES:
        if name not in manifest["files"] and (folder / name).is_file():
            return f"{name} was not saved with this run (another run's file beside it)"
    if manifest.get("run_json_sha256") != meta_digest(meta):
        return "run.json was changed after it was saved (its digest differs)"
    return None


def check_steps(folder: Path, meta: Mapping[str, Any], steps: int) -> str | None:
    """The step count against the manifest's (None when they agree or there is no manifest)."""
    manifest = meta.get(MANIFEST_KEY) if isinstance(meta, Mapping) else None
    if isinstance(manifest, Mapping) and manifest.get("steps") is not None and manifest["steps"] != steps:
        return f"metrics.jsonl holds {steps} steps, its manifest says {manifest['steps']}"
    return None


def refuse(folder: Path, why: str) -> DamagedRunError:
    """The one-line refusal of a damaged run folder (``why`` kept as its attribute)."""
    error = DamagedRunError(f"run folder {folder} is damaged: {why}; train it again (or delete the folder)")
    error.why = why
    return error


def is_whole(folder: Path) -> bool:
    """Whether ``folder`` holds a run that its manifest proves whole (cheap: no parsing of metrics)."""
    try:
        meta = json.loads((Path(folder) / "run.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and problem(Path(folder), meta, required=True) is None


def check_target(target: Path) -> None:
    """Refuse (one line) a folder a run cannot be saved to: an existing file, or a folder holding
    anything but a run's files (a user's files are never replaced). A recorder checks its ``out``
    with this before training, so the refusal never comes after a run was recorded."""
    target = Path(target)
    if target.exists():
        if not target.is_dir():
            raise ConfigError(f"{target} is an existing file; a run is saved as a folder: give a folder path")
        foreign = sorted(p.name for p in target.iterdir() if p.name not in RUN_FILES)
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise ConfigError(
                f"{target} holds files that are not a run's ({shown}); a run replaces its folder "
                f"whole, so save it to a new or empty folder"
            )


def save_folder(target: Path, write: Callable[[Path], Any]) -> Path:
    """Write a run folder aside and move it into ``target`` whole. An existing ``target`` is
    replaced only if it holds nothing but a run's files (:data:`RUN_FILES`); one holding anything
    else is refused (one line) before anything is written."""
    target = Path(target)
    check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    old = None
    try:
        write(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
            os.replace(target, old / "run")
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not target.exists():  # put the old run back
            os.replace(old / "run", target)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def link_run(source: Path, target: Path) -> Path:
    """``target`` as a second name of the whole run folder ``source`` (a store entry): each file
    hard-linked (copied where the file system cannot link), written aside and moved into place, so
    the run's bytes are on disk once."""

    def write(folder: Path) -> None:
        for path in Path(source).iterdir():
            if path.is_file() and path.name in RUN_FILES:
                try:
                    os.link(path, folder / path.name)
                except OSError:  # another device, or links not supported
                    shutil.copy2(path, folder / path.name)

    return save_folder(Path(target), write)
