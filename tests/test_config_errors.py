"""Bad RoPE configs fail loudly, naming the key and what was expected; keys rope does not read
warn (as transformers does) or, where they carry another ecosystem's numbers, are refused."""

import contextlib
import math
import re
import warnings

import numpy as np
import pytest
import torch

import rope
from rope.config import FOREIGN_KEYS, RopeConfig, RopeConfigWarning
from rope.hf.embedding import layer_type_parameters, rope_parameters_from_config
from rope.registry import COMMON_KEYS
from rope.registry import rope_type as registered_type

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LONGROPE = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0] * 32, "long_factor": [2.0] * 32}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


@contextlib.contextmanager
def no_config_warnings():
    """A context in which a RopeConfigWarning is an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RopeConfigWarning)
        yield


@pytest.mark.parametrize(
    "config, head_dim, error, match",
    [
        ({"rope_type": "ntk-by-parts"}, 64, ValueError, "unknown rope_type 'ntk-by-parts'"),
        ({"rope_type": 3}, 64, TypeError, "'rope_type' must be a str"),
        ({"rope_type": "linear"}, 64, ValueError, "rope_type 'linear' needs the config key 'factor'"),
        ({"rope_type": "linear", "factor": None}, 64, ValueError, "rope_type 'linear' needs the config key 'factor'"),
        ({"rope_type": "dynamic", "factor": 2.0}, 64, ValueError, "needs the config key 'max_position_embeddings'"),
        ({"rope_type": "yarn", "factor": 2.0}, 64, ValueError,
         "needs the config key 'original_max_position_embeddings'"),
        ({"rope_type": "yarn", "original_max_position_embeddings": 64}, 64, ValueError,
         r"needs the config key 'factor' \(or 'max_position_embeddings' and 'original_max_position_embeddings'\)"),
        ({**LLAMA3, "low_freq_factor": None}, 64, ValueError, "needs the config key 'low_freq_factor'"),
        ({**LONGROPE, "factor": None}, 64, ValueError, "needs the config key 'factor'"),
        ({**LONGROPE, "long_factor": None}, 64, ValueError, "needs the config key 'long_factor'"),
        ({**LONGROPE, "short_factor": [1.0] * 31}, 64, ValueError,
         r"'short_factor' must have rotary_dim/2 = 32 entries .*partial_rotary_factor.*got 31"),
        ({**LONGROPE, "long_factor": [1.0] * 33}, 64, ValueError, "'long_factor' must have rotary_dim/2 = 32"),
        ({**LONGROPE, "short_factor": "1.0"}, 64, TypeError, "'short_factor' must be a list of numbers"),
        ({**LONGROPE, "short_factor": [1.0] * 31 + [0.0]}, 64, ValueError, r"'short_factor'\[31\] must be > 0"),
        ({**LONGROPE, "long_factor": [1.0] * 31 + [math.nan]}, 64, ValueError, r"'long_factor'\[31\] must be finite"),
        ({"rope_type": "linear", "factor": 0.5}, 64, ValueError, "'factor' must be >= 1.0, got 0.5"),
        ({"rope_type": "linear", "factor": "2"}, 64, TypeError, "'factor' must be a real number"),
        ({"rope_type": "linear", "factor": True}, 64, TypeError, "'factor' must be a real number"),
        ({"rope_type": "linear", "factor": [2.0]}, 64, TypeError, "'factor' must be a real number"),
        ({"rope_type": "linear", "factor": math.inf}, 64, ValueError, "'factor' must be finite"),
        ({"rope_type": "linear", "factor": 10**400}, 64, ValueError, "'factor' is too large for a float"),
        ({"rope_theta": -5.0}, 64, ValueError, "'rope_theta' must be > 1"),
        ({"rope_theta": 1.0}, 64, ValueError, "'rope_theta' must be > 1"),
        ({"rope_theta": math.nan}, 64, ValueError, "'rope_theta' must be finite"),
        ({"partial_rotary_factor": 1.5}, 64, ValueError, r"'partial_rotary_factor' must be in \(0, 1\]"),
        ({"partial_rotary_factor": 0.0}, 64, ValueError, r"'partial_rotary_factor' must be in \(0, 1\]"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096.0}, 64, TypeError,
         "'max_position_embeddings' must be an int, got float"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 0}, 64, ValueError,
         "'max_position_embeddings' must be >= 1"),
        ({**YARN, "original_max_position_embeddings": 2**64}, 64, ValueError,
         "'original_max_position_embeddings' must be <= 9223372036854775808"),
        ({}, 63, ValueError, "must be even"),
        ({"partial_rotary_factor": 0.3}, 10, ValueError, r"int\(10 \* 0.3\) = 3 must be even"),
        ({}, 0, ValueError, "head_dim must be >= 1"),
        ({}, 64.0, TypeError, "head_dim must be an int"),
        ({}, True, TypeError, "head_dim must be an int"),
        ({**YARN, "truncate": "no"}, 64, TypeError, "'truncate' must be a bool"),
        ({**YARN, "truncate": 0}, 64, TypeError, "'truncate' must be a bool"),
        ({**YARN, "truncate": np.bool_(True)}, 64, TypeError, "'truncate' must be a bool"),
        ({**YARN, "attention_factor": 0.0}, 64, ValueError, "'attention_factor' must be > 0"),
        ({**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}, 64, ValueError,
         "high_freq_factor > low_freq_factor"),
        ({**LLAMA3, "low_freq_factor": -1.0}, 64, ValueError, "'low_freq_factor' must be > 0"),
        (["rope_type", "default"], 64, TypeError, "config must be a mapping"),
        ({1: 2.0}, 64, TypeError, "config keys must be str"),
        ({"rope_type": "linear", "type": "yarn", "factor": 2.0}, 64, ValueError,
         "'rope_type' \\('linear'\\) and 'type' \\('yarn'\\) disagree"),
        ({"full_attention": {"rope_type": "default"}}, 64, ValueError, "nested by layer type"),
    ],
)
def test_bad_config_is_named(config, head_dim, error, match):
    with pytest.raises(error, match=match):
        rope.inv_freq(config, head_dim)


# ----- numeric edge cases: a ValueError naming the key, never ZeroDivisionError, OverflowError,
# a math domain error or a frequency that is 0, inf or NaN in float32 -----------------------------


@pytest.mark.parametrize(
    "config, head_dim, seq_len, match",
    [
        ({**YARN, "beta_fast": -32.0}, 64, None, "'beta_fast' must be > 0"),
        ({**YARN, "beta_slow": 0.0}, 64, None, "'beta_slow' must be > 0"),
        ({**YARN, "beta_fast": 1.0, "beta_slow": 32.0}, 64, None, "'beta_fast' .* and 'beta_slow' .* must satisfy"),
        ({**YARN, "beta_slow": 40.0}, 64, None, "'beta_fast' \\(32.0\\) and 'beta_slow' \\(40.0\\)"),
        # mscale(4, m) = 0.1 m ln 4 + 1 = 0: a zero divisor
        ({**YARN, "mscale": 1.0, "mscale_all_dim": -10 / math.log(4.0)}, 64, None, "'mscale_all_dim' .* <= 0"),
        ({**YARN, "mscale": -20.0, "mscale_all_dim": 1.0}, 64, None, "'mscale' = -20.0 .* <= 0"),
        ({**LONGROPE, "original_max_position_embeddings": 1}, 64, None, "original_max_position_embeddings >= 2"),
        ({"rope_type": "ntk_aware", "factor": 2.0}, 2, None, "rotary dimension d >= 4 .*head_dim"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}, 2, None, "d >= 4 .*head_dim"),
        ({"rope_type": "ntk_aware", "factor": 1e300}, 4, None, "overflows float64; .*'factor' = 1e\\+300"),
        ({"rope_type": "ntk", "factor": 1e300}, 4, None, "0.0 in float32.*'factor' = 1e\\+300"),
        ({"rope_type": "dynamic", "factor": 1e300, "max_position_embeddings": 16}, 4, 2**62,
         "overflows float64; .*'seq_len' = 4611686018427387904"),
        ({"rope_type": "linear", "factor": 1e300}, 64, None, "0.0 in float32.*'factor' = 1e\\+300"),
        ({**YARN, "factor": 1e300}, 64, None, "0.0 in float32.*'factor' = 1e\\+300"),
        ({**LLAMA3, "factor": 1e300}, 64, None, "0.0 in float32.*'factor' = 1e\\+300"),
        ({"rope_type": "proportional", "rope_theta": 1e4, "factor": 1e300, "partial_rotary_factor": 0.5}, 64, None,
         "0.0 in float32.*'factor' = 1e\\+300"),
        ({**LONGROPE, "short_factor": [1e300] * 32}, 64, None, "0.0 in float32.*'short_factor'"),
        ({"rope_theta": 1e300}, 64, None, "0.0 in float32.*'rope_theta' = 1e\\+300"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}, 64, 10**400,
         "seq_len must be <= 9223372036854775808"),
        ({}, 64, 0, "seq_len must be >= 1"),
    ],
)
def test_degenerate_numbers_are_refused_by_name(config, head_dim, seq_len, match):
    with pytest.raises(ValueError, match=match):
        rope.inv_freq(config, head_dim, seq_len=seq_len)


@pytest.mark.parametrize("seq_len, error", [(2.0, TypeError), (True, TypeError), ("8", TypeError), ([8], TypeError)])
def test_seq_len_must_be_an_int(seq_len, error):
    with pytest.raises(error, match="seq_len must be an int"):
        rope.inv_freq({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}, 64, seq_len=seq_len)


def test_numpy_integers_are_integers():
    config = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16}
    expected = rope.inv_freq(config, 64, seq_len=40)
    for kind in (np.int64, np.int32, np.uint16):
        got = rope.inv_freq({**config, "max_position_embeddings": kind(16)}, kind(64), seq_len=kind(40))
        assert got[0].equal(expected[0]) and got[1] == expected[1]


def test_equal_betas_give_the_guarded_step_ramp():
    """beta_fast == beta_slow is legal: untruncated, the ramp has zero width and transformers'
    +0.001 guard turns it into a step at x = i(beta): pairs i <= x keep theta_i, pairs above are
    divided by s, exactly."""
    d, base, length, s, beta = 64, 1e4, 4096, 8.0, 4.0
    config = {**YARN, "rope_theta": base, "factor": s, "original_max_position_embeddings": length,
              "beta_fast": beta, "beta_slow": beta, "truncate": False}
    theta, attention = rope.inv_freq(config, d)
    x = d * math.log(length / (beta * 2 * math.pi)) / (2 * math.log(base))
    i = torch.arange(d // 2, dtype=torch.float64)
    plain = base ** (-2 * i / d)
    assert 1 < x < d // 2 - 1 and x % 1 < 0.99
    assert theta.equal(torch.where(i <= x, plain, plain / s).to(torch.float32))
    assert attention == pytest.approx(0.1 * math.log(s) + 1, rel=1e-15)


def test_proportional_zeros_are_the_only_zeros():
    theta, _ = rope.inv_freq({"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}, 64)
    assert theta.dtype == torch.float32 and theta.shape == (32,)
    assert (theta[:8] > 0).all() and (theta[8:] == 0).all()


def test_legacy_type_key_and_nulls_are_read_like_transformers():
    """Old configs say `type`; absent keys may be stored as None (and are then not warned about);
    Qwen2-VL's configs say `type: mrope` beside `rope_type: default`."""
    with no_config_warnings():
        legacy, _ = rope.inv_freq({"type": "linear", "factor": 4.0, "beta_fast": None, "base": None}, 32)
        modern, _ = rope.inv_freq({"rope_type": "linear", "factor": 4.0}, 32)
        qwen2_vl = rope.parse_config({"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24]})
    assert legacy.equal(modern)
    plain, _ = rope.inv_freq({}, 32)
    assert not legacy.equal(plain)
    assert qwen2_vl.rope_type == "default" and qwen2_vl.mrope_section == (16, 24, 24)


def test_a_config_object_is_checked_when_made():
    with pytest.raises(TypeError, match="config key 'factor' must be a real number"):
        RopeConfig(rope_type="linear", factor="2")
    with pytest.raises(ValueError, match="rope_type 'linear' needs the config key 'factor'"):
        RopeConfig(rope_type="linear")
    with pytest.raises(ValueError, match="unknown rope_type 'ntk-by-parts'"):
        RopeConfig(rope_type="ntk-by-parts")
    assert RopeConfig(rope_type="linear", factor=np.int64(2)).factor == 2.0


# ----- the key policy ------------------------------------------------------------------------------


FOREIGN = [
    ("base", "rope_theta"), ("theta", "rope_theta"), ("rotary_emb_base", "rope_theta"), ("rotary_base", "rope_theta"),
    ("rope_freq_base", "rope_theta"), ("rope_ratio", "rope_theta"), ("scaling_factor", "factor"),
    ("rope_scaling_factor", "factor"), ("rope_freq_scale", "factor"), ("attn_factor", "attention_factor"),
    ("attention_scaling", "attention_factor"), ("extrapolation_factor", "no key"), ("alpha", "rope_type 'ntk_aware'"),
    ("mixed_b", "rope_type 'ntk'"), ("short_mscale", "attention_factor"), ("long_mscale", "attention_factor"),
    ("rotary_pct", "partial_rotary_factor"), ("rotary_percentage", "partial_rotary_factor"),
    ("rotary_dim", "partial_rotary_factor"), ("use_fope", "rope.apply_fope"), ("num_inv_freq", "rope.apply_fope"),
    ("fope_sep_head", "rope.apply_fope"), ("fope_init_factor", "rope.apply_fope"),
]


@pytest.mark.parametrize("key, ropes_key", FOREIGN)
def test_keys_of_other_ecosystems_are_refused_with_ropes_key(key, ropes_key):
    """A key with a numeric meaning elsewhere (vLLM, HunYuan, llama.cpp, GPT-NeoX ...) would change
    the numbers if honoured and silently leave them wrong if ignored: refused, naming rope's key."""
    with pytest.raises(ValueError, match=f"config key '{key}' is not rope's: .*{re.escape(ropes_key)}"):
        rope.inv_freq({**YARN, key: 2.0}, 64)


def test_every_foreign_key_is_tested():
    assert {key for key, _ in FOREIGN} == set(FOREIGN_KEYS)


def test_a_misspelled_key_warns_with_the_closest_key_and_is_ignored():
    message = "'rope_thetaa' is ignored: rope does not know it; did you mean 'rope_theta'"
    with pytest.warns(RopeConfigWarning, match=message):
        theta, _ = rope.inv_freq({"rope_thetaa": 5e5}, 32)
    assert theta.equal(rope.inv_freq({}, 32)[0])


@pytest.mark.parametrize(
    "config, key, readers",
    [
        ({**YARN, "low_freq_factor": 1.0}, "low_freq_factor", "'llama3'"),
        ({"rope_type": "linear", "factor": 2.0, "short_factor": [1.0] * 16}, "short_factor", "'longrope'"),
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 16, "mscale": 1.0}, "mscale", "'yarn'"),
        ({"rope_type": "default", "factor": 2.0}, "factor", "'linear'"),
    ],
)
def test_a_key_the_type_does_not_read_warns_and_changes_nothing(config, key, readers):
    message = f"'{key}' is ignored: rope_type '{config['rope_type']}' does not read it \\(only .*{readers}"
    with pytest.warns(RopeConfigWarning, match=message):
        got = rope.inv_freq(config, 32)
    without = {k: v for k, v in config.items() if k != key}
    expected = rope.inv_freq(without, 32)
    assert got[0].equal(expected[0]) and got[1] == expected[1]


