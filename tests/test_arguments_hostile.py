"""Bad scalar arguments to the public functions of positions, encodings, decay, general, kv_cache,
logn, dual_chunk, linear_attention, precision, scaling_analysis, extrapolation_analysis,
frequencies, fope, config and the experiment: one policy everywhere (rope._checks).

* a flag given as a string, an int, None or a NumPy bool raises TypeError naming it;
* an integer given as a float (3.0, NumPy float), a list, a bool, a string or None raises TypeError
  naming it; NumPy integers are integers, and give what the int gives (stored as an int);
* a real number given as a string, a bool, a list or None raises TypeError naming it, NaN or an
  infinity ValueError naming it; NumPy numbers give what the float gives.
"""

import math
from dataclasses import is_dataclass

import numpy as np
import pytest
import torch

import rope
import rope.experiment
from helpers import names
from rope import axial, fope, layouts, mrope, positions
from rope.analysis import decay, general, precision
from rope.analysis import extrapolation as ea
from rope.analysis import scaling as sa
from rope.attention import dual_chunk, encodings, kv_cache, linear_attention, logn
from rope.experiment import ExperimentConfig, ModelSpec, RecallTask, TaskSpec

THETA32 = rope.inv_freq({"rope_theta": 1e4}, 8)[0]
THETA64 = THETA32.double()
GEN = torch.Generator().manual_seed(12)
SKEW = (lambda a: a - a.T)(torch.randn(4, 4, generator=GEN, dtype=torch.float64))
ORTHOGONAL = torch.linalg.qr(torch.randn(4, 4, generator=GEN, dtype=torch.float64))[0]
Q, K, V = (torch.randn(1, 5, 2, 8, generator=GEN) for _ in range(3))
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}
COEF = torch.randn(2, 2, 2, generator=GEN)  # FoPE's coefficients: 2 key heads, R = 2
TASK = TaskSpec(markov_vocab=8, successors=2, anchors=4, span=2)

INT, OPTIONAL_INT, NUMBER, FLAG = "int", "optional int", "number", "flag"

