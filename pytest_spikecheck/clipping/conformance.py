"""Conformance kit: check any global-L2 gradient-clipping function against a float64 reference.

A clip function takes a list of gradient tensors (or numpy arrays) and ``max_norm``, clips the
tensors in place and returns ``(pre-clip total norm, scale applied)``, each anything ``float()``
accepts (a 0-d tensor, a numpy scalar, a float)::

    from pytest_spikecheck.clipping.conformance import check_clip_function

    def my_clip(grads, max_norm):
        norm, scale = my_kernels.clip(grads, max_norm)
        return norm, scale

    def test_my_clip_kernel_conforms():
        check_clip_function(my_clip, dtypes=("float32", "bfloat16"), device="cuda")

:func:`check_clip_function` first runs the fixed :func:`edge_cases`, then Hypothesis-fuzzed
:func:`clip_cases`, and raises :class:`ConformanceError` (an AssertionError) at the first case
that breaks the contract below. :func:`check_backend` does the same for one of this package's
backends by name. The pieces work alone too: :func:`check_case` checks one :class:`ClipCase`
(e.g. :func:`every_value_case`, every finite float16 or bfloat16 value in one tensor),
:func:`clip_cases` is a strategy to use in your own ``@given`` tests, :func:`reference_clip` is
the float64 reference and :func:`model_gradient_shapes` gives the gradient shapes of this
package's model presets (ANDREA-120M: 149 tensors, 98M parameters).

The contract (torch.nn.utils.clip_grad_norm_'s, plus its non-finite rule):

- ``norm = sqrt(sum of g**2)`` over every element, compared with a float64 reference within
  ``Tolerances.norm_rtol`` (1e-4 by default); when the function returns its norm as a 16-bit
  tensor (torch does for 16-bit gradients), 2 units in the last place of that dtype are allowed
  on top.
- ``scale = min(1, max_norm / (norm + 1e-6))``, within twice the norm's relative tolerance plus
  1e-6 (plus 2 units of rounding when the scale is a 16-bit tensor).
- Each clipped element is ``g * scale`` (the scale the function reported) rounded to float32 and
  then to the gradient dtype, within ``Tolerances.element_ulps`` units in the last place of that
  dtype. With ``allow_flush_to_zero``, results below float32's smallest normal (1.2e-38) may be
  0, as kernels compiled with -ftz produce.
- A reported scale of exactly 1 and ``max_norm = inf`` leave every gradient bitwise untouched
  ("untouched" allows a NaN to come back with another NaN payload).
- A non-finite norm (any inf or NaN element) is reported as NaN when any element is NaN, else
  +inf, and -- the rule of ``pytest_spikecheck.clipping``, with ``nonfinite="untouched"`` -- the
  gradients stay bitwise untouched and the scale is 1. ``nonfinite="torch"`` checks the norm only
  (torch multiplies the gradients by NaN).

The fuzzed values keep the sum of squares far below float32's overflow (norms up to ~1e7):
like torch, float32-accumulating kernels overflow to inf near norm 1.8e19, where the float64
reference does not. Sizes cluster around powers of two (block, warp and chunk boundaries); pass
``boundary_sizes`` for a kernel whose chunking differs, and shrink your kernel's chunk size in a
test to reach "more chunks than threads" within ``max_total_elements``.

Import cost: this module imports numpy only. Hypothesis is imported inside :func:`clip_cases`
and :func:`check_clip_function`, torch when torch tensors are made; the pytest plugin never
imports this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "DEFAULT_BOUNDARY_SIZES",
    "DTYPES",
    "ClipCase",
    "ConformanceError",
    "ConformanceReport",
    "ReferenceClip",
    "Tolerances",
    "check_backend",
    "check_case",
    "check_clip_function",
    "clip_cases",
    "edge_cases",
    "every_value_case",
    "model_gradient_shapes",
    "reference_clip",
]

#: Must match pytest_spikecheck.clipping.CLIP_EPS (not imported, to keep this module standalone
#: for other repos' kernels; a test checks the two agree).
CLIP_EPS = 1e-6

#: Gradient dtypes the kit can make: mantissa bits and smallest normal exponent of each.
DTYPES = {"float32": (23, -126), "float16": (10, -14), "bfloat16": (7, -126)}

#: Sizes around every power of two up to 2**17 (so around warp, block, chunk boundaries), plus 0.
DEFAULT_BOUNDARY_SIZES = (0, 1) + tuple(sorted({2**k + d for k in range(1, 18) for d in (-1, 0, 1)}))

DEFAULT_MAX_TOTAL_ELEMENTS = 200_000
DEFAULT_MAX_TENSORS = 8
DEFAULT_MAX_EXAMPLES = 50
FLOAT32_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)

# Per-tensor magnitude of the fuzzed values. float16 stays below 10 so a 200k-element norm stays
# far from float16's 65504 (torch returns float16 norms for float16 gradients).
_MAGNITUDES = {
    "float32": (1e-6, 1e-3, 1.0, 1e2, 1e4),
    "float16": (1e-6, 1e-3, 1.0, 10.0),
    "bfloat16": (1e-6, 1e-3, 1.0, 1e2, 1e4),
}
_SPECIAL_VALUES = (math.inf, -math.inf, math.nan, 0.0)
_VALUE_KINDS = ("normal", "uniform", "constant", "sparse")
#: How a case's max_norm is set: a ratio of its norm, exactly its norm, or an absolute value.
_MAX_NORM_RULES = ("ratio", "exact", "absolute")
_MAX_NORM_RATIOS = (1e-3, 0.5, 0.999, 1.001, 2.0, 1e3)


class ConformanceError(AssertionError):
    """A clip function broke the contract on a case; the message says how and on which case."""


@dataclass(frozen=True)
class Tolerances:
    """How close a clip function must come to the float64 reference (see the module docstring)."""

    #: Relative error of the norm. torch's CPU reduction of 200k equal float32 values drifts by
    #: ~2e-5; clip.cu's blocked float32 sums stay below 2e-6. A plain sequential float32 loop
    #: over 200k elements may exceed 1e-4: loosen this or accumulate in float64.
    norm_rtol: float = 1e-4
    #: Clipped elements may differ from round(g * scale) by this many units in the last place of
    #: their dtype. 1 allows rounding g * scale straight to float16 instead of through float32;
    #: 0 demands exactly torch's arithmetic.
    element_ulps: float = 1.0
    #: Accept 0 where g * scale is below float32's smallest normal (GPU code built with -ftz).
    allow_flush_to_zero: bool = True


@dataclass(frozen=True)
class ReferenceClip:
    """The float64 reference result: pre-clip norm, scale, clipped values, non-finite flag."""

    total_norm: float
    scale: float
    clipped: list[np.ndarray]
    nonfinite: bool


def reference_clip(arrays: Sequence[Any], max_norm: float, *, eps: float = CLIP_EPS) -> ReferenceClip:
    """Global-L2 clipping in float64, the way the kit expects a kernel to behave.

    ``arrays`` are array-likes of any float dtype; ``max_norm`` may be ``inf`` (no clipping).
    A NaN or inf norm leaves the values untouched (scale 1).
    """
    values = [np.asarray(a, dtype=np.float64) for a in arrays]
    total_norm = math.sqrt(sum(float(np.sum(np.square(v))) for v in values))
    nonfinite = not math.isfinite(total_norm)
    if nonfinite or math.isinf(max_norm):
        scale = 1.0
    else:
        scale = min(1.0, max_norm / (total_norm + eps))
    return ReferenceClip(total_norm, scale, [v * scale for v in values], nonfinite)


@dataclass(frozen=True, repr=False)
class ClipCase:
    """One set of gradients and a ``max_norm``. ``values`` are float32 arrays holding values that
    are exact in ``dtype`` (fresh tensors are made from them for every call)."""

    values: tuple[np.ndarray, ...]
    dtype: str
    max_norm: float
    label: str = field(default="", compare=False)

    def __repr__(self) -> str:  # Hypothesis prints falsifying examples with this: keep it short
        return f"ClipCase({self.describe()})"

    def describe(self) -> str:
        shapes = [tuple(v.shape) for v in self.values]
        shown = ", ".join(str(s) for s in shapes[:6]) + (", ..." if len(shapes) > 6 else "")
        what = f"{len(shapes)} {self.dtype} tensor{'s' if len(shapes) != 1 else ''} [{shown}]"
        label = f"{self.label}: " if self.label else ""
        return f"{label}{what}, {sum(v.size for v in self.values)} elements, max_norm={self.max_norm!r}"


@dataclass(frozen=True)
class ConformanceReport:
    """What :func:`check_clip_function` ran: fixed edge cases and fuzzed cases, all passed."""

    edge_cases: int
    fuzzed_cases: int


# ---------------------------------------------------------------------------------------------
# Values in a dtype


def _round_to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64/float32 values -> float32 array of the nearest ``dtype`` values (ties to even)."""
    as_f32 = np.asarray(values, dtype=np.float64).astype(np.float32)
    if dtype == "float32":
        return as_f32
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return as_f32.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = as_f32.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
        nan = np.isnan(as_f32)
        rounded[nan] = as_f32.view(np.uint32)[nan] | 0x00400000
        return rounded.view(np.float32)
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, was {dtype!r}")