def test_keys_models_read_outside_the_rotary_embedding_are_accepted_silently():
    """Ministral 3 keeps llama_4_scaling_beta (a query scale by position) in rope_parameters."""
    with no_config_warnings():
        theta, _ = rope.inv_freq({**YARN, "llama_4_scaling_beta": 0.1}, 64)
    assert theta.equal(rope.inv_freq(YARN, 64)[0])


def test_mrope_style_keys_must_agree():
    assert rope.parse_config({"mrope_section": [2, 1, 1], "interleaved": True}).mrope_style == "interleaved"
    with pytest.raises(ValueError, match="'mrope_interleaved' \\(False\\) and 'interleaved' \\(True\\) disagree"):
        rope.parse_config({"mrope_section": [2, 1, 1], "interleaved": True, "mrope_interleaved": False})
    with pytest.raises(TypeError, match="'interleaved' must be a bool"):
        rope.parse_config({"mrope_section": [2, 1, 1], "interleaved": "yes"})


def transformers_key_sets(required_only: bool = False) -> dict[str, set[str]]:
    """Per rope_type, the keys transformers' ``_validate_<type>_rope_parameters`` accepts
    (required and optional, plus partial_rotary_factor, which ``_check_received_keys`` adds), or
    with ``required_only`` the keys it requires."""
    from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

    recorded = {}

    class Probe:
        max_position_embeddings, head_dim, hidden_size, num_attention_heads = 8192, 64, 256, 4

        @staticmethod
        def _check_received_keys(rope_type, received_keys, required_keys, optional_keys=None, ignore_keys=None):
            recorded[rope_type] = set(required_keys) if required_only else (
                set(required_keys) | set(optional_keys or ()) | {"partial_rotary_factor"})

    params = {"rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 2048, "attention_factor": 1.0,
              "beta_fast": 32.0, "beta_slow": 1.0, "short_factor": [1.0] * 32, "long_factor": [1.0] * 32,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0, "partial_rotary_factor": 1.0}
    for name in dir(RotaryEmbeddingConfigMixin):
        match = re.fullmatch(r"_validate_(\w+)_rope_parameters", name)
        if match and match.group(1) != "axial":
            getattr(RotaryEmbeddingConfigMixin, name)(Probe(), {**params, "rope_type": match.group(1)})
    return recorded