# (name, function of keyword arguments, good keyword arguments, the kind of each argument tested)
CASES = [
    ("context_parallel_positions", positions.context_parallel_positions,
     dict(seq_len=8, world_size=2, rank=1, zigzag=False), dict(seq_len=INT, world_size=INT, rank=INT, zigzag=FLAG)),
    ("sinusoidal_frequencies", encodings.sinusoidal_frequencies, dict(dim=8, base=100.0), dict(dim=INT, base=NUMBER)),
    ("sinusoidal", lambda **a: encodings.sinusoidal(torch.arange(3), **a), dict(dim=8, base=100.0),
     dict(dim=INT, base=NUMBER)),
    ("shaw_relative_indices", encodings.shaw_relative_indices, dict(q_len=3, k_len=4, max_relative_position=2),
     dict(q_len=INT, k_len=INT, max_relative_position=INT)),
    ("deberta_relative_indices", encodings.deberta_relative_indices, dict(q_len=3, k_len=4, span=2),
     dict(q_len=INT, k_len=INT, span=INT)),
    ("t5_relative_bucket", lambda **a: encodings.t5_relative_bucket(torch.arange(-20, 20), **a),
     dict(bidirectional=True, num_buckets=8, max_distance=16),
     dict(bidirectional=FLAG, num_buckets=INT, max_distance=INT)),
    ("alibi_slopes", encodings.alibi_slopes, dict(num_heads=6), dict(num_heads=INT)),
    ("first_negative_distance", decay.first_negative_distance, dict(base=100.0, dim=8, limit=50),
     dict(base=NUMBER, dim=INT, limit=INT)),
    ("base_is_admissible", decay.base_is_admissible, dict(base=100.0, length=20, dim=8),
     dict(base=NUMBER, length=INT, dim=INT)),
    ("base_grid", decay.base_grid, dict(lower=10.0, upper=100.0, points_per_decade=4),
     dict(lower=NUMBER, upper=NUMBER, points_per_decade=INT)),
    ("min_bases_for_lengths", lambda **a: decay.min_bases_for_lengths([16], **a),
     dict(dim=8, points_per_decade=4, lower=10.0, upper=1e4), dict(dim=INT, points_per_decade=INT, lower=NUMBER,
                                                                   upper=NUMBER)),
    ("power_rotation", lambda **a: general.power_rotation(ORTHOGONAL, **a), dict(n=3), dict(n=INT)),
    ("rotation_from_generator", lambda **a: general.rotation_from_generator(SKEW, **a), dict(n=2.5), dict(n=NUMBER)),
    ("inv_freq", lambda **a: rope.inv_freq(DYNAMIC, **a), dict(head_dim=8, seq_len=20),
     dict(head_dim=INT, seq_len=OPTIONAL_INT)),
    ("RopeConfig.rotary_dim", rope.parse_config({}).rotary_dim, dict(head_dim=8), dict(head_dim=INT)),
    ("DynamicNTKKeyCache", lambda **a: kv_cache.DynamicNTKKeyCache(DYNAMIC, **a), dict(head_dim=8),
     dict(head_dim=INT)),
    ("logn_scale", lambda **a: logn.logn_scale(torch.arange(6), **a), dict(training_length=4),
     dict(training_length=INT)),
    ("dual_chunk_relative_positions", dual_chunk.dual_chunk_relative_positions,
     dict(q_len=4, k_len=8, chunk_size=3, local_window=1),
     dict(q_len=INT, k_len=INT, chunk_size=INT, local_window=INT)),
    ("rotary_linear_attention", lambda **a: linear_attention.rotary_linear_attention(Q, K, V, torch.arange(5), THETA32,
                                                                                     **a),
     dict(causal=True), dict(causal=FLAG)),
    ("rotary_linear_attention_weights",
     lambda **a: linear_attention.rotary_linear_attention_weights(Q, K, torch.arange(5), THETA32, **a),
     dict(causal=False), dict(causal=FLAG)),
    ("position_digits", lambda **a: precision.position_digits(torch.arange(5), **a), dict(beta=16, digits=3),
     dict(beta=INT, digits=INT)),
    ("digit_table_cos_sin", lambda **a: precision.digit_table_cos_sin(torch.arange(5), THETA32, **a),
     dict(beta=4, digits=3), dict(beta=INT, digits=INT)),
    ("ntk_aware_base", sa.ntk_aware_base, dict(base=1e4, factor=4.0, dim=8), dict(base=NUMBER, factor=NUMBER, dim=INT)),
    ("ntk_factor_for_base", sa.ntk_factor_for_base, dict(base=1e4, new_base=5e5, dim=8),
     dict(base=NUMBER, new_base=NUMBER, dim=INT)),
    ("dynamic_ntk_factor", sa.dynamic_ntk_factor, dict(factor=4.0, seq_len=40, max_position_embeddings=16),
     dict(factor=NUMBER, seq_len=INT, max_position_embeddings=INT)),
    ("base_beta", sa.base_beta, dict(base=1e4, dim=8), dict(base=NUMBER, dim=INT)),
    ("beta_digits", lambda **a: sa.beta_digits(torch.arange(5), **a), dict(beta=10.0, num_digits=3),
     dict(beta=NUMBER, num_digits=INT)),
    ("angle_spans", lambda **a: sa.angle_spans(THETA64, **a), dict(length=16), dict(length=INT)),
    ("unseen_angle_pairs", lambda **a: sa.unseen_angle_pairs(THETA64, 16, THETA64 / 2, 32, **a), dict(rtol=0.5),
     dict(rtol=NUMBER)),
    ("pair_index_for_rotations", sa.pair_index_for_rotations, dict(rotations=1.0, dim=8, base=1e4, length=64),
     dict(rotations=NUMBER, dim=INT, base=NUMBER, length=INT)),
    ("yarn_ramp_paper", lambda **a: sa.yarn_ramp_paper(THETA64, **a), dict(original_length=64, alpha=1.0, beta=32.0),
     dict(original_length=INT, alpha=NUMBER, beta=NUMBER)),
    ("yarn_correction_range", sa.yarn_correction_range,
     dict(dim=8, base=1e4, original_length=64, beta_fast=32.0, beta_slow=1.0, truncate=True),
     dict(dim=INT, base=NUMBER, original_length=INT, beta_fast=NUMBER, beta_slow=NUMBER, truncate=FLAG)),
    ("yarn_ramp_code", sa.yarn_ramp_code,
     dict(dim=8, base=1e4, original_length=64, beta_fast=32.0, beta_slow=1.0, truncate=False),
     dict(dim=INT, base=NUMBER, original_length=INT, beta_fast=NUMBER, beta_slow=NUMBER, truncate=FLAG)),
    ("blend_frequencies", lambda **a: sa.blend_frequencies(THETA64, gamma=torch.full((4,), 0.5), **a),
     dict(factor=4.0), dict(factor=NUMBER)),
    ("kept_fraction", lambda **a: sa.kept_fraction(THETA64 / 2, THETA64, **a), dict(factor=4.0), dict(factor=NUMBER)),
    ("deepseek_yarn_scales", sa.deepseek_yarn_scales, dict(factor=4.0, mscale=1.0, mscale_all_dim=0.5),
     dict(factor=NUMBER, mscale=NUMBER, mscale_all_dim=NUMBER)),
    ("yarn_mscale", sa.yarn_mscale, dict(scale=4.0, mscale=1.0, slope=0.5),
     dict(scale=NUMBER, mscale=NUMBER, slope=NUMBER)),
    ("fope_inv_freq", fope.fope_inv_freq,
     dict(rope_theta=1e4, rotary_dim=8, num_inv_freq=2, max_position_embeddings=64),
     dict(rope_theta=NUMBER, rotary_dim=INT, num_inv_freq=OPTIONAL_INT, max_position_embeddings=OPTIONAL_INT)),
    ("apply_fope", lambda **a: rope.apply_fope(Q, K, torch.arange(5), THETA32[:2], cos_coef=COEF, sin_coef=COEF, **a),
     dict(sep_head=True), dict(sep_head=FLAG)),
    ("largest_unseen_arc", lambda **a: ea.largest_unseen_arc(THETA64, **a), dict(training_length=16),
     dict(training_length=INT)),
    ("fit_series_coefficients",
     lambda **a: ea.fit_series_coefficients([0.0, 1.0, 2.0], [1.0, 0.5, 0.25], THETA64, **a), dict(ridge=0.5),
     dict(ridge=NUMBER)),
    ("worst_interpolation_coefficients", lambda **a: ea.worst_interpolation_coefficients(inv_freq=THETA64, **a),
     dict(distance=0.5), dict(distance=NUMBER)),
    ("geometric_interpolation_bound", ea.geometric_interpolation_bound,
     dict(max_abs_h=1.0, distances=0.5, dim=8, base=1e4), dict(max_abs_h=NUMBER, dim=INT, base=NUMBER)),
    ("stated_interpolation_bound", ea.stated_interpolation_bound,
     dict(max_abs_h=1.0, distances=0.5, dim=8, base=1e4), dict(max_abs_h=NUMBER, dim=INT, base=NUMBER)),
    ("TaskSpec", TaskSpec, dict(markov_vocab=8, successors=2, anchors=4, span=2, event_rate=0.25, seed=1),
     dict(markov_vocab=INT, successors=INT, anchors=INT, span=INT, event_rate=NUMBER, seed=INT)),
    ("ModelSpec", ModelSpec, dict(vocab_size=12, d_model=8, num_heads=2, num_layers=1, mlp_ratio=2),
     dict(vocab_size=INT, d_model=INT, num_heads=INT, num_layers=INT, mlp_ratio=INT)),
    ("RecallTask.sample", RecallTask(TASK).sample, dict(batch=2, length=8, seed=1),
     dict(batch=INT, length=INT, seed=INT)),
    ("ExperimentConfig", lambda **a: ExperimentConfig(name="x", **a),
     dict(d_model=8, num_heads=2, training_length=8, steps=2, seed=0, threads=1, rope_theta=1e4, learning_rate=0.25),
     dict(d_model=INT, num_heads=INT, training_length=INT, steps=INT, seed=INT, threads=OPTIONAL_INT,
          rope_theta=NUMBER, learning_rate=NUMBER)),
]

