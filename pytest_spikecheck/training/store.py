"""The run store: trained runs kept in a folder under a key that says what made them, shared by
processes through a file lock. The plugin's disk cache (``--spikecheck-report``), its once-per-session
sharing between xdist workers, and anything else that must not train the same run twice use it.

A run is reused only by the code that made it. Its key (:func:`run_key`) holds the scenario's
content hash, the clipping backend, device and thread count, the package version, a digest of the
package's source (every .py, .cu and C++ file, so an edit without a version bump still retrains),
the torch version, and for a ``model_factory`` a digest of its module's source. A factory whose
code cannot be told apart by its module (a lambda, a function defined inside another) gets a key
valid in its own process only (:attr:`RunKey.shareable` is false) and is never stored.

Nothing here imports torch: a store can be read (and tested) without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest_spikecheck
from pytest_spikecheck import __version__
from pytest_spikecheck.errors import ConfigError
from pytest_spikecheck.records.run import Run
from pytest_spikecheck.scenario import Scenario

#: The source files whose text decides what a run computes (the kernels' package data too).
_SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".hpp", ".cpp")
#: The provenance file an entry carries beside the run's own files.
PROVENANCE_FILE = "store.json"
#: How long a waiter sleeps between two tries of a held lock.
_POLL_SECONDS = 0.1
#: How long a lock may stay held after the pid that took it is gone before the waiter gives up.
_DEAD_OWNER_GRACE_SECONDS = 2.0


@functools.cache
def package_digest() -> str:
    """sha256 (first 12 hex digits) of the installed package's source files, with their paths,
    computed once per process. ``models`` and ``kernels`` install from top-level folders, so
    their locations are asked of the import system (without importing them: that needs torch)."""
    roots = [Path(pytest_spikecheck.__file__).parent]
    for sub in ("pytest_spikecheck.models", "pytest_spikecheck.kernels"):
        spec = importlib.util.find_spec(sub)
        roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    files = {
        f.resolve(): f"{root.name}/{f.relative_to(root).as_posix()}"
        for root in roots
        for f in root.rglob("*")
        if f.suffix in _SOURCE_SUFFIXES and f.is_file()
    }
    h = hashlib.sha256()
    for path, name in sorted(files.items(), key=lambda item: item[1]):
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def torch_version() -> str:
    """The installed torch's version, read from its metadata (importing torch takes seconds)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def model_factory_digest(factory: Any) -> tuple[str | None, str | None]:
    """(digest, None) for a factory whose code its module's source decides: sha256 of that source
    and the factory's qualified name; (None, why not) for one it does not: a lambda or a
    function defined inside another (``<locals>``: it may close over values), or code without
    a source file."""
    if isinstance(factory, str):  # an import path "package.module:function"
        module_name = factory.partition(":")[0]
        try:
            spec = importlib.util.find_spec(module_name)
        except ImportError:  # its package is missing: the training says so, with the path
            spec = None
        source = spec.origin if spec is not None else None
        if source is None or not Path(source).is_file():
            return None, f"model_factory {factory} has no source file to hash, so its runs are not cached on disk"
        return hashlib.sha256(Path(source).read_bytes() + b"\0" + factory.encode()).hexdigest()[:12], None
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    label = f"{getattr(factory, '__module__', '?')}.{name}"
    if "<lambda>" in name or "<locals>" in name:
        kind = "a lambda" if "<lambda>" in name else "defined inside a function"
        return None, (
            f"model_factory {label} is {kind}: its module's source does not tell it apart from "
            f"another, so its runs are not cached on disk nor shared between xdist workers (make it a "
            f"module-level def to cache them)"
        )
    module = sys.modules.get(getattr(factory, "__module__", None) or "")
    try:
        source = inspect.getsourcefile(module) if module is not None else None
    except TypeError:  # a built-in module
        source = None
    if source is None or not Path(source).is_file():
        return None, f"model_factory {label} has no source file to hash, so its runs are not cached on disk"
    digest = hashlib.sha256(Path(source).read_bytes() + b"\0" + label.encode()).hexdigest()[:12]
    return digest, None


@dataclass(frozen=True)
class RunKey:
    """What made a run (see the module docstring). ``tag`` is its folder name in a store."""

    tag: str
    #: why runs under this key cannot be stored or shared (None when they can)
    not_shareable_because: str | None = None

    @property
    def shareable(self) -> bool:
        return self.not_shareable_because is None