def test_rope_reads_every_key_transformers_accepts():
    """The key sets mirror transformers': a config with every key transformers accepts for a type
    is read by rope without a warning, so real model configs do not warn."""
    key_sets = transformers_key_sets()
    assert set(key_sets) <= set(rope.rope_types()) and {"default", "yarn", "llama3", "longrope"} <= set(key_sets)
    values = {"rope_theta": 5e5, "factor": 4.0, "original_max_position_embeddings": 2048, "attention_factor": 1.2,
              "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "truncate": False,
              "short_factor": [1.0] * 32, "long_factor": [1.5] * 32, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "partial_rotary_factor": 1.0}
    for rope_type, keys in key_sets.items():
        assert keys <= registered_type(rope_type).keys | COMMON_KEYS, rope_type
        # rope.hf folds the model's max_position_embeddings into every mapping (dynamic reads it)
        config = {key: values[key] for key in keys if key != "rope_type"} | {"max_position_embeddings": 8192}
        with no_config_warnings():
            theta, attention = rope.inv_freq({"rope_type": rope_type, **config}, 64)
        assert theta.dtype == torch.float32 and math.isfinite(attention)


@pytest.mark.parametrize("model_type", ["llama", "phi3", "gpt_oss", "apertus", "ministral3", "deepseek_v3",
                                        "gemma3_text", "gemma4_text", "qwen3_5", "qwen2_5_vl"])