BAD = {
    INT: [3.0, np.float64(3.0), [3], True, "3", None],
    OPTIONAL_INT: [3.0, np.float32(3.0), [3], False, "3"],
    NUMBER: ["1.5", True, [1.5], None, math.nan, math.inf, -math.inf, np.float64(math.nan)],
    FLAG: ["no", "False", 0, 1, None, np.bool_(True)],
}


def bad_arguments() -> list:
    cases = []
    for name, function, good, kinds in CASES:
        for argument, kind in kinds.items():
            for value in BAD[kind]:
                is_nan_or_inf = isinstance(value, float) and not math.isfinite(value)
                error = ValueError if kind == NUMBER and is_nan_or_inf else TypeError
                cases.append(pytest.param(function, {**good, argument: value}, argument, error,
                                          id=f"{name}-{argument}={value!r}"))
    return cases


def numpy_arguments() -> list:
    cases = []
    for name, function, good, kinds in CASES:
        for argument, kind in kinds.items():
            value = good[argument]
            if kind == FLAG:
                continue
            kinds_of_numpy = (np.int64, np.int32, np.uint8) if kind in (INT, OPTIONAL_INT) else (np.float64, np.float32)
            if kind == NUMBER and float(value).is_integer():
                kinds_of_numpy += (np.int64,)
            for numpy_type in kinds_of_numpy:
                cases.append(pytest.param(function, good, argument, numpy_type(value),
                                          id=f"{name}-{argument}-{numpy_type.__name__}"))
    return cases


