"""The judge layer: detectors, spike/recovery measures, the diagnosis ladder and the
assertions, on :class:`~pytest_spikecheck.records.Record` s (numpy only: never torch, never
the training layer).

``text`` renders numbers and tables; ``detectors`` holds the named spike detectors;
``analysis`` the measures (spike ratio, recovery, event summaries); ``diagnosis`` walks Seed
A's ladder; ``assertions`` are the public checks.
"""