def _ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype`` at each (finite) value: 2**(exponent - mantissa bits)."""
    mantissa_bits, min_exponent = DTYPES[dtype]
    _, exponent = np.frexp(np.abs(values))  # |v| = f * 2**exponent, f in [0.5, 1)
    exponent = np.maximum(exponent - 1, min_exponent)
    return np.ldexp(1.0, exponent - mantissa_bits)


def _random_values(rng: np.random.Generator, size: int, kind: str, magnitude: float) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(size) * magnitude
    if kind == "uniform":
        return rng.uniform(-magnitude, magnitude, size)
    if kind == "constant":
        return np.full(size, magnitude)
    if kind != "sparse":
        raise ValueError(f"value kind must be one of {', '.join(_VALUE_KINDS)}, was {kind!r}")
    # "sparse": mostly zeros and a few large entries, like one rare token's embedding row
    values = np.zeros(size)
    hits = rng.choice(size, size=max(1, size // 100), replace=False) if size else []
    values[hits] = rng.standard_normal(len(hits)) * magnitude * 30
    return values


def _make_case(
    shapes: Sequence[tuple[int, ...]],
    dtype: str,
    seed: int,
    kinds: Sequence[str],
    magnitudes: Sequence[float],
    specials: Sequence[tuple[int, float, float]],
    max_norm_rule: tuple[str, float],
    label: str = "",
) -> ClipCase:
    rng = np.random.default_rng(seed)
    arrays = []
    for index, shape in enumerate(shapes):
        size = math.prod(shape)
        raw = _random_values(rng, size, kinds[index % len(kinds)], magnitudes[index % len(magnitudes)])
        arrays.append(_round_to_dtype(raw, dtype).reshape(shape))
    for tensor, position, value in specials:
        nonempty = [a for a in arrays if a.size]
        if nonempty:
            target = nonempty[tensor % len(nonempty)].reshape(-1)
            target[min(int(position * target.size), target.size - 1)] = value
    norm = reference_clip(arrays, math.inf).total_norm
    rule, amount = max_norm_rule
    if rule == "ratio":
        max_norm = amount * norm if math.isfinite(norm) and norm > 0 else 1.0
    elif rule == "exact":
        max_norm = norm if math.isfinite(norm) else 1.0
    elif rule == "absolute":  # which also covers 0 and inf
        max_norm = amount
    else:
        raise ValueError(f"max_norm rule must be one of {', '.join(_MAX_NORM_RULES)}, was {rule!r}")
    return ClipCase(tuple(arrays), dtype, float(max_norm), label)


def edge_cases(dtype: str = "float32", max_total_elements: int = DEFAULT_MAX_TOTAL_ELEMENTS) -> list[ClipCase]:
    """The cases every clip function must pass, in every run (before any fuzzing)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, was {dtype!r}")
    normal = ("normal",)
    ratio = ("ratio", 0.5)
    cases = [
        _make_case([(1,)], dtype, 1, ("constant",), (3.0,), (), ("absolute", 1.0), "one element"),
        _make_case([(1,)], dtype, 2, normal, (1.0,), (), ("exact", 0.0), "one element, norm == max_norm"),
        _make_case(
            [(1,), (3,), (7,), (9,), (31,), (33,), (257,), (1023,), (0,)],
            dtype,
            3,
            normal,
            (1.0,),
            (),
            ratio,
            "sizes off the warp/block/pack boundaries",
        ),
        _make_case([(0,), (0, 3)], dtype, 4, normal, (1.0,), (), ("absolute", 1.0), "only empty tensors"),
        _make_case([(5,), (64,)], dtype, 5, ("constant",), (0.0,), (), ("absolute", 1.0), "all zeros"),
        _make_case([(100,), (37, 3)], dtype, 6, normal, (1.0,), (), ("absolute", math.inf), "max_norm inf"),
        _make_case([(100,), (37, 3)], dtype, 7, normal, (1.0,), (), ("absolute", 0.0), "max_norm 0"),
        _make_case([(64, 8), (8,)], dtype, 8, normal, (1.0,), (), ("exact", 0.0), "norm == max_norm"),
        _make_case([(50,), (20,)], dtype, 9, normal, (1.0,), ((0, 0.5, math.inf),), ratio, "one inf"),
        _make_case([(50,), (20,)], dtype, 10, normal, (1.0,), ((1, 0.0, -math.inf),), ratio, "one -inf"),
        _make_case([(50,), (20,)], dtype, 11, normal, (1.0,), ((0, 0.1, math.inf), (1, 0.9, math.nan)), ratio, "inf and NaN"),
        _make_case(
            [(97, 48), (48,), (48, 144), (1, 48)],
            dtype,
            12,
            ("normal", "normal", "normal", "sparse"),
            (1e-2, 1e-3, 1e-2, 1.0),
            (),
            ("absolute", 1.0),
            "heterogeneous shapes with a spiking row",
        ),
        _make_case(
            [(16_385,), (16_383,), (65_537,)], dtype, 13, normal, (1.0,), (), ratio, "several chunks of 16384 and ragged ends"
        ),
        _make_case([(300,)], dtype, 14, normal, (1e-6,), (), ("absolute", 1e-7), "tiny values, clipped"),
    ]
    return [case for case in cases if sum(v.size for v in case.values) <= max_total_elements]