@pytest.mark.parametrize("function, arguments, argument, error", bad_arguments())
def test_a_bad_argument_raises_naming_it(function, arguments, argument, error):
    with pytest.raises((TypeError, ValueError)) as caught:
        function(**arguments)
    assert type(caught.value) is error, repr(caught.value)
    assert names(str(caught.value), argument), str(caught.value)


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if is_dataclass(a):
        return a == b and all(type(x) is type(y) for x, y in zip(vars(a).values(), vars(b).values()))
    if isinstance(a, kv_cache.DynamicNTKKeyCache):
        return a.head_dim == b.head_dim and type(b.head_dim) is int
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("function, arguments, argument, value", numpy_arguments())
def test_numpy_numbers_are_accepted_as_the_python_number(function, arguments, argument, value):
    """A NumPy integer is an integer and a NumPy float a real number: the result is the one the
    Python number gives, with ints stored as ints (the good values are exact in float32)."""
    python_value = arguments[argument]
    assert float(value) == python_value
    assert same(function(**arguments), function(**{**arguments, argument: value}))


def test_every_kind_has_cases():
    kinds = {kind for _, _, _, kinds in CASES for kind in kinds.values()}
    assert kinds == set(BAD)


META = torch.device("meta")


@pytest.mark.parametrize(
    "call, error, argument",
    [
        (lambda: positions.packed_positions(torch.tensor([0, 2, 5]), torch.zeros(2, dtype=torch.int64, device=META)),
         ValueError, "offsets"),
        (lambda: encodings.alibi_bias(torch.arange(3), torch.arange(3), torch.ones(2, device=META)), ValueError,
         "q_positions"),
        (lambda: encodings.sinusoidal(torch.arange(3), 8, dtype="float64"), TypeError, "dtype"),
        (lambda: encodings.sinusoidal(torch.arange(3), 8, dtype=torch.int32), ValueError, "dtype"),
        (lambda: decay.partial_sums(torch.arange(3, device=META), THETA32), ValueError, "distance"),
        (lambda: decay.cosine_sum(torch.tensor([1.0, math.inf]), THETA32), ValueError, "distance"),
        (lambda: decay.relative_upper_bound(3, THETA32.to(torch.complex64)), TypeError, "inv_freq"),
        (lambda: precision.recipe_angles(torch.arange(3), THETA64), TypeError, "inv_freq"),
        (lambda: precision.reference_angles(torch.arange(3), torch.tensor([1.0, math.nan])), ValueError, "inv_freq"),
        (lambda: precision.rotate_with_tables(torch.ones(4), torch.ones(2, device=META), torch.ones(2)), ValueError,
         "cos"),
        (lambda: ea.series_score(torch.ones(4, dtype=torch.complex128, device=META), 1.0, THETA64), ValueError, "h"),
        (lambda: ea.series_score(torch.ones(4, dtype=torch.complex128), torch.ones(2, device=META), THETA64),
         ValueError, "distances"),
        (lambda: sa.blend_frequencies(THETA64, 2.0, [0.5] * 4), TypeError, "gamma"),
        (lambda: sa.blend_frequencies(THETA64, 2.0, torch.full((4,), math.nan)), ValueError, "gamma"),
        (lambda: sa.kept_fraction(THETA64, THETA64.to(META), 2.0), ValueError, "original"),
        (lambda: sa.wavelengths(THETA32.to(torch.int32)), TypeError, "inv_freq"),
        (lambda: logn.softmax_entropy(torch.ones(3, dtype=torch.int64)), TypeError, "logits"),
        (lambda: linear_attention.rotary_linear_attention(Q, K, V, torch.arange(5), THETA32,
                                                          feature_map=lambda x: x.tolist()), TypeError, "feature_map"),
        (lambda: kv_cache.DynamicNTKKeyCache(DYNAMIC, 8, store="both"), ValueError, "store"),
        (lambda: kv_cache.DynamicNTKKeyCache(DYNAMIC, 2), ValueError, "head_dim"),
        (lambda: rope.experiment.TinyTransformer(ModelSpec(vocab_size=12, d_model=8, num_heads=2))(
            torch.ones(2, 3), rope.experiment.methods.NoPosition()), TypeError, "tokens"),
        (lambda: rope.experiment.TinyTransformer(ModelSpec(vocab_size=12, d_model=8, num_heads=2))(
            torch.ones(3, dtype=torch.int64), rope.experiment.methods.NoPosition()), ValueError, "tokens"),
        (lambda: rope.experiment.run("tiny", methods="rope"), TypeError, "methods"),
        (lambda: rope.experiment.run("tiny", progress="no"), TypeError, "progress"),
        (lambda: ExperimentConfig(name="x", eval_multiples=()), ValueError, "eval_multiples"),
        (lambda: ExperimentConfig(name="x", eval_multiples=[1, 2]), TypeError, "eval_multiples"),
    ],
)
def test_bad_tensors_devices_and_choices_are_named(call, error, argument):
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    assert type(caught.value) is error, repr(caught.value)
    assert names(str(caught.value), argument), str(caught.value)


