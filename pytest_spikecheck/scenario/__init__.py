"""The scenario layer: what decides a training run, as frozen data (no torch).

``spec`` holds :class:`Scenario`, its sections, the :class:`Break` base class and the YAML
codec; ``breaks`` the concrete breaks and defences; ``presets`` the named starting points.
Importing this package registers every break and preset.
"""

from pytest_spikecheck.scenario.spec import (
    BURST_CONTENTS,
    NEW_SOURCES,
    BASE_SOURCES,
    Break,
    BurstSpec,
    DataSpec,
    MixtureSpec,
    OptimizerSpec,
    RecordSpec,
    SamplerSpec,
    Scenario,
    ScheduleSpec,
    break_from_config,
    break_names,
    break_to_config,
    register_preset,
    scenario_preset_names,
)
from pytest_spikecheck.scenario.breaks import (  # noqa: E402  (registers the breaks)
    AdaptiveClip,
    BlankDocument,
    ClipAt,
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
    QKLayerNorm,
    ShardLocalNorm,
    SkipSpikes,
    StratifiedBatches,
    ZLoss,
)
from pytest_spikecheck.scenario.presets import PHASE19_BURST_STEP  # noqa: E402  (registers the presets)

__all__ = [
    "BURST_CONTENTS", "NEW_SOURCES", "PHASE19_BURST_STEP", "BASE_SOURCES", "AdaptiveClip", "BlankDocument", "Break",
    "BurstSpec", "ClipAt", "DataSpec", "HalfPrecision", "HighLR", "LayerNormEps0", "LogitSoftcap", "LeftPadding", "MaskPaddingKeys",
    "MixtureShift", "MixtureSpec", "NoClip", "NoWarmup", "NoWeightDecay", "OptimizerSpec", "QKLayerNorm", "RareTokenBurst",
    "RecordSpec", "SamplerSpec", "Scenario", "ScheduleSpec", "ShardLocalNorm", "SkipSpikes", "StratifiedBatches",
    "ZLoss", "break_from_config", "break_names", "break_to_config", "register_preset", "scenario_preset_names",
]
