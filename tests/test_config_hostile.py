"""Hostile RoPE configs: every key of every rope_type, missing, None, of the wrong type (str,
bool, list, NumPy scalars), NaN, infinite, 0, negative, huge or tiny, and keys rope does not read.

Each config either gives float32 frequencies, finite and > 0 (0 only on proportional RoPE's
unrotated pairs), each within half a float32 ulp of a float64 reference written here from the
published formulas, and a finite positive attention factor equal to the reference's; or raises a
TypeError or ValueError whose message names the key. No other exception escapes. Which outcome
each change must have follows the key policy of :mod:`rope.config`, restated below as this file
reads it (the keys each formula reads, the kinds of value each key takes; a None counts as
absent, except yarn's truncate, which transformers reads as False). A :class:`RopeConfig` made
directly from the same values as fields behaves as the mapping does.
"""

import math
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rope
from helpers import names, ulp
from rope.config import RopeConfig, RopeConfigWarning
from rope.registry import FIELD_KEYS

COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "max_position_embeddings",
          "original_max_position_embeddings", "mrope_section", "mrope_interleaved", "interleaved", "mrope_style"}
READS = {  # besides COMMON: the keys each formula reads
    "default": set(),
    "linear": {"factor"},
    "ntk_aware": {"factor"},
    "ntk": {"factor"},  # vLLM's; its mixed_b has its own test (test_rope_types_vllm.py)
    "dynamic": {"factor", "alpha"},  # HunYuan's alpha: a fixed base b alpha^(d/(d-2)), factor unread
    "yarn": {"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
    "longrope": {"factor", "short_factor", "long_factor", "attention_factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor"},
    "proportional": {"factor"},
}
NEEDED = {  # needed keys, and the keys that, all given, stand in for each
    "linear": {"factor": None}, "ntk_aware": {"factor": None}, "ntk": {"factor": None},
    "dynamic": {"factor": ("alpha",), "max_position_embeddings": ("alpha",)},
    "yarn": {"factor": ("max_position_embeddings", "original_max_position_embeddings"),
             "original_max_position_embeddings": ("max_position_embeddings",)},
    "longrope": {"factor": ("max_position_embeddings", "original_max_position_embeddings"),
                 "original_max_position_embeddings": ("max_position_embeddings",),
                 "short_factor": None, "long_factor": None},
    "llama3": {"factor": None, "low_freq_factor": None, "high_freq_factor": None, "rope_theta": None,
               "original_max_position_embeddings": ("max_position_embeddings",)},
    "proportional": {"rope_theta": None},  # as in transformers; the other types default to 10000
}
KIND = {
    "rope_type": "str", "type": "str", "mrope_style": "str",
    "max_position_embeddings": "int", "original_max_position_embeddings": "int",
    "truncate": "flag", "mrope_interleaved": "flag", "interleaved": "flag",
    "short_factor": "list", "long_factor": "list", "mrope_section": "section",
}  # every other key of rope's is a real number
MODEL_KEYS = {"llama_4_scaling_beta"}
FOREIGN = {"base", "theta", "attn_factor", "extrapolation_factor", "scaling_factor", "rotary_emb_base", "alpha"}
EXTRA_KEYS = sorted({"rope_thetaa", "low_freq_factor", "high_freq_factor", "short_factor", "beta_fast", "mscale",
                     "truncate", "attention_factor", "factor", "max_position_embeddings", "type", "mrope_interleaved",
                     "mrope_section", "original_max_position_embeddings", "llama_4_scaling_beta"} | FOREIGN)

MISSING = object()
HOSTILE = [MISSING, None, "2.0", True, False, [2.0], np.bool_(True), math.nan, math.inf, -math.inf, 0, 0.0, -1, -1.0,
           1e300, 1e-300, 10**400, 2**70, np.float64(math.nan)]
SAME_AS_NUMPY = ["np.float64", "np.float32", "np.int64"]  # the legal value as a NumPy scalar


def log_floats(low, high):
    return st.floats(math.log(low), math.log(high)).map(math.exp)


@st.composite
def legal_configs(draw, rope_type):
    """A legal config of ``rope_type``, a head_dim and a seq_len."""
    head_dim = draw(st.sampled_from([8, 16, 32, 64, 128]))
    config = {"rope_type": rope_type, "rope_theta": draw(log_floats(1.5, 1e7))}
    if draw(st.booleans()):
        config["partial_rotary_factor"] = draw(st.sampled_from([0.5, 0.25] if head_dim >= 32 else [0.5]))
    rotary = head_dim if rope_type == "proportional" else int(head_dim * config.get("partial_rotary_factor", 1.0))
    length = draw(st.integers(16, 8192))
    if rope_type in ("linear", "ntk_aware", "ntk", "dynamic", "yarn", "longrope", "llama3") or (
            rope_type == "proportional" and draw(st.booleans())):
        config["factor"] = draw(st.floats(1.0, 100.0))
    if rope_type == "dynamic":
        config["max_position_embeddings"] = length
    if rope_type in ("yarn", "longrope", "llama3"):
        config["original_max_position_embeddings"] = length
    if rope_type == "yarn":  # beta_slow <= 4 <= 32 and beta_fast >= 1: any subset is legal with the defaults
        slow = draw(st.floats(0.25, 4.0))
        for key, value in (("beta_slow", slow), ("beta_fast", draw(st.floats(max(slow, 1.0), 64.0))),
                           ("mscale", draw(st.floats(0.5, 2.0))), ("mscale_all_dim", draw(st.floats(0.5, 2.0))),
                           ("truncate", draw(st.booleans())), ("attention_factor", draw(st.floats(0.5, 2.0)))):
            if draw(st.booleans()):
                config[key] = value
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            config[key] = draw(st.lists(st.floats(1.0, 64.0), min_size=rotary // 2, max_size=rotary // 2))
        if draw(st.booleans()):
            config["attention_factor"] = draw(st.floats(0.5, 2.0))
    if rope_type == "llama3":
        low = draw(st.floats(0.5, 2.0))
        config.update(low_freq_factor=low, high_freq_factor=low + draw(st.floats(0.5, 8.0)))
    seq_len = draw(st.none() | st.integers(1, 4 * length))
    return config, head_dim, seq_len


# ----- the reference: the published formulas in float64, one value at a time ----------------------


def mscale(s, m=1.0):
    """YaRN's 0.1 m ln s + 1 (1 for s <= 1): Peng et al. 2023, transformers' get_mscale."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def reference(config, head_dim, seq_len):
    """(theta_i as float64 numbers, rotated pairs, attention factor) as the formulas give them."""
    c = {key: value for key, value in config.items() if value is not None}
    rope_type = c.get("rope_type", c.get("type", "default"))
    rope_type = "default" if rope_type == "mrope" else rope_type
    get = lambda key, default=None: float(c[key]) if key in c else default  # noqa: E731
    b = get("rope_theta", 10000.0)
    d = head_dim if rope_type == "proportional" else int(head_dim * get("partial_rotary_factor", 1.0))
    plain = [b ** (-(2 * i) / d) for i in range(d // 2)]
    if rope_type != "default":  # the others read factor (yarn and longrope: else max / original) and L
        s = get("factor")
        length = int(c["original_max_position_embeddings"]) if "original_max_position_embeddings" in c else (
            int(c["max_position_embeddings"]) if "max_position_embeddings" in c else None)
        if s is None and "max_position_embeddings" in c and "original_max_position_embeddings" in c:
            s = int(c["max_position_embeddings"]) / int(c["original_max_position_embeddings"])
    rotated, attention = d // 2, 1.0
    if rope_type == "default":
        theta = plain
    elif rope_type == "linear":
        theta = [t / s for t in plain]
    elif rope_type == "ntk":  # vLLM's NTKScalingRotaryEmbedding: base b s, every frequency over s^(2/d)
        theta = [(b * s) ** (-(2 * i) / d) / s ** (2 / d) for i in range(d // 2)]
    elif rope_type in ("ntk_aware", "dynamic"):  # NTK-aware base b s^(d/(d-2)); dynamic grows s with l
        if rope_type == "dynamic" and "alpha" in c:
            s = get("alpha")
        elif rope_type == "dynamic":
            big_l = int(c["max_position_embeddings"])
            current = big_l if seq_len is None else max(seq_len, big_l)
            s = 1 + s * (current - big_l) / big_l  # s l / L - (s - 1), without its cancellation
        base = b * s ** (d / (d - 2))
        theta = [base ** (-(2 * i) / d) for i in range(d // 2)]
    elif rope_type == "yarn":  # transformers' _compute_yarn_parameters
        fast, slow = get("beta_fast", 32.0), get("beta_slow", 1.0)

        def index(r):
            return d * math.log(length / (r * 2 * math.pi)) / (2 * math.log(b))

        low, high = index(fast), index(slow)
        if config.get("truncate", True):  # transformers' reading: a stored None is falsy, no truncation
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        high = high + 0.001 if low == high else high
        kept = [1 - min(max((i - low) / (high - low), 0.0), 1.0) for i in range(d // 2)]
        theta = [k * t + (1 - k) * t / s for k, t in zip(kept, plain)]
        if "attention_factor" in c:
            attention = get("attention_factor")
        elif get("mscale") and get("mscale_all_dim"):
            attention = mscale(s, get("mscale")) / mscale(s, get("mscale_all_dim"))
        else:
            attention = mscale(s)
    elif rope_type == "longrope":  # Ding et al. 2024; transformers' _compute_longrope_parameters
        factors = c["long_factor"] if seq_len is not None and seq_len > length else c["short_factor"]
        theta = [t / float(f) for t, f in zip(plain, factors)]
        if "attention_factor" in c:
            attention = get("attention_factor")
        else:
            attention = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(length))
    elif rope_type == "llama3":  # transformers' _compute_llama3_parameters
        low, high = get("low_freq_factor"), get("high_freq_factor")
        theta = []
        for t in plain:
            wavelength = 2 * math.pi / t
            if wavelength < length / high:
                theta.append(t)
            elif wavelength > length / low:
                theta.append(t / s)
            else:
                smooth = (length / wavelength - low) / (high - low)
                theta.append((1 - smooth) * t / s + smooth * t)
    else:  # proportional: the fastest pairs of a full head, the others 0, all over factor
        rotated = int(get("partial_rotary_factor", 1.0) * d // 2)
        theta = [t / (s or 1.0) for t in plain[:rotated]] + [0.0] * (d // 2 - rotated)
    return theta, rotated, attention


# ----- what each change must do ---------------------------------------------------------------------


def expected_outcome(config, key, value):
    """'type' or 'value' (that error, naming the key), 'either' (a ValueError naming the key, or
    the reference's numbers), 'ok' (the reference's numbers)."""
    rope_type = config.get("rope_type") or config.get("type") or "default"
    if value is MISSING or value is None:
        if key == "partial_rotary_factor" and rope_type == "longrope":
            return "either"  # the factor lists then have the wrong length
        needed = NEEDED.get(rope_type, {})
        if key in needed:
            stand_in = needed[key]
            return "ok" if stand_in and all(config.get(k) is not None for k in stand_in) else "value"
        return "ok"
    if key in FOREIGN and key not in READS.get(rope_type, set()):
        return "value"
    if key not in COMMON and key not in READS.get(rope_type, set()):
        return "ok"  # ignored with a warning (or silently, a model key); checked separately
    kind = KIND.get(key, "number")
    is_bool = isinstance(value, (bool, np.bool_))
    if kind == "flag":
        return "ok" if isinstance(value, bool) else "type"
    if kind in ("str", "section"):
        return "type" if kind == "str" and not isinstance(value, str) else "either"
    if kind == "list":
        return "either" if isinstance(value, list) else "type"
    if kind == "int":
        return "either" if isinstance(value, (int, np.integer)) and not is_bool else "type"
    if is_bool or not isinstance(value, (int, float, np.integer, np.floating)):
        return "type"
    return "value" if isinstance(value, int) and value > 2**1024 or math.isnan(value) or math.isinf(value) else "either"


def warned_keys(config):
    """The keys rope must warn about: given, not None, not read by the type, not common, not a
    model key, not foreign (those raise)."""
    rope_type = config.get("rope_type") or config.get("type") or "default"
    reads = READS.get(rope_type, set()) | COMMON | MODEL_KEYS | FOREIGN
    warned = {key for key, value in config.items() if value is not None and key not in reads}
    if rope_type == "dynamic" and config.get("alpha") is not None and config.get("factor") not in (None, 1.0):
        warned.add("factor")  # alpha wins, as in HunYuan and vLLM: a factor that would count is named
    return warned


def run(config, head_dim, seq_len):
    """rope.inv_freq's result or exception, and the keys it warned about."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = rope.inv_freq(config, head_dim, seq_len=seq_len)
        except Exception as error:  # any exception: its type is what is checked
            result = error
    named = set()
    for w in caught:
        assert issubclass(w.category, RopeConfigWarning), w
        named |= set(re.findall(r"config key '(\w+)' is ignored", str(w.message)))
    return result, named


def check_numbers(config, head_dim, seq_len, result):
    theta, attention = result
    expected, rotated, expected_attention = reference(config, head_dim, seq_len)
    assert theta.dtype == torch.float32 and theta.shape == (len(expected),)
    assert bool(torch.isfinite(theta).all())
    assert bool((theta[:rotated] > 0).all()) and bool((theta[rotated:] == 0).all())
    ref = torch.tensor(expected, dtype=torch.float64)
    error = (theta.to(torch.float64) - ref).abs()
    assert bool((error <= 0.5 * ulp(ref, torch.float32) * (1 + 1e-6) + 1e-13 * ref.abs()).all()), (theta, ref)
    assert isinstance(attention, float) and math.isfinite(attention) and attention > 0
    assert math.isclose(attention, expected_attention, rel_tol=1e-12)


def check(config, head_dim, seq_len, key, value):
    result, warned = run(config, head_dim, seq_len)
    outcome = expected_outcome(config, key, value) if key is not None else "ok"
    if isinstance(result, Exception):
        assert type(result) in (TypeError, ValueError), repr(result)
        assert outcome != "ok", repr(result)
        assert outcome != "type" or isinstance(result, TypeError), repr(result)
        assert outcome != "value" or isinstance(result, ValueError), repr(result)
        assert key is not None and names(str(result), key), (key, str(result))
        return
    assert outcome in ("ok", "either"), (outcome, key, value)
    check_numbers(config, head_dim, seq_len, result)
    assert warned == warned_keys(config)


# the types whose formula reference() writes; the other types of issue 28 (deepseek_yarn,
# deepseek_llama_scaling, telechat3-yarn, axial, mllama4, xdrope, ntk's mixed_b) have their own
# references in test_rope_types_vllm.py
ROPE_TYPES = [name for name in rope.rope_types() if name in READS]


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
@settings(max_examples=2 * settings.default.max_examples)  # the profile's, doubled (HYPOTHESIS_PROFILE)
@given(data=st.data())
def test_hostile_configs_raise_by_name_or_give_the_reference(rope_type, data):
    config, head_dim, seq_len = data.draw(legal_configs(rope_type))
    key = data.draw(st.sampled_from(sorted(config) + EXTRA_KEYS))
    choice = data.draw(st.sampled_from(["keep", *SAME_AS_NUMPY, *range(len(HOSTILE)), "element"]))
    if choice == "keep":
        return check(config, head_dim, seq_len, None, None)
    legal = config.get(key, 64 if KIND.get(key) == "int" else 2.0)
    if choice in SAME_AS_NUMPY:
        if isinstance(legal, (bool, str, list)):
            return
        value = getattr(np, choice.removeprefix("np."))(legal if choice != "np.int64" else round(legal))
    elif choice == "element":  # one entry of a list of factors
        if not isinstance(legal, list) or not legal:
            return
        value = list(legal)
        value[data.draw(st.integers(0, len(value) - 1))] = data.draw(st.sampled_from(HOSTILE[2:]))
    else:
        value = HOSTILE[choice]
    changed = {k: v for k, v in config.items() if k != key}
    if value is not MISSING:
        changed[key] = value
    check(changed, head_dim, seq_len, key, value)


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
@given(data=st.data())
def test_legal_configs_give_the_reference(rope_type, data):
    """Unchanged legal configs, and the same configs with NumPy scalars for every number: the
    reference numbers, no warning."""
    config, head_dim, seq_len = data.draw(legal_configs(rope_type))
    check(config, head_dim, seq_len, None, None)
    def numpy(v):
        if isinstance(v, list):
            return [np.float64(x) for x in v]
        return np.float64(v) if isinstance(v, float) else np.int64(v) if type(v) is int else v

    as_numpy = {key: numpy(v) for key, v in config.items()}
    result, warned = run(as_numpy, np.int64(head_dim), None if seq_len is None else np.int64(seq_len))
    assert not isinstance(result, Exception) and not warned, result
    expected, _ = run(config, head_dim, seq_len)
    assert result[0].equal(expected[0]) and result[1] == expected[1]


UNREAD_VALUES = {"factor": 2.0, "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                 "truncate": False, "attention_factor": 1.5, "short_factor": [1.0], "long_factor": [2.0],
                 "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize("rope_type", ROPE_TYPES)
@given(data=st.data())
def test_a_config_object_reads_its_fields_as_the_mapping(rope_type, data):
    """RopeConfig(**config) with a field the type does not read (legal, or hostile): the same
    warnings, word for word, the same config and the same numbers as parse_config(config)."""
    config, head_dim, seq_len = data.draw(legal_configs(rope_type))
    unread = sorted(set(UNREAD_VALUES) - READS[rope_type])
    if unread:
        key = data.draw(st.sampled_from(unread))
        config[key] = data.draw(st.sampled_from([UNREAD_VALUES[key], *HOSTILE[2:]]))
    assert set(config) <= FIELD_KEYS
    outcomes = []
    for make in (lambda: RopeConfig(**config), lambda: rope.parse_config(config)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = make()
        assert all(w.category is RopeConfigWarning for w in caught)
        outcomes.append((cfg, sorted(str(w.message) for w in caught)))
    assert outcomes[0] == outcomes[1]
    assert len(outcomes[0][1]) == len(warned_keys(config))
    result, _ = run(outcomes[0][0], head_dim, seq_len)
    check_numbers({k: v for k, v in config.items() if k not in warned_keys(config)}, head_dim, seq_len, result)
