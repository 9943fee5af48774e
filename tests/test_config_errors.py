"""Bad RoPE configs fail loudly, naming the key and what was expected."""

import pytest

import rope


@pytest.mark.parametrize(
    "config, head_dim, error, match",
    [
        ({"rope_type": "ntk-by-parts"}, 64, ValueError, "unknown rope_type 'ntk-by-parts'"),
        ({"rope_type": "linear"}, 64, ValueError, "rope_type 'linear' needs the config key 'factor'"),
        ({"rope_type": "dynamic", "factor": 2.0}, 64, ValueError, "needs the config key 'max_position_embeddings'"),
        ({"rope_type": "yarn", "factor": 2.0}, 64, ValueError, "needs the config key 'original_max_position_embeddings'"),
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}, 64, ValueError,
         "needs the config key 'low_freq_factor'"),
        ({"rope_type": "longrope", "original_max_position_embeddings": 4096, "short_factor": [1.0] * 32}, 64,
         ValueError, "needs the config key 'factor'"),
        ({"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": 4096,
          "short_factor": [1.0] * 31}, 64, ValueError, "must have rotary_dim/2 = 32 entries, got 31"),
        ({"rope_type": "linear", "factor": 0.5}, 64, ValueError, "'factor' must be >= 1.0, got 0.5"),
        ({"rope_type": "linear", "factor": "2"}, 64, TypeError, "'factor' must be a number"),
        ({"rope_theta": -5.0}, 64, ValueError, "'rope_theta' must be > 0"),
        ({"partial_rotary_factor": 1.5}, 64, ValueError, r"'partial_rotary_factor' must be in \(0, 1\]"),
        ({}, 63, ValueError, "must be even"),
        ({"partial_rotary_factor": 0.3}, 10, ValueError, r"int\(10 \* 0.3\) = 3 must be even"),
        ({}, 0, ValueError, "head_dim must be a positive int"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64, "truncate": "no"}, 64,
         TypeError, "'truncate' must be a bool"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
          "original_max_position_embeddings": 8192}, 64, ValueError, "high_freq_factor > low_freq_factor"),
        (["rope_type", "default"], 64, TypeError, "config must be a mapping"),
    ],
)
def test_bad_config_is_named(config, head_dim, error, match):
    with pytest.raises(error, match=match):
        rope.inv_freq(config, head_dim)


def test_bad_seq_len_is_named():
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        rope.inv_freq({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}, 64, seq_len=0)


def test_legacy_type_key_and_nulls_are_read_like_transformers():
    """Old configs say `type`; absent keys may be stored as None."""
    legacy, _ = rope.inv_freq({"type": "linear", "factor": 4.0, "beta_fast": None}, 32)
    modern, _ = rope.inv_freq({"rope_type": "linear", "factor": 4.0}, 32)
    assert legacy.equal(modern)
    plain, _ = rope.inv_freq({}, 32)
    assert not legacy.equal(plain)