# ----- position tensors: any integer dtype whose values are int64 values; uint64 is refused -----------

MROPE_AXES4 = torch.tensor([0, 1, 2, 0])
POSITION_ENTRIES = [  # (name, the argument, a call with a [5] position tensor)
    ("apply_rotary", "positions", lambda p: rope.apply_rotary(Q, K, p, THETA32, backend="torch")),
    ("apply_mrope", "position_ids",
     lambda p: mrope.apply_mrope(Q, K, p.expand(3, -1), THETA32, MROPE_AXES4, backend="torch")),
    ("apply_rotary_2d", "positions_xy", lambda p: rope.apply_rotary_2d(Q, K, torch.stack([p, p], -1), THETA32[:2],
                                                                       THETA32[2:])),
    ("pair_cos_sin", "positions_xy", lambda p: axial.pair_cos_sin(torch.stack([p, p], -1), THETA32[:2], THETA32[2:])),
    ("angles.cos_sin", "positions", lambda p: rope.angles.cos_sin(p, THETA32)),
    ("angles.exact_angles", "positions", lambda p: rope.angles.exact_angles(p, THETA32)),
    ("angles.reduced_angles", "positions", lambda p: rope.angles.reduced_angles(p, THETA32)),
    ("mrope_cos_sin", "position_ids", lambda p: mrope.mrope_cos_sin(p.expand(3, -1), THETA32, MROPE_AXES4)),
    ("packed_positions", "offsets", lambda p: positions.packed_positions(torch.arange(6), p)),
]


