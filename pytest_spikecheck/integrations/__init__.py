"""Your trainer, recorded and broken like our own runs.

- :mod:`.recorder`: :class:`~.recorder.Recorder` (``pytest_spikecheck.record``), framework-free:
  a plain loop calls it around its clip and at the end of each step.
- :mod:`.burst`: :func:`~.burst.inject_burst`, a declared burst in your dataset, served in a
  planned order any DataLoader reads.
- :mod:`.hf`, :mod:`.lightning`: ``SpikecheckCallback`` for ``transformers.Trainer`` (extra
  ``[hf]``) and Lightning (extra ``[lightning]``), on the same recorder. Imported only when
  asked for: importing this package imports neither framework.
"""
