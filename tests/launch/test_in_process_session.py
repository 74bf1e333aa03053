"""A pytester session run in process, under ``filterwarnings = error`` (this repo's setting): it
registers the plugins for assertion rewriting again, which fails if the package was imported
unrewritten first. ``test_launchers.py`` runs this file (kept apart from tests/plugin, whose conftest imports torch) under the ``pytest`` script as well."""

from __future__ import annotations


def test_an_in_process_session_loads_the_plugin_cleanly(pytester):
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=1)