def every_value_case(dtype: str) -> ClipCase:
    """One tensor holding every finite value of a 16-bit dtype (subnormals included), with
    ``max_norm`` at 0.3 x its norm: checks a kernel's conversions to and from float32 and its
    rounding of every product. bfloat16 keeps |x| < 2**56 so float32 squares cannot overflow."""
    patterns = np.arange(2**16, dtype=np.uint32)
    if dtype == "float16":
        values = patterns.astype(np.uint16).view(np.float16).astype(np.float32)
        values = values[np.isfinite(values)]
    elif dtype == "bfloat16":
        values = (patterns << 16).view(np.float32)
        values = values[np.isfinite(values) & (np.abs(values) < 2.0**56)]
    else:
        raise ValueError(f"dtype must be 'float16' or 'bfloat16', was {dtype!r}")
    norm = reference_clip([values], math.inf).total_norm
    return ClipCase((values,), dtype, 0.3 * norm, f"every finite {dtype} value")


def model_gradient_shapes(preset: str, *, vocab_size: int | None = None) -> list[tuple[int, ...]]:
    """The shape of every parameter (so of every gradient) of a ``pytest_spikecheck.models``
    preset, e.g. ``"andrea-120m"``; built on torch's meta device, so it allocates nothing.
    ``vocab_size`` overrides the preset's (the small presets take theirs from the tokenizer)."""
    import dataclasses

    import torch

    from pytest_spikecheck.models.config import model_preset
    from pytest_spikecheck.models.gpt import GPT

    config = model_preset(preset)
    if vocab_size is not None:
        config = dataclasses.replace(config, vocab_size=vocab_size)
    with torch.device("meta"):
        model = GPT(config)
    return [tuple(parameter.shape) for parameter in model.parameters()]