def test_model_configs_parse_without_warnings(model_type):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type)
    config = getattr(config, "text_config", None) or config
    params = rope_parameters_from_config(config)
    per_type = layer_type_parameters(params)
    with no_config_warnings():
        for p in per_type.values() if per_type is not None else [params]:
            rope.parse_config(p)


# ----- rope_theta: needed where transformers needs it --------------------------------------------


def test_rope_theta_is_needed_exactly_where_transformers_needs_it():
    """transformers requires rope_theta for llama3 and proportional (a legacy rope_scaling block of
    Llama 3.1 does not carry its 500000) and defaults it to 10000 for the others: rope too."""
    required = transformers_key_sets(required_only=True)
    assert {name for name, keys in required.items() if "rope_theta" in keys} == {"llama3", "proportional"}
    for name in required:
        assert ("rope_theta" in registered_type(name).required) == ("rope_theta" in required[name]), name


PROPORTIONAL = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}


@pytest.mark.parametrize("config", [LLAMA3, PROPORTIONAL])
@pytest.mark.parametrize("missing", ["absent", None])
def test_llama3_and_proportional_without_rope_theta_are_refused(config, missing):
    without = {key: value for key, value in config.items() if key != "rope_theta"}
    if missing is None:
        without["rope_theta"] = None
    message = f"rope_type '{config['rope_type']}' needs the config key 'rope_theta'.*500000"
    with pytest.raises(ValueError, match=message):
        rope.inv_freq(without, 64)
    with pytest.raises(ValueError, match="needs the config key 'rope_theta'"):
        RopeConfig(**{key: value for key, value in without.items()
                      if key not in ("original_max_position_embeddings", "rope_theta")} | {"rope_theta": None})


