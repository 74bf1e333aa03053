"""Reports: panels (``panels``), two runs compared (``comparison``), a session's summary as
rows and Markdown (``summary``) and the self-contained HTML page (``page``). matplotlib is
imported only when a panel is drawn."""

from pytest_spikecheck.report.comparison import Comparison, compare, write_comparison
from pytest_spikecheck.report.panels import plot_attention, plot_grad_norm, plot_logits, plot_loss, plot_lr_sweep

__all__ = [
    "Comparison",
    "compare",
    "plot_attention",
    "plot_grad_norm",
    "plot_logits",
    "plot_loss",
    "plot_lr_sweep",
    "write_comparison",
]
