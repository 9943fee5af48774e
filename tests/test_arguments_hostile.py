"""Bad scalar arguments to the public functions of positions, encodings, decay, general, kv_cache,
logn, dual_chunk, linear_attention, precision, scaling_analysis, extrapolation_analysis,
frequencies, config and the experiment: one policy everywhere (rope._checks).

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
from rope import positions
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
    ("yarn_mscale", sa.yarn_mscale, dict(scale=4.0, mscale=1.0), dict(scale=NUMBER, mscale=NUMBER)),
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
