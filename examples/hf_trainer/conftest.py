"""A downstream repository's pattern: train YOUR Hugging Face model once per session (and once
per configuration on disk, in pytest's cache), with and without the Trainer's clip, a burst
injected into YOUR data, and hand the recorded runs to the tests. Only under
``pytest --spikecheck``: the tests carry the ``spikecheck`` marker, which the plugin skips
without the flag, and the fixtures train only when a test asks for them.

Replace ``my_dataset``/``my_model`` with yours; the rest stays.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from pytest_spikecheck import RareTokenBurst, Run, SampleCatalog, Scenario, inject_burst
from pytest_spikecheck.data.dataset import build_dataset
from pytest_spikecheck.models.config import IGNORE_INDEX

BURST_STEP, STEPS, BATCH, MAX_NORM = 30, 40, 8, 1.0


def my_dataset():
    """Rows for a causal LM plus the rows to inject. Here: our corpus and three Greek sentences."""
    data = build_dataset(Scenario.preset("phase-19").with_breaks(RareTokenBurst(count=3, at_step=BURST_STEP)).resolved())
    full = np.concatenate([data.train.inputs[:, :1], data.train.targets], axis=1)
    ids = np.where(full == IGNORE_INDEX, data.tokenizer.pad_id, full)
    rows = [{"input_ids": ids[i], "labels": full[i]} for i in range(len(full))]
    catalog = SampleCatalog.from_tokens(
        list(data.train.targets),
        vocab_size=data.tokenizer.vocab_size,
        ids=[s.id for s in data.pool],
        sources=[s.source for s in data.pool],
        token_str=data.tokenizer.token,
        rarity_excludes=data.burst_members[0],
    )
    return rows, catalog, list(data.burst_members[0]), data.tokenizer


def my_config(tokenizer):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=tokenizer.eos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def my_model(tokenizer):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(my_config(tokenizer))


def train_recorded(folder, max_grad_norm: float) -> Run:
    from transformers import Trainer, TrainingArguments

    from pytest_spikecheck.integrations.hf import SpikecheckCallback

    rows, catalog, burst, tokenizer = my_dataset()
    stream = inject_burst(rows, samples=burst, at_step=BURST_STEP, count=3, batch_size=BATCH, steps=STEPS)
    callback = SpikecheckCallback(folder, catalog=catalog, stream=stream)
    # the Trainer's own output beside the run folder, not in it: a run folder holds only the run's files
    args = TrainingArguments(
        output_dir=str(folder.with_name(folder.name + "-trainer")),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-2,
        warmup_steps=10,
        lr_scheduler_type="cosine",
        weight_decay=0.1,
        max_grad_norm=max_grad_norm,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models train many times faster on one thread
    try:
        Trainer(model=my_model(tokenizer), args=args, train_dataset=stream, callbacks=[callback]).train()
    finally:
        torch.set_num_threads(threads)
    return Run.load(folder)


def _cached(request, name: str, max_grad_norm: float) -> Run:
    """Trained once per configuration: the run folder lives in pytest's cache under a key of
    everything that changes the result (add yours: data version, training arguments)."""
    import transformers

    tokenizer = my_dataset()[3]
    key = hashlib.sha256(
        json.dumps(
            [
                name,
                max_grad_norm,
                STEPS,
                BURST_STEP,
                my_config(tokenizer).to_json_string(),
                transformers.__version__,
                torch.__version__,
            ]
        ).encode()
    ).hexdigest()[:12]
    folder = request.config.cache.mkdir(f"spikecheck-{name}-{key}")
    if (folder / "metrics.jsonl").is_file():
        return Run.load(folder)
    return train_recorded(folder, max_grad_norm)


@pytest.fixture(scope="session")
def hf_control(request):
    return _cached(request, "hf-control", MAX_NORM)


@pytest.fixture(scope="session")
def hf_break(request):
    return _cached(request, "hf-break", 0.0)  # max_grad_norm=0: the Trainer's NoClip
