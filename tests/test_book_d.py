"""The Phi-3.5 LongRoPE factors chapter 15 reads (rope/data/phi35_mini_longrope.json) are the ones
the model's config.json prints, at the revision the file names."""

import json
from importlib import resources

import numpy as np
import torch

import rope
from rope.frequencies import default_theta


def phi35():
    return json.loads(resources.files("rope.data").joinpath("phi35_mini_longrope.json").read_text())


def test_the_file_names_a_pinned_revision_of_the_config_it_copies():
    data = phi35()
    assert len(data["revision"]) == 40 and int(data["revision"], 16) >= 0
    assert data["source"] == (
        f"https://huggingface.co/{data['model']}/blob/{data['revision']}/config.json")


def test_the_factors_are_float32_numbers_next_to_two_decimal_values_one_per_pair():
    data = phi35()
    for key in ("short_factor", "long_factor"):
        factors = data["rope_scaling"][key]
        assert len(factors) == data["head_dim"] // 2 == 48
        assert all(b >= a for a, b in zip(factors, factors[1:]))  # non-decreasing
        as_float32 = np.array(factors, dtype=np.float32)
        assert np.array_equal(as_float32.astype(np.float64), np.array(factors)), key  # float32 values
        nearest = np.float32(np.round(np.array(factors), 2))
        assert np.abs(as_float32.view(np.int32) - nearest.view(np.int32)).max() <= 3, key  # 3 ulps
    assert data["rope_scaling"]["short_factor"][0] == 1.0
    assert data["max_position_embeddings"] // data["original_max_position_embeddings"] == 32


def test_rope_divides_each_frequency_by_its_factor_and_switches_after_the_original_length():
    data = phi35()
    config = {"rope_type": "longrope", "rope_theta": data["rope_theta"],
              "original_max_position_embeddings": data["original_max_position_embeddings"],
              "max_position_embeddings": data["max_position_embeddings"],
              "short_factor": data["rope_scaling"]["short_factor"],
              "long_factor": data["rope_scaling"]["long_factor"]}
    L, d = data["original_max_position_embeddings"], data["head_dim"]
    reference = default_theta(data["rope_theta"], d)
    for seq_len, key in ((L, "short_factor"), (L + 1, "long_factor")):
        theta, _ = rope.inv_freq(config, d, seq_len=seq_len)
        factors = torch.tensor(data["rope_scaling"][key], dtype=torch.float64)
        assert torch.allclose(theta.double(), reference / factors, rtol=2**-23, atol=0)