def clip_cases(
    dtypes: Sequence[str] = ("float32",),
    *,
    max_total_elements: int = DEFAULT_MAX_TOTAL_ELEMENTS,
    max_tensors: int = DEFAULT_MAX_TENSORS,
    boundary_sizes: Sequence[int] = DEFAULT_BOUNDARY_SIZES,
) -> SearchStrategy[ClipCase]:
    """A Hypothesis strategy of :class:`ClipCase`: 1..``max_tensors`` tensors of mixed shapes
    (sizes near ``boundary_sizes``, empty ones, matrices, 3-d), normal / uniform / constant /
    sparse values with a magnitude per tensor, sometimes inf / NaN / 0 entries, and ``max_norm``
    below, at, above the norm, 0 or inf. At most ``max_total_elements`` elements in all."""
    from hypothesis import strategies as st

    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, was {dtype!r}")
    sizes = st.one_of(st.sampled_from(tuple(boundary_sizes)), st.integers(0, 5000))
    shapes = st.one_of(
        sizes.map(lambda n: (n,)),
        st.tuples(st.integers(1, 400), st.integers(1, 400)),
        st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6)),
    )
    specials = st.one_of(
        st.just(()),
        st.lists(
            st.tuples(st.integers(0, max_tensors), st.floats(0, 1), st.sampled_from(_SPECIAL_VALUES)), min_size=1, max_size=3
        ).map(tuple),
    )
    max_norm_rules = st.one_of(
        st.tuples(st.just("ratio"), st.sampled_from(_MAX_NORM_RATIOS)),
        st.tuples(st.just("exact"), st.just(0.0)),
        st.tuples(st.just("absolute"), st.sampled_from((0.0, math.inf, 1.0))),
        st.tuples(st.just("absolute"), st.floats(1e-3, 1e3)),
    )

    @st.composite
    def cases(draw: Callable[..., Any]) -> ClipCase:
        dtype = draw(st.sampled_from(tuple(dtypes)))
        drawn = draw(st.lists(shapes, min_size=1, max_size=max_tensors))
        kept: list[tuple[int, ...]] = []
        budget = max_total_elements
        for shape in drawn:  # keep the prefix that fits the budget (at least one tensor)
            size = math.prod(shape)
            if size > budget:
                if not kept:
                    kept.append((budget,))
                break
            kept.append(shape)
            budget -= size
        kinds = draw(st.lists(st.sampled_from(_VALUE_KINDS), min_size=1, max_size=3))
        magnitudes = draw(st.lists(st.sampled_from(_MAGNITUDES[dtype]), min_size=1, max_size=3))
        return _make_case(kept, dtype, draw(st.integers(0, 2**32 - 1)), kinds, magnitudes, draw(specials), draw(max_norm_rules))

    return cases()