@pytest.mark.parametrize("config", [{}, {"rope_type": "linear", "factor": 3.0}, YARN, LONGROPE,
                                    {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}])
def test_other_types_default_rope_theta_to_10000(config):
    with no_config_warnings():
        theta, attention = rope.inv_freq(config, 64)
        given, given_attention = rope.inv_freq({**config, "rope_theta": 10000.0}, 64)
    assert theta.equal(given) and attention == given_attention
    assert rope.parse_config(config).rope_theta == 10000.0


# ----- yarn's truncate: None -----------------------------------------------------------------------


def test_yarn_truncate_none_means_false_as_in_transformers():
    """transformers reads get("truncate", True): a stored None is falsy, no truncation."""
    # bases from 10^2.5 up: below about 21 the whole correction range lies past the 64 pairs and
    # truncating it changes nothing
    base = 10.0 ** (2.5 + 3.5 * torch.rand(()).item())
    config = {**YARN, "rope_theta": base, "original_max_position_embeddings": 4096, "factor": 16.0}
    with no_config_warnings():
        assert rope.parse_config({**config, "truncate": None}).truncate is False
        none, _ = rope.inv_freq({**config, "truncate": None}, 128)
        false, _ = rope.inv_freq({**config, "truncate": False}, 128)
        true, _ = rope.inv_freq(config, 128)
        rope.parse_config({"rope_type": "linear", "factor": 2.0, "truncate": None})  # absent there: no warning
    assert none.equal(false) and not none.equal(true)
    assert rope.parse_config(config).truncate is True and RopeConfig(**{**config, "truncate": None}).truncate is True