@pytest.mark.parametrize("name, argument, call", POSITION_ENTRIES, ids=[e[0] for e in POSITION_ENTRIES])
def test_uint64_positions_are_refused_not_wrapped(name, argument, call):
    """A uint64 m >= 2^63 is no int64 value: converted it would wrap to m - 2^64, a wrong angle.
    uint64 tensors are refused (TypeError naming the argument), whatever their values."""
    low = torch.randint(0, 2**62, (5,), generator=GEN).tolist()
    for offset in (2**63, 0):  # the refusal is of the dtype, not only of the values >= 2^63
        with pytest.raises(TypeError) as caught:
            call(torch.tensor([m + offset for m in low], dtype=torch.uint64))
        assert names(str(caught.value), argument) and "uint64" in str(caught.value), str(caught.value)


def test_uint64_cu_seqlens_are_refused():
    with pytest.raises(TypeError, match=r"^cu_seqlens must be an integer tensor whose values fit int64"):
        positions.packed_positions(torch.tensor([0, 2, 5], dtype=torch.uint64))


@pytest.mark.parametrize("name, argument, call", POSITION_ENTRIES, ids=[e[0] for e in POSITION_ENTRIES])
def test_uint32_positions_give_what_int64_positions_give(name, argument, call):
    """The narrower unsigned dtypes hold int64 values only: taken, with the int64 result."""
    p = torch.randint(2**31, 2**32, (5,), generator=GEN)
    expected, got = call(p), call(p.to(torch.uint32))
    assert same(tuple(expected) if isinstance(expected, tuple) else expected,
                tuple(got) if isinstance(got, tuple) else got)


# ----- frequencies of the angle functions: checked as apply_rotary checks them ------------------------

POS5 = torch.arange(5)
FREQUENCY_ENTRIES = [  # (name, call with 4 frequencies, whether float64 frequencies are honoured)
    ("angles.cos_sin", lambda f: rope.angles.cos_sin(POS5, f), True),
    ("angles.exact_angles", lambda f: rope.angles.exact_angles(POS5, f), True),
    ("angles.turns_per_position", rope.angles.turns_per_position, True),
    ("mrope_cos_sin", lambda f: mrope.mrope_cos_sin(POS5.expand(3, -1), f, MROPE_AXES4), True),
    ("pair_cos_sin", lambda f: axial.pair_cos_sin(torch.stack([POS5, POS5], -1), f[:2], f[2:]), True),
    ("angles.reduced_angles", lambda f: rope.angles.reduced_angles(POS5, f), False),  # 64-bit turns of float32
]


def _fresh_frequencies(dtype=torch.float32) -> torch.Tensor:
    return (torch.rand(4, generator=GEN, dtype=torch.float64) * 2 - 1).to(dtype)


def _with(value, dtype=torch.float32) -> torch.Tensor:
    theta = _fresh_frequencies(dtype)
    theta[int(torch.randint(0, 4, (1,), generator=GEN))] = value
    return theta


BAD_FREQUENCIES = [  # (description, make the frequencies, error)
    ("NaN", lambda: _with(math.nan), ValueError),
    ("inf", lambda: _with(math.inf), ValueError),
    ("-inf", lambda: _with(-math.inf), ValueError),
    ("int32", lambda: torch.randint(1, 9, (4,), generator=GEN, dtype=torch.int32), TypeError),
    ("float16", lambda: _fresh_frequencies(torch.float16), TypeError),
    ("bfloat16", lambda: _fresh_frequencies(torch.bfloat16), TypeError),
    ("2-D", lambda: _fresh_frequencies()[None], ValueError),
    ("list", lambda: _fresh_frequencies().tolist(), TypeError),
    ("float64 1e300", lambda: _with(1e300, torch.float64), "float64"),
    ("float64 2^-120", lambda: _with(2.0**-120, torch.float64), "float64"),
]