def run_key(scenario: Scenario, *, backend: str, device: str, threads: int) -> RunKey:
    """The key of ``scenario`` trained with a concrete clipping ``backend`` (``auto`` resolved),
    on ``device`` with ``threads`` torch threads. A factory that cannot be hashed is keyed by the
    object itself (``!`` marks such a key: valid in this process only, never stored)."""
    tag = f"{scenario.content_hash()}-{backend}-{device}-t{threads}-v{__version__}-src{package_digest()}-torch{torch_version()}"
    why = None
    if scenario.model_factory is not None:
        digest, why = model_factory_digest(scenario.model_factory)
        tag += f"-model{digest}" if digest is not None else f"-model!{id(scenario.model_factory):x}"
    return RunKey(tag, why)


@dataclass(frozen=True)
class Provenance:
    """Who stored an entry: the store's ``session`` and ``writer`` labels, the pid and host, and
    the scenario name the run was stored under."""

    session: str
    writer: str
    pid: int
    host: str
    name: str

    @classmethod
    def read(cls, entry: Path) -> Provenance:
        try:
            data = json.loads((entry / PROVENANCE_FILE).read_text())
        except (OSError, ValueError):  # an entry written before provenance was recorded
            return cls(session="", writer="", pid=0, host="", name="")
        return cls(**{f.name: data.get(f.name, "" if f.type == "str" else 0) for f in dataclasses.fields(cls)})


class RunStoreLockError(RuntimeError):
    """A lock that could not be had: its owner is gone but the lock is still held, or the wait
    ran out. The message is one line naming the owner's pid and the lock file."""