# ----- a RopeConfig made directly reads its fields as parse_config reads the keys -------------------


@pytest.mark.parametrize("fields", [
    {"factor": 8.0},
    {"rope_type": "linear", "factor": 2.0, "attention_factor": 0.5},
    {"rope_type": "linear", "factor": 2.0, "truncate": True},
    {**{k: v for k, v in YARN.items()}, "low_freq_factor": 1.0, "short_factor": [1.0] * 32},
    {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64, "mscale": "not a number"},
])
def test_a_config_object_warns_about_fields_its_type_does_not_read(fields):
    with warnings.catch_warnings(record=True) as direct:
        warnings.simplefilter("always")
        made = RopeConfig(**fields)
    with warnings.catch_warnings(record=True) as parsed:
        warnings.simplefilter("always")
        expected = rope.parse_config(fields)
    messages = sorted(str(w.message) for w in direct)
    assert messages and messages == sorted(str(w.message) for w in parsed)
    assert all(w.category is RopeConfigWarning and w.filename == __file__ for w in direct + parsed)
    assert made == expected  # the ignored fields are dropped
    unread = set(fields) - registered_type(made.rope_type).keys - COMMON_KEYS
    assert all(getattr(made, key) == getattr(RopeConfig(), key) for key in unread)  # None, truncate True


