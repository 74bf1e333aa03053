"""The model under test: a tiny language model written the way a downstream repo would write
its own. spikecheck only needs ``make_model(vocab_size, **kwargs) -> torch.nn.Module`` whose
forward takes token ids (and, here, targets) and returns ``(logits, loss)``."""

import torch
import torch.nn.functional as F

from pytest_spikecheck import IGNORE_INDEX


class TinyLM(torch.nn.Module):
    def __init__(self, vocab_size: int, width: int = 32, context: int = 32) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab_size, width)
        self.pos = torch.nn.Embedding(context, width)
        self.mix = torch.nn.Sequential(
            torch.nn.LayerNorm(width), torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )
        self.head = torch.nn.Linear(width, vocab_size)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        # A causal running mean lets each position see the tokens before it.
        x = x.cumsum(1) / torch.arange(1, idx.size(1) + 1, device=idx.device).view(1, -1, 1)
        logits = self.head(x + self.mix(x))
        if targets is None:
            return logits, None
        # spikecheck pads with IGNORE_INDEX (-100, torch's default): padding adds nothing to the loss.
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=IGNORE_INDEX)
        return logits, loss


def make_model(vocab_size: int, width: int = 32) -> TinyLM:
    return TinyLM(vocab_size, width)