@pytest.mark.parametrize("name, call, honours_float64", FREQUENCY_ENTRIES, ids=[e[0] for e in FREQUENCY_ENTRIES])
@pytest.mark.parametrize("kind, make, error", BAD_FREQUENCIES, ids=[b[0] for b in BAD_FREQUENCIES])
def test_angle_functions_refuse_frequencies_they_would_misread(name, call, honours_float64, kind, make, error):
    """NaN, infinities, integer or half-precision frequencies (and float64 magnitudes outside
    [2^-100, 2^127)) would have their bits read as some other finite angle: refused, naming them.
    reduced_angles' 64-bit turns are those of float32 theta_i: float64 is a TypeError there."""
    if error == "float64":
        error = ValueError if honours_float64 else TypeError
    with pytest.raises(error) as caught:
        call(make())
    message = str(caught.value)
    assert any(names(message, n) for n in ("inv_freq", "inv_freq_x", "inv_freq_y")), message


@pytest.mark.parametrize("name, call, honours_float64", FREQUENCY_ENTRIES, ids=[e[0] for e in FREQUENCY_ENTRIES])
def test_float64_frequencies_are_honoured_or_refused_never_rounded(name, call, honours_float64):
    """float64 theta_i in range: the angle functions of the torch path take them; reduced_angles,
    whose turns would be those of their float32 rounding, refuses them."""
    theta = _fresh_frequencies(torch.float64)
    if not honours_float64:
        with pytest.raises(TypeError, match="inv_freq must be float32, got torch.float64"):
            call(theta)
        return
    got, rounded = call(theta), call(theta.to(torch.float32))  # the float32 rounding turns by other angles
    flat = [t.double() for t in (got if isinstance(got, tuple) else (got,))]
    flat_rounded = [t.double() for t in (rounded if isinstance(rounded, tuple) else (rounded,))]
    assert any(not torch.equal(a, b) for a, b in zip(flat, flat_rounded))


# ----- layouts: pairs need an even width -------------------------------------------------------------


@pytest.mark.parametrize(
    "call, error, argument",
    [
        (lambda: layouts.interleaved_to_half(5), ValueError, "head_dim"),
        (lambda: layouts.interleaved_to_half(1), ValueError, "head_dim"),
        (lambda: layouts.half_to_interleaved(7), ValueError, "head_dim"),
        (lambda: rope.permute_qk_weight(torch.randn(10, 3, generator=GEN), 2, 5, to="half"), ValueError, "head_dim"),
        (lambda: rope.permute_qk_weight(torch.randn(5, generator=GEN), 1, 5, to="interleaved"), ValueError,
         "head_dim"),
        (lambda: layouts.pair_indices(5, "half"), ValueError, "rotary_dim"),
        (lambda: layouts.pair_indices(-2, "interleaved"), ValueError, "rotary_dim"),
        (lambda: layouts.pair_indices(4.0, "half"), TypeError, "rotary_dim"),
        (lambda: layouts.pair_indices(True, "half"), TypeError, "rotary_dim"),
        (lambda: layouts.pair_indices("4", "half"), TypeError, "rotary_dim"),
    ],
)
def test_odd_or_non_integer_rotary_widths_are_refused(call, error, argument):
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    assert type(caught.value) is error, repr(caught.value)
    assert names(str(caught.value), argument), str(caught.value)


@pytest.mark.parametrize("head_dim", [3, 5, 9])
def test_an_odd_head_dim_with_an_even_rotary_dim_is_a_permutation(head_dim):
    """The even check is of the rotary width: an odd head keeps its odd tail fixed."""
    rotary_dim = head_dim - 1
    p = layouts.interleaved_to_half(head_dim, np.int64(rotary_dim))
    assert sorted(p.tolist()) == list(range(head_dim)) and p[-1] == head_dim - 1
    assert p[: rotary_dim // 2].tolist() == list(range(0, rotary_dim, 2))
    a, b = layouts.pair_indices(np.int64(rotary_dim), "half")
    assert a.tolist() == list(range(rotary_dim // 2)) and b.tolist() == list(range(rotary_dim // 2, rotary_dim))