# ----- a factor below 1 derived from the two lengths warns -----------------------------------------


@pytest.mark.parametrize("config", [YARN, LONGROPE])
def test_a_derived_factor_below_one_warns_naming_both_lengths(config):
    original = int(torch.randint(1024, 65536, ()).item())
    longer = int(torch.randint(2, original, ()).item())
    without = {key: value for key, value in config.items() if key != "factor"}
    given = {**without, "max_position_embeddings": longer, "original_max_position_embeddings": original}
    message = (f"max_position_embeddings / original_max_position_embeddings = {longer} / {original} = "
               f"{re.escape(str(longer / original))} < 1")
    with pytest.warns(RopeConfigWarning, match=message):
        cfg = rope.parse_config(given)
    assert cfg.extension_factor() == longer / original
    with no_config_warnings():  # an extension, or an explicit factor, does not warn
        rope.parse_config({**given, "max_position_embeddings": original + longer})
        rope.parse_config({**given, "factor": 2.0})


# ----- extreme yarn betas -------------------------------------------------------------------------


@pytest.mark.parametrize("betas, key", [
    ({"beta_fast": 1e308}, "beta_fast"),
    ({"beta_fast": 3e307, "truncate": False}, "beta_fast"),
    ({"beta_slow": 1e-308}, "beta_slow"),
    ({"beta_slow": 1e-308, "beta_fast": 1e-308}, "beta_fast"),
])
def test_betas_without_a_finite_correction_range_are_named(betas, key):
    with pytest.raises(ValueError, match=f"{key} = .*'?original_max_position_embeddings'? = 64.*not a finite"):
        rope.inv_freq({**YARN, **betas}, 64)


def test_extreme_betas_give_the_formula_or_a_named_error():
    """Betas over the whole float64 range: where L / (2 pi beta) is a finite number > 0 the bounds
    i(beta) = d ln(L / (2 pi beta)) / (2 ln b) are used (untruncated here), else a ValueError
    naming the beta; never a math domain error or an OverflowError."""
    from rope.frequencies import yarn_correction_range

    d, base, length = 64, 1e4, 4096
    for _ in range(200):
        fast, slow = sorted((10.0 ** (616 * torch.rand(2, dtype=torch.float64) - 308)).tolist(), reverse=True)
        ratios = {key: length / (beta * 2 * math.pi) for key, beta in (("beta_fast", fast), ("beta_slow", slow))}
        bad = [key for key, r in ratios.items() if not (math.isfinite(r) and r > 0)]
        config = {**YARN, "rope_theta": base, "original_max_position_embeddings": length, "beta_fast": fast,
                  "beta_slow": slow, "truncate": False}
        if bad:
            with pytest.raises(ValueError, match=f"i\\({bad[0]}\\)"):
                rope.inv_freq(config, d)
            with pytest.raises(ValueError, match=bad[0]):
                yarn_correction_range(d, base, length, fast, slow, False)
            continue
        low, high = (d * math.log(r) / (2 * math.log(base)) for r in ratios.values())
        assert yarn_correction_range(d, base, length, fast, slow, False) == (max(low, 0), min(high, d - 1))
        theta, attention = rope.inv_freq(config, d)
        assert bool(torch.isfinite(theta).all() & (theta > 0).all()) and math.isfinite(attention)


