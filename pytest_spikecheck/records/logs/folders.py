"""Which logs a folder holds: its own, else those one level down in the usual layouts."""

from __future__ import annotations

from pathlib import Path

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs import mlflow, registry

_FOLDER_LOGS = (("trainer_state.json", "hf-trainer"), ("metrics.csv", "lightning"), ("metrics.jsonl", "jsonl"))


def _logs_here(folder: Path) -> list[tuple[str, Path]]:
    if mlflow.is_run(folder):
        return [("mlflow", folder)]
    found = [("tensorboard", folder)] if any("tfevents" in p.name for p in folder.iterdir() if p.is_file()) else []
    return found + [(fmt, folder / name) for name, fmt in _FOLDER_LOGS if (folder / name).is_file()]


def _checkpoint_number(folder: Path) -> int | None:
    number = folder.name.removeprefix("checkpoint-")
    return int(number) if folder.name.startswith("checkpoint-") and number.isdigit() else None


def _mlflow_runs(folder: Path) -> list[Path]:
    """The runs of an MLflow experiment folder, or of every experiment of an ``mlruns`` root
    (deleted runs, ``.trash`` and registered ``models`` left out)."""

    def runs_of(experiment: Path) -> list[Path]:
        return sorted(
            p
            for p in experiment.iterdir()
            if p.is_dir() and mlflow.is_run(p) and "lifecycle_stage: deleted" not in (p / "meta.yaml").read_text(errors="replace")
        )

    if mlflow.is_experiment(folder):
        return runs_of(folder)
    experiments = sorted(
        p
        for p in folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name != "models" and mlflow.is_experiment(p)
    )
    return [run for experiment in experiments for run in runs_of(experiment)]


def find_logs(folder: str | Path) -> list[Path]:
    """The logs a folder holds: its own (TensorBoard event files, read together; an MLflow run;
    a trainer_state.json; a metrics.csv; a metrics.jsonl), else those one level down in the
    usual layouts: an HF ``output_dir``'s latest ``checkpoint-N/trainer_state.json`` (each
    checkpoint's state holds the whole history up to it), every ``lightning_logs/version_*``,
    every ``runs/*`` run, and every run of an MLflow experiment or ``mlruns`` root. A path per
    log (a folder for TensorBoard event files and MLflow runs)."""
    folder = Path(folder)
    here = _logs_here(folder)
    if here:
        if len(here) > 1:
            raise ConfigError(f"{folder}: holds several logs ({', '.join(f'{fmt}: {p.name}' for fmt, p in here)}); name the file")
        return [here[0][1]]
    runs = _mlflow_runs(folder)
    if runs:
        return runs
    subfolders = sorted((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.name)
    checkpoints = [p for p in subfolders if _checkpoint_number(p) is not None and (p / "trainer_state.json").is_file()]
    found = [max(checkpoints, key=_checkpoint_number) / "trainer_state.json"] if checkpoints else []
    for sub in subfolders:
        if _checkpoint_number(sub) is None:
            logs = _logs_here(sub)
            if len(logs) == 1:
                found.append(logs[0][1])
    if not found:
        raise ConfigError(
            f"{folder}: a folder with no training log; expected TensorBoard event files, an MLflow run, "
            f"trainer_state.json, metrics.csv or metrics.jsonl in it or one level down "
            f"(checkpoint-*/, version_*/, runs/*/, an mlruns experiment)"
        )
    return found


def log_in_folder(folder: Path) -> tuple[str, Path]:
    """The one log a folder holds (:func:`find_logs`); several: name one."""
    logs = find_logs(folder)
    if len(logs) > 1:
        shown = ", ".join(str(p.relative_to(folder)) for p in logs[:6]) + (", ..." if len(logs) > 6 else "")
        raise ConfigError(f"{folder}: holds {len(logs)} logs ({shown}); name one (`spikecheck check` checks each)")
    log = logs[0]
    if log.is_dir():
        return ("mlflow" if mlflow.is_run(log) else "tensorboard"), log
    fmt = dict((name, fmt) for name, fmt in _FOLDER_LOGS)[log.name]
    return ("csv" if fmt == "lightning" and registry.detect(log) == "csv" else fmt), log
