"""The run store's key (the plugin's disk cache): code that changes gets a new key; code the key
cannot see is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spikecheck import Scenario
from pytest_spikecheck.training.store import RunStore, model_factory_digest, package_digest, run_key, torch_version

first_lambda = lambda vocab_size: None  # noqa: E731
second_lambda = lambda vocab_size: None  # noqa: E731


def module_level_factory(vocab_size):
    return None


def _key(scenario):
    return run_key(scenario, backend="torch", device="cpu", threads=1)


def test_lambdas_get_distinct_keys_and_no_disk_cache(tmp_path):
    base = Scenario.preset("phase-19")
    a, b = base.replace(model_factory=first_lambda), base.replace(model_factory=second_lambda)
    assert a.content_hash() == b.content_hash()  # the config cannot tell them apart...
    assert _key(a).tag != _key(b).tag  # ...the key can
    assert not _key(a).shareable and not _key(b).shareable
    with pytest.raises(ValueError, match="cannot be stored: model_factory .* is a lambda"):
        RunStore(tmp_path).path(_key(a))
    digest, why = model_factory_digest(first_lambda)
    assert digest is None and "is a lambda" in why and "module-level def" in why


def test_key_holds_the_source_digest_torch_version_and_the_factorys_module(tmp_path):
    scenario = Scenario.preset("phase-19").replace(model_factory=module_level_factory)
    digest, why = model_factory_digest(module_level_factory)
    assert why is None and len(digest) == 12
    key = _key(scenario)
    assert key.shareable and f"-src{package_digest()}-torch{torch_version()}-model{digest}" in key.tag
    assert key.tag.startswith(f"{scenario.content_hash()}-torch-cpu-t1-v")
    assert RunStore(tmp_path).path(key) == tmp_path / key.tag
    assert _key(Scenario.preset("phase-19")).tag.endswith(f"-torch{torch_version()}")


def test_package_digest_covers_models_and_kernels(monkeypatch):
    read: list[str] = []
    original = Path.read_bytes

    def spy(self):
        read.append(self.name)
        return original(self)

    package_digest.cache_clear()
    monkeypatch.setattr(Path, "read_bytes", spy)
    try:
        package_digest()
    finally:
        package_digest.cache_clear()
    assert {"gpt.py", "session.py", "store.py", "diagnosis.py"} <= set(read)
    assert any(name.endswith(".cu") for name in read)


def test_an_import_path_factory_is_keyed_by_its_module_source():
    digest, why = model_factory_digest("test_cache_key:module_level_factory")
    assert why is None and len(digest) == 12
    assert model_factory_digest("test_cache_key:first_lambda")[0] != digest  # the path is in the key
    assert model_factory_digest("no_such_package.models:make")[0] is None