# ---------------------------------------------------------------------------------------------
# Running a clip function on a case


def _make_inputs(case: ClipCase, tensor_kind: str, device: str) -> list[Any]:
    if tensor_kind == "numpy":
        return [v.astype(np.float16 if case.dtype == "float16" else np.float32) for v in case.values]
    import torch

    dtype = getattr(torch, case.dtype)
    return [torch.from_numpy(v.copy()).to(device=device, dtype=dtype) for v in case.values]


def _read_back(tensors: Sequence[Any], tensor_kind: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(values as float64, raw bit patterns) of each tensor."""
    values, bits = [], []
    for tensor in tensors:
        if tensor_kind == "numpy":
            array = np.asarray(tensor)
            values.append(array.astype(np.float64))
            bits.append(array.view(np.uint16 if array.itemsize == 2 else np.uint32).copy())
            continue
        import torch

        cpu = tensor.detach().cpu()
        values.append(cpu.float().numpy().astype(np.float64))
        bits.append(cpu.view(torch.int16 if cpu.element_size() == 2 else torch.int32).numpy().copy())
    return values, bits


def _sixteen_bit_dtype(value: Any) -> str | None:
    """ "float16" / "bfloat16" when a returned norm or scale is a tensor of that dtype, else None."""
    name = str(getattr(value, "dtype", ""))
    return next((dtype for dtype in ("bfloat16", "float16") if name.endswith(dtype)), None)


def _fail(case: ClipCase, message: str) -> None:
    __tracebackhide__ = True
    raise ConformanceError(f"{message}\n  case: {case.describe()}")


def check_case(
    clip_fn: Callable[[list[Any], float], tuple[Any, Any]],
    case: ClipCase,
    *,
    tensor_kind: str = "torch",
    device: str = "cpu",
    tolerances: Tolerances = Tolerances(),
    nonfinite: str = "untouched",
) -> None:
    """Run ``clip_fn`` on fresh tensors made from ``case``; raise ConformanceError if it breaks
    the contract (see the module docstring)."""
    __tracebackhide__ = True
    inputs = _make_inputs(case, tensor_kind, device)
    before, before_bits = _read_back(inputs, tensor_kind)
    norm, scale = clip_fn(inputs, case.max_norm)
    got_norm, got_scale = float(norm), float(scale)
    after, after_bits = _read_back(inputs, tensor_kind)
    reference = reference_clip(case.values, case.max_norm)
    # Bitwise, except that a NaN may come back with another payload (multiplying by 1 may
    # canonicalise NaNs: torch's bfloat16 conversion does).
    untouched = all(
        np.all((b == a) | (np.isnan(v_before) & np.isnan(v_after)))
        for b, a, v_before, v_after in zip(before_bits, after_bits, before, after)
    )

    if reference.nonfinite:
        has_nan = any(np.isnan(v).any() for v in case.values)
        expected = "nan" if has_nan else "inf"
        if not (math.isnan(got_norm) if has_nan else got_norm == math.inf):
            held = "NaN" if has_nan else "inf"
            _fail(case, f"norm: expected {expected} (the gradients hold {held}), was {got_norm!r}")
        if nonfinite == "untouched":
            if got_scale != 1.0:
                _fail(case, f"scale: expected 1 for a non-finite norm, was {got_scale!r}")
            if not untouched:
                _fail(case, "gradients: expected them untouched when the norm is non-finite, but they changed")
        return

    # A norm returned in a 16-bit dtype carries that dtype's rounding: allow 2 of its ulps.
    norm_dtype = _sixteen_bit_dtype(norm)
    norm_atol = 1e-30  # squares of float32 subnormals may flush to 0
    if norm_dtype is not None:
        norm_atol += 2 * float(_ulp(np.float64(reference.total_norm), norm_dtype))
    norm_allowed = tolerances.norm_rtol * reference.total_norm + norm_atol
    if not abs(got_norm - reference.total_norm) <= norm_allowed:
        _fail(case, f"norm: expected {reference.total_norm!r} (float64 reference, within {norm_allowed:.3g}), was {got_norm!r}")
    # The scale inherits the norm's relative error, plus its own rounding (float32 or 16-bit).
    scale_dtype = _sixteen_bit_dtype(scale)
    scale_rtol = 2 * norm_allowed / max(reference.total_norm, CLIP_EPS) + 1e-6
    if scale_dtype is not None:
        scale_rtol += 2 * 2.0 ** -DTYPES[scale_dtype][0]
    if not abs(got_scale - reference.scale) <= scale_rtol * reference.scale:
        _fail(
            case,
            f"scale: expected {reference.scale!r} = min(1, {case.max_norm!r} / (norm + {CLIP_EPS})) "
            f"(rtol {scale_rtol:.3g}), was {got_scale!r}",
        )
    if got_scale == 1.0 or math.isinf(case.max_norm):
        if not untouched:
            _fail(case, f"gradients: expected them untouched (scale {got_scale!r}, max_norm {case.max_norm!r}), but they changed")
        return

    for index, (original, result) in enumerate(zip(case.values, after)):
        exact = original.astype(np.float64) * got_scale
        expected = _round_to_dtype(_round_to_dtype(exact, "float32"), case.dtype).astype(np.float64)
        ok = np.abs(result - expected) <= tolerances.element_ulps * _ulp(expected, case.dtype)
        if tolerances.allow_flush_to_zero:
            ok |= (np.abs(exact) < FLOAT32_SMALLEST_NORMAL) & (result == 0)
        if not ok.all():
            bad = np.flatnonzero(~ok.reshape(-1))
            first = bad[0]
            _fail(
                case,
                f"gradients: tensor {index} (shape {tuple(original.shape)}), element {first}: expected "
                f"{expected.reshape(-1)[first]!r} = {float(original.reshape(-1)[first])!r} x scale "
                f"{got_scale!r} in {case.dtype} (within {tolerances.element_ulps:g} ulp), was "
                f"{result.reshape(-1)[first]!r}; {bad.size} of {original.size} elements are off",
            )


def check_clip_function(
    clip_fn: Callable[[list[Any], float], tuple[Any, Any]],
    *,
    dtypes: Sequence[str] = ("float32",),
    tensor_kind: str = "torch",
    device: str = "cpu",
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    max_total_elements: int = DEFAULT_MAX_TOTAL_ELEMENTS,
    max_tensors: int = DEFAULT_MAX_TENSORS,
    boundary_sizes: Sequence[int] = DEFAULT_BOUNDARY_SIZES,
    tolerances: Tolerances = Tolerances(),
    nonfinite: str = "untouched",
) -> ConformanceReport:
    """Check ``clip_fn`` on the edge cases of every dtype, then on ``max_examples`` fuzzed cases.

    ``tensor_kind`` is ``"torch"`` (tensors on ``device``) or ``"numpy"`` (float32 / float16
    arrays). Hypothesis runs derandomized (the same cases every run) with no example database.
    Raises ConformanceError on the first failing case (shrunk by Hypothesis to a small one).
    """
    __tracebackhide__ = True
    from hypothesis import HealthCheck, given, settings

    if tensor_kind not in ("torch", "numpy"):
        raise ValueError(f"tensor_kind must be 'torch' or 'numpy', was {tensor_kind!r}")
    if tensor_kind == "numpy" and "bfloat16" in dtypes:
        raise ValueError("numpy has no bfloat16: use tensor_kind='torch' to check bfloat16")
    if nonfinite not in ("untouched", "torch"):
        raise ValueError(f"nonfinite must be 'untouched' or 'torch', was {nonfinite!r}")
    options = {"tensor_kind": tensor_kind, "device": device, "tolerances": tolerances, "nonfinite": nonfinite}

    edges = [case for dtype in dtypes for case in edge_cases(dtype, max_total_elements)]
    for case in edges:
        check_case(clip_fn, case, **options)

    fuzzed = 0

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(clip_cases(dtypes, max_total_elements=max_total_elements, max_tensors=max_tensors, boundary_sizes=boundary_sizes))
    def conforms(case: ClipCase) -> None:
        nonlocal fuzzed
        fuzzed += 1
        check_case(clip_fn, case, **options)

    conforms()
    return ConformanceReport(edge_cases=len(edges), fuzzed_cases=fuzzed)


def check_backend(
    name: str, *, dtypes: Sequence[str] = tuple(DTYPES), device: str | None = None, **options: Any
) -> ConformanceReport:
    """:func:`check_clip_function` for a backend of ``pytest_spikecheck.clipping`` (``"torch"``,
    ``"cupy"``, ``"emulator"``): cupy on ``cuda``, the others on ``cpu`` unless ``device`` says."""
    __tracebackhide__ = True
    from pytest_spikecheck.clipping import get_backend

    backend = get_backend(name)
    return check_clip_function(backend.clip_, dtypes=dtypes, device=device or ("cuda" if name == "cupy" else "cpu"), **options)
