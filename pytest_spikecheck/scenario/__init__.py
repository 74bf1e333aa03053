"""The scenario layer: what decides a training run, as frozen data (no torch).

One job per module: ``sections`` (the frozen section specs and their checks), ``spec`` (the
:class:`Scenario` type: replace, with_breaks, resolved, content hash), ``config`` (the YAML
codec), ``naming`` (derived names), ``break_base`` (the :class:`Break` base class and its
registry) beside ``breaks`` (the concrete breaks and defences), ``preset_registry`` beside
``presets`` (the named starting points). Importing this package registers every break and preset.
"""

from pytest_spikecheck.scenario.break_base import Break, break_from_config, break_names, break_to_config
from pytest_spikecheck.scenario.preset_registry import register_preset, scenario_preset_names
from pytest_spikecheck.scenario.sections import (
    BASE_SOURCES,
    AmpSpec,
    BURST_CONTENTS,
    NEW_SOURCES,
    BurstSpec,
    ClipSpec,
    DataSpec,
    MixtureSpec,
    OptimizerSpec,
    RecordSpec,
    SamplerSpec,
    ScheduleSpec,
)
from pytest_spikecheck.scenario.spec import Scenario
from pytest_spikecheck.scenario.breaks import (  # noqa: E402  (registers the breaks)
    AccumulateSum,
    AdaptiveClip,
    BlankDocument,
    ClipAt,
    ClipBeforeUnscale,
    ClipEachMicrobatch,
    GatedAttention,
    HalfPrecision,
    HighLR,
    LayerNormEps0,
    LogitSoftcap,
    LeftPadding,
    MaskPaddingKeys,
    MixtureShift,
    NoClip,
    NoWarmup,
    NoWeightDecay,
    RareTokenBurst,
    QKClip,
    QKLayerNorm,
    ShardLocalNorm,
    SkipSpikes,
    StratifiedBatches,
    ZLoss,
)
from pytest_spikecheck.scenario.presets import PHASE19_BURST_STEP  # noqa: E402  (registers the presets)

__all__ = [
    "BURST_CONTENTS",
    "NEW_SOURCES",
    "PHASE19_BURST_STEP",
    "BASE_SOURCES",
    "AccumulateSum",
    "AdaptiveClip",
    "AmpSpec",
    "BlankDocument",
    "Break",
    "BurstSpec",
    "ClipAt",
    "ClipSpec",
    "ClipBeforeUnscale",
    "ClipEachMicrobatch",
    "DataSpec",
    "GatedAttention",
    "HalfPrecision",
    "HighLR",
    "LayerNormEps0",
    "LogitSoftcap",
    "LeftPadding",
    "MaskPaddingKeys",
    "MixtureShift",
    "MixtureSpec",
    "NoClip",
    "NoWarmup",
    "NoWeightDecay",
    "OptimizerSpec",
    "QKClip",
    "QKLayerNorm",
    "RareTokenBurst",
    "RecordSpec",
    "SamplerSpec",
    "Scenario",
    "ScheduleSpec",
    "ShardLocalNorm",
    "SkipSpikes",
    "StratifiedBatches",
    "ZLoss",
    "break_from_config",
    "break_names",
    "break_to_config",
    "register_preset",
    "scenario_preset_names",
]