# ----- type: mrope beside a rope_type ---------------------------------------------------------------


def test_type_mrope_marks_mrope_beside_any_rope_type_as_in_transformers():
    """Qwen2.5-VL configs extended with yarn say type: mrope and rope_type: yarn; transformers reads
    the rope_type (it wins over type). A genuine disagreement is still refused."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig

    section = [16, 24, 24]
    params = {"type": "mrope", "rope_type": "yarn", "mrope_section": section, "factor": 4.0,
              "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    transformers.logging.set_verbosity_error()
    theirs = Qwen2_5_VLTextConfig(rope_parameters=dict(params), max_position_embeddings=131072).rope_parameters
    with no_config_warnings():
        cfg = rope.parse_config(params)
        without_type = rope.parse_config({k: v for k, v in params.items() if k != "type"})
    assert cfg.rope_type == theirs["rope_type"] == "yarn" and cfg == without_type
    assert cfg.mrope_section == tuple(section)
    with pytest.raises(ValueError, match="'mrope_section'"):
        rope.parse_config({k: v for k, v in params.items() if k != "mrope_section"})
    for rope_type, legacy in (("yarn", "linear"), ("mrope", "yarn")):
        with pytest.raises(ValueError, match="disagree"):
            rope.parse_config({**params, "rope_type": rope_type, "type": legacy})


# ----- pickling and copying -----------------------------------------------------------------------


def test_a_config_pickles_and_deep_copies_read_only():
    import copy
    import pickle

    from rope.registry import unregister_rope_type

    def frequencies(cfg, dim, seq_len):
        return (cfg.rope_theta ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim) / cfg.extra["k"]).float(), 1.0

    rope.register_rope_type("pickled_type", frequencies, required_keys=("k",))
    try:
        configs = [rope.parse_config({**YARN, "rope_theta": 1e4 + 1e6 * torch.rand(()).item(), "truncate": False}),
                   rope.parse_config(LLAMA3),
                   RopeConfig(rope_type="pickled_type", extra={"k": 2.0 + torch.rand(()).item()})]
        for cfg in configs:
            for other in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg), copy.copy(cfg)):
                assert other == cfg and hash(other) == hash(cfg) and other.extra == cfg.extra
                with pytest.raises(TypeError):
                    other.extra["k"] = 3.0  # still read-only
                with pytest.raises(AttributeError):
                    other.factor = 3.0
                ours, attention = rope.inv_freq(other, 64)
                expected, expected_attention = rope.inv_freq(cfg, 64)
                assert ours.equal(expected) and attention == expected_attention
    finally:
        unregister_rope_type("pickled_type")


# ----- default_theta ------------------------------------------------------------------------------


def test_default_theta_is_the_formula_and_checks_its_arguments():
    from rope.frequencies import default_theta

    base, dim = 1 + 1e6 * torch.rand(()).item(), 2 * int(torch.randint(1, 128, ()).item())
    expected = torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    torch.testing.assert_close(default_theta(base, dim), expected, rtol=4 * 2.0**-52, atol=0)
    assert default_theta(np.float32(2.0), np.int64(4)).dtype == torch.float64
    for args, error, match in [((-1.0, 4), ValueError, "base must be > 0"), ((0.0, 4), ValueError, "base must be > 0"),
                               ((math.nan, 4), ValueError, "base must be finite"),
                               ((math.inf, 4), ValueError, "base must be finite"),
                               ((True, 4), TypeError, "base must be a real number"),
                               (("1e4", 4), TypeError, "base must be a real number"),
                               ((1e4, 3), ValueError, "dim must be even"), ((1e4, 0), ValueError, "dim must be >= 2"),
                               ((1e4, 2.5), TypeError, "dim must be an int"), ((1e4, True), TypeError, "dim must be")]:
        with pytest.raises(error, match=match):
            default_theta(*args)
