"""The fuzz layer: Hypothesis strategies over batch compositions and scenarios
(``strategies``) and the worst-batch search (``search``). Needs the ``fuzz`` extra."""