def atomic_dir_write(
    target: Path, write: Callable[[Path], Any], *, within: Path | None = None, owned_by: str | None = None
) -> None:
    """Write a folder next to ``target`` and move it into place (parallel writers may race).

    ``within``: the folder ``target`` must be a direct child of (the report's root): a target
    that is that root, or anywhere else, is refused before anything is written. ``owned_by``: the
    file that marks a folder as ours; an existing ``target`` without it (a user's file or folder
    of that name) is refused, never deleted."""
    if within is not None and Path(os.path.abspath(target)).parent != Path(os.path.abspath(within)):
        raise ConfigError(f"refusing to write {target}: it is not a folder inside {within}")
    if owned_by is not None and target.exists() and not (target / owned_by).is_file():
        raise ConfigError(
            f"{target} exists and was not written by spikecheck (no {owned_by} in it): not replacing "
            f"it; move it away or rename the scenario"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(tmp)
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.exists():
            raise


def _warn_stderr(message: str) -> None:
    print(f"spikecheck: {message}", file=sys.stderr, flush=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


class RunStore:
    """A folder of runs, one entry per key: ``ROOT/<key tag>/`` holds the run's files
    (:meth:`Run.save`) and ``store.json`` (its :class:`Provenance`); ``ROOT/.locks/`` holds one
    lock file per key. ``session`` and ``writer`` label what this store object writes (the plugin:
    the test session's id and the xdist worker), so a reader can tell an entry made in its own
    session from an older one.

    :meth:`get_or_make` is the once-only path: under the key's lock, the first process to ask
    makes and stores the run; the others wait, then load it. The lock is an OS file lock
    (``filelock``): the OS releases it when its holder dies, so a crashed holder never hangs the
    others. A waiter also reads the holder's pid from ``.locks/<tag>.owner``: a lock still held
    :data:`_DEAD_OWNER_GRACE_SECONDS` after that pid is gone (a forked child kept it), or a wait
    longer than ``lock_timeout`` seconds, raises :class:`RunStoreLockError` (one line)."""

    def __init__(
        self,
        root: str | Path,
        *,
        session: str = "",
        writer: str = "",
        lock_timeout: float = 3600.0,
        warn: Callable[[str], Any] | None = None,
    ) -> None:
        self.root = Path(root)
        self.session = session
        self.writer = writer
        self.lock_timeout = lock_timeout
        #: where the one line about a damaged entry goes (default: stderr)
        self.warn = warn if warn is not None else _warn_stderr

    def path(self, key: RunKey) -> Path:
        if not key.shareable:
            raise ValueError(f"a run keyed {key.tag} cannot be stored: {key.not_shareable_because}")
        return self.root / key.tag

    def get(self, key: RunKey) -> tuple[Run, Provenance] | None:
        """The stored run of ``key`` and who stored it, or None. An entry that fails its manifest
        (cut, edited, half-written by an older version) is None too, after one warning line: the
        caller trains the run again and its put() replaces the entry."""
        entry = self.path(key)
        if not entry.exists():
            return None
        try:
            return Run.load(entry, require_manifest=True), Provenance.read(entry)
        except ConfigError as exc:  # DamagedRunError, or a file no reader can parse
            why = getattr(exc, "why", "") or str(exc)
            self.warn(f"warning: the stored run {entry.name[:16]}… is not whole ({why}): training it again")
            return None

    def put(self, key: RunKey, run: Run) -> Path:
        """Store ``run`` under ``key`` (written aside, then moved into place whole)."""
        entry = self.path(key)
        provenance = Provenance(
            session=self.session, writer=self.writer, pid=os.getpid(), host=socket.gethostname(), name=str(run.name)
        )

        def write(folder: Path) -> None:
            run.save(folder)
            (folder / PROVENANCE_FILE).write_text(json.dumps(dataclasses.asdict(provenance), indent=2))

        atomic_dir_write(entry, write)
        return entry

    def get_or_make(self, key: RunKey, make: Callable[[], Run]) -> tuple[Run, Provenance | None]:
        """The stored run of ``key`` (with who stored it), or ``make()``'s run, stored, with None:
        under the key's lock, so concurrent callers make it once."""
        with self.lock(key):
            found = self.get(key)
            if found is not None:
                return found
            run = make()
            self.put(key, run)
            return run, None

    # -- claims: a sweep's promise to make a run, so another sweep on the same store waits for it ----
    def _claim_path(self, key: RunKey) -> Path:
        return self.root / ".locks" / f"{key.tag}.claim"

    def claim(self, key: RunKey) -> bool:
        """Claim ``key``: this process will make its run (True), unless another live process has
        claimed it (False). A claim is a file, not an open lock, so a sweep can hold one for each
        of its 10,000 points; one left by a process that is gone (same host) is taken over."""
        path = self._claim_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "session": self.session})
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if self.claimed_elsewhere(key):
                    return False
                with contextlib.suppress(OSError):
                    path.unlink()  # its owner is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(mine)
            return True
        return False

    def claimed_elsewhere(self, key: RunKey) -> bool:
        """Whether another process's claim on ``key`` stands (its owner alive, or on another host)."""
        owner = _read_owner(self._claim_path(key))
        if owner is None:
            return self._claim_path(key).exists() and time.time() - self._claim_path(key).stat().st_mtime < 5
        if owner.get("host") != socket.gethostname():
            return True
        return _pid_alive(int(owner["pid"])) and (owner["pid"] != os.getpid() or owner.get("session") != self.session)

    def release(self, key: RunKey) -> None:
        """Drop this process's claim on ``key`` (if it holds one)."""
        owner = _read_owner(self._claim_path(key))
        if owner is not None and owner["pid"] == os.getpid() and owner.get("session") == self.session:
            with contextlib.suppress(OSError):
                self._claim_path(key).unlink()

    def _lock_paths(self, key: RunKey) -> tuple[Path, Path]:
        folder = self.root / ".locks"
        return folder / f"{key.tag}.lock", folder / f"{key.tag}.owner"

    @contextlib.contextmanager
    def lock(self, key: RunKey) -> Iterator[None]:
        """Hold ``key``'s cross-process lock (see the class docstring)."""
        from filelock import FileLock, Timeout

        lock_path, owner_path = self._lock_paths(key)
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(lock_path)
        started = time.monotonic()
        owner_gone_since: float | None = None
        while True:
            try:
                lock.acquire(timeout=_POLL_SECONDS)
                break
            except Timeout:
                now = time.monotonic()
                owner = _read_owner(owner_path)
                local = owner is not None and owner.get("host") == socket.gethostname()
                if local and not _pid_alive(int(owner["pid"])):
                    owner_gone_since = owner_gone_since or now
                    if now - owner_gone_since > _DEAD_OWNER_GRACE_SECONDS:
                        raise RunStoreLockError(
                            f"run store lock {lock_path} is still held, but pid {owner['pid']} ({owner.get('writer') or '?'}) "
                            f"that took it is gone (a child process it forked may hold it): end that process or "
                            f"remove the lock file"
                        ) from None
                else:
                    owner_gone_since = None
                if now - started > self.lock_timeout:
                    who = (
                        f"pid {owner['pid']} ({owner.get('writer') or '?'}) on {owner.get('host')}"
                        if owner
                        else "another process"
                    )
                    raise RunStoreLockError(
                        f"waited {self.lock_timeout:g} s for run store lock {lock_path}, held by {who} still making {key.tag}"
                    ) from None
        try:
            owner_path.write_text(
                json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "writer": self.writer, "session": self.session})
            )
            yield
        finally:
            with contextlib.suppress(OSError):
                owner_path.unlink()
            lock.release()


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet (the holder is between acquire and write) or gone
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None
