"""TensorBoard event files (a file, or a folder holding them, read together in name order: a
run resumed into the same folder continues in a later file): scalar summaries, old
(``simple_value``) and new (tensor) style. Needs the ``tensorboard`` extra, imported only here."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.logs.base import LFS_POINTER, Column, Reader, Table, lfs_pointer_error

DESCRIPTION = "a TensorBoard event file (events.out.tfevents.*)"
TENSORBOARD_EXTRA = "pip install 'pytest-spikecheck[tensorboard]'"


def is_event_file(head: bytes) -> bool:
    """A TFRecord whose first record is an Event naming the file version ("brain.Event:2"):
    every TensorBoard writer (TF, torch, tensorboardX) starts a file so."""
    if len(head) < 12:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    return 0 < length < 1024 and b"brain.Event:" in head[12 : 12 + length]


def detect(path: Path, head: bytes) -> bool:
    return is_event_file(head)


def event_files(path: Path) -> list[Path]:
    if path.is_dir():
        # Names start "events.out.tfevents.<unix time>", so name order is write order.
        return sorted(p for p in path.iterdir() if p.is_file() and "tfevents" in p.name)
    return [path]


def _complete_records(file: Path, data: bytes, masked_crc32c: Any) -> tuple[int, bool]:
    """(number of complete TFRecord frames, whether they end exactly at the end of the file).
    A length whose checksum fails is corruption, not a file cut short."""
    offset = count = 0
    while offset + 12 <= len(data):
        header = data[offset : offset + 8]
        if struct.unpack_from("<I", data, offset + 8)[0] != masked_crc32c(header):
            raise ConfigError(f"{file}: record {count + 1} is corrupt (length checksum mismatch); expected {DESCRIPTION}")
        end = offset + 12 + struct.unpack("<Q", header)[0] + 4  # length, its CRC, the event, its CRC
        if end > len(data):
            break
        offset, count = end, count + 1
    return count, offset == len(data)


def read(path: Path) -> Table:
    files = event_files(path)
    contents = {file: file.read_bytes() for file in files}
    for file, data in contents.items():
        if data.startswith(LFS_POINTER):
            raise lfs_pointer_error(file)
        if not is_event_file(data[:2048]):
            raise ConfigError(f"{file}: not a TensorBoard event file; expected {DESCRIPTION}")
    try:
        from tensorboard import data_compat
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
        from tensorboard.util import tensor_util
    except ImportError:
        raise ConfigError(f"{path}: reading TensorBoard event files needs the tensorboard package: {TENSORBOARD_EXTRA}") from None

    steps: list[int] = []
    rows: list[dict[str, float]] = []
    wheres: list[str] = []
    notes: list[str] = []
    scalar_tags: set[str] = set()
    for file, data in contents.items():
        complete, ends_cleanly = _complete_records(file, data, masked_crc32c)
        # The loader checks every record's CRC and stops quietly at the first bad one, as
        # TensorBoard does for a file still being written; counting frames tells us where.
        read_count = 0
        for read_count, raw in enumerate(RawEventFileLoader(str(file)).Load(), 1):
            # migrate_event turns old-style simple_value scalars into the tensor form.
            event = data_compat.migrate_event(event_pb2.Event.FromString(raw))
            values = {}
            for value in event.summary.value:
                plugin = value.metadata.plugin_data.plugin_name
                # Writers may attach the metadata only to a tag's first value.
                if plugin == "scalars":
                    scalar_tags.add(value.tag)
                elif plugin or value.tag not in scalar_tags:
                    continue
                array = tensor_util.make_ndarray(value.tensor)
                if array.size == 1 and array.dtype.kind in "fiu":
                    values[value.tag] = float(array.reshape(-1)[0])
            if values:
                steps.append(int(event.step))
                rows.append(values)
                wheres.append(f"{file.name} record {read_count}")
        if read_count < complete:
            raise ConfigError(
                f"{file}: record {read_count + 1} of {complete} is corrupt (event checksum mismatch); expected {DESCRIPTION}"
            )
        if not ends_cleanly:
            notes.append(
                f"{file.name} ends in a partly written record (the writer stopped mid-write); "
                f"the {complete} complete records before it were read"
            )
    if not rows:
        raise ConfigError(
            f"{path}: no scalar summaries in {len(files)} event file{'s' if len(files) != 1 else ''}; "
            f"expected {DESCRIPTION} with logged scalars"
        )
    tags = dict.fromkeys(t for r in rows for t in r)
    columns = {tag: Column.of([r.get(tag) for r in rows]) for tag in tags}
    return Table(np.asarray(steps, dtype=np.int64), columns, wheres.__getitem__, notes)


READER = Reader("tensorboard", DESCRIPTION, detect, read, steps_own="a TensorBoard event carries its own step", folder=True)
