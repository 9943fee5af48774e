"""rope's drop-in pieces inside a real transformers Llama: same logits as transformers' own RoPE."""

import dataclasses

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

HEAD_DIM, MAX_POSITIONS = 16, 32
ROPE_PARAMETERS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 3.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0, "original_max_position_embeddings": 8},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "original_max_position_embeddings": 16,
        "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
        "long_factor": [2.0 + 0.5 * i for i in range(HEAD_DIM // 2)],
    },
}


def tiny_llama(rope_parameters: dict, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=4 * HEAD_DIM,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters=dict(rope_parameters),
        initializer_range=0.2,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("name", list(ROPE_PARAMETERS))
def test_same_logits_with_rope_swapped_in(name, monkeypatch):
    model = tiny_llama(ROPE_PARAMETERS[name], seed=len(name))
    gen = torch.Generator().manual_seed(100 + len(name))
    # 40 tokens: past max_position_embeddings (dynamic grows its base) and the original lengths.
    tokens = torch.randint(0, 97, (2, 40), generator=gen)
    with torch.no_grad():
        expected = model(tokens).logits
        assert rope.hf.install(model) == 1
        monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", rope.hf.apply_rotary_pos_emb)
        got = model(tokens).logits
    assert isinstance(model.model.rotary_emb, rope.hf.RotaryEmbedding)
    assert got.abs().max() > 0.1  # the comparison is not between near-zero logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", list(ROPE_PARAMETERS))
def test_cos_sin_match_transformers_within_its_float32_angle_error(name):
    model = tiny_llama(ROPE_PARAMETERS[name], seed=1)
    gen = torch.Generator().manual_seed(len(name))
    position_ids = torch.randint(0, 4096, (2, 24), generator=gen)
    x = torch.randn(2, 24, 8)
    theirs = modeling_llama.LlamaRotaryEmbedding(model.config)(x, position_ids)
    ours = rope.hf.RotaryEmbedding(model.config)(x, position_ids)
    # transformers rounds the angle m * theta_i (at most 4096) to float32 before cos/sin.
    attention = rope.hf.RotaryEmbedding(model.config).frequencies(position_ids)[1]
    bound = attention * (4096 * 2.0**-24 + 2.0**-23)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert (a - b).abs().max() <= bound


def test_apply_rotary_pos_emb_equals_apply_rotary():
    """The transformers-shaped function and rope.apply_rotary agree (q as [batch, heads, seq, dim])."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 6, 32, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 32, generator=gen, dtype=torch.float64)
    position_ids = torch.randint(0, 10**5, (2, 6), generator=gen)
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5}
    embedding = rope.hf.RotaryEmbedding(rope_parameters=params, head_dim=32)
    cos, sin = embedding(q, position_ids)
    q_hf, k_hf = rope.hf.apply_rotary_pos_emb(q, k, cos, sin)
    theta, attention = rope.inv_freq(params, 32)
    q_ref, k_ref = rope.apply_rotary(
        q.transpose(1, 2), k.transpose(1, 2), position_ids, theta, attention_factor=attention
    )
    torch.testing.assert_close(q_hf, q_ref.transpose(1, 2), rtol=0, atol=1e-12)
    torch.testing.assert_close(k_hf, k_ref.transpose(1, 2), rtol=0, atol=1e-12)


def test_rotary_embedding_needs_a_config():
    with pytest.raises(ValueError, match="needs a config, or both rope_parameters and head_dim"):
        rope.hf.RotaryEmbedding(rope_parameters={"rope_type": "default"})


def test_cos_from_rotary_embedding_rotates_from_exact_angles():
    """The drop-in's cos remembers its positions and frequencies, so apply_rotary_pos_emb rotates
    from them (float64 here, the kernel on CUDA); a converted cos takes the table formula."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 6, 32, generator=gen)
    k = torch.randn(2, 2, 6, 32, generator=gen)
    position_ids = torch.randint(2**20, 2**24, (2, 6), generator=gen)
    params = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cos, sin = rope.hf.RotaryEmbedding(rope_parameters=params, head_dim=32)(q, position_ids)
    assert hasattr(cos, "rope_source")
    q_exact, k_exact = rope.hf.apply_rotary_pos_emb(q, k, cos, sin)
    theta, attention = rope.inv_freq(params, 32)
    q_ref, k_ref = rope.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), position_ids, theta,
                                     attention_factor=attention)
    assert torch.equal(q_exact, q_ref.transpose(1, 2)) and torch.equal(k_exact, k_ref.transpose(1, 2))
    q_table, _ = rope.hf.apply_rotary_pos_emb(q, k, cos * 1, sin)  # a new tensor: no source
    assert not torch.equal(q_table, q_exact)
    torch.testing.assert_close(q_table, q_exact, rtol=0, atol=1e-5)


GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}


def tiny_gemma3(seed: int):
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3ForCausalLM

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
                              max_position_embeddings=MAX_POSITIONS, sliding_window=8, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, rope_parameters=GEMMA3_ROPE, initializer_range=0.2)
    return Gemma3ForCausalLM(config).eval()


def test_layer_types_each_get_their_configuration(monkeypatch):
    """Gemma 3: sliding-window layers with base 10^4, full-attention layers with base 10^6 and
    linear scaling; one module serves both, picked by layer_type, and the logits match."""
    from transformers.models.gemma3 import modeling_gemma3

    model = tiny_gemma3(seed=3)
    assert set(model.config.layer_types) == set(GEMMA3_ROPE)
    tokens = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(tokens).logits
        assert rope.hf.install(model) == 1
        monkeypatch.setattr(modeling_gemma3, "apply_rotary_pos_emb", rope.hf.apply_rotary_pos_emb)
        got = model(tokens).logits
    embedding = model.model.rotary_emb
    assert isinstance(embedding, rope.hf.LayerTypeRotaryEmbedding) and set(embedding.layer_types) == set(GEMMA3_ROPE)
    for layer_type, params in GEMMA3_ROPE.items():
        theta, _ = rope.inv_freq(params, HEAD_DIM)
        assert torch.equal(embedding.layer_types[layer_type].inv_freq, theta)
    assert got.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)


def test_layer_type_errors():
    """The forward contracts of transformers' modules: Gemma 3's takes a layer_type it needs,
    Llama's none."""
    embedding = rope.hf.LayerTypeRotaryEmbedding(rope_parameters=GEMMA3_ROPE, head_dim=HEAD_DIM)
    x, positions = torch.randn(1, 4, 8), torch.arange(4)[None]
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'layer_type'"):
        embedding(x, positions)
    with pytest.raises(ValueError, match="layer_type must be one of 'sliding_attention', 'full_attention'"):
        embedding(x, positions, None)
    flat = rope.hf.RotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=HEAD_DIM)
    with pytest.raises(TypeError, match="takes 3 positional arguments but 4 were given"):
        flat(x, positions, "full_attention")
    for cls in (rope.hf.RotaryEmbedding, rope.hf.LayerTypeRotaryEmbedding):
        with pytest.raises(ValueError, match="mixes layer types with top-level keys"):
            cls(rope_parameters={**GEMMA3_ROPE, "rope_theta": 1e4}, head_dim=HEAD_DIM)
    with pytest.raises(ValueError, match="config is nested by layer type .*'full_attention', 'sliding_attention'"):
        rope.inv_freq(GEMMA3_ROPE, HEAD_DIM)


def test_install_refuses_a_module_it_cannot_call():
    class Odd(torch.nn.Module):  # a rotary module with another calling convention
        def forward(self, x, position_ids, scale):
            return x, x

    model = torch.nn.Module()
    model.config = tiny_llama(ROPE_PARAMETERS["default"], seed=0).config
    model.rotary_emb = Odd()
    with pytest.raises(ValueError, match=r"install: rotary_emb could not be called as rotary_emb\(x, position_ids\)"):
        rope.hf.install(model)
    assert isinstance(model.rotary_emb, Odd)


# ----- the config read as transformers reads it -----------------------------------------------


def patched_logits(model, tokens):
    """The model's logits with rope.hf.patch, and unpatched again."""
    rope.hf.patch(model)
    try:
        with torch.no_grad():
            return model(tokens).logits
    finally:
        rope.hf.unpatch(model)


def test_a_max_position_embeddings_key_inside_rope_parameters_is_ignored_as_in_transformers():
    """transformers' dynamic NTK scales from config.max_position_embeddings and ignores (warns
    "Unrecognized keys") the same key inside rope_parameters; rope reads the config's too, so the
    logits agree between the two lengths and beyond both."""
    model = tiny_llama({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0, "max_position_embeddings": 8},
                       seed=7)
    assert model.config.rope_parameters["max_position_embeddings"] == 8  # the key is there, transformers ignores it
    assert rope.hf.rope_parameters_from_config(model.config)["max_position_embeddings"] == MAX_POSITIONS
    for length in (20, 48):  # between 8 and 32, and past both
        tokens = torch.randint(0, 97, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            expected = model(tokens).logits
        assert expected.abs().max() > 0.1
        torch.testing.assert_close(patched_logits(model, tokens), expected, rtol=1e-4, atol=2e-5)


def gemma3_with_top_level_original(full_attention: dict, original: int, seed: int):
    """A tiny Gemma 3 whose full-attention layers have ``full_attention``'s RoPE, and whose config
    also has a top-level original_max_position_embeddings (as Phi-3 configs carry)."""
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3ForCausalLM

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM,
                              max_position_embeddings=MAX_POSITIONS, sliding_window=8, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, initializer_range=0.2,
                              layer_types=["sliding_attention", "full_attention"],
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                               "full_attention": dict(full_attention)},
                              original_max_position_embeddings=original)
    return Gemma3ForCausalLM(config).eval()


NESTED_WITH_TOP_LEVEL = {  # (full attention's RoPE, top-level original_max_position_embeddings)
    "longrope keeps its own": ({"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 8,
                                "factor": 4.0, "attention_factor": 1.0, "short_factor": [1.0] * (HEAD_DIM // 2),
                                "long_factor": [1.0 + i for i in range(HEAD_DIM // 2)]}, 16),
    "yarn without its own": ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, 4),
}


@pytest.mark.parametrize("name", list(NESTED_WITH_TOP_LEVEL))
def test_nested_rope_parameters_ignore_a_top_level_original_length_as_transformers_does(name):
    """Nested by layer type, transformers' standardize_rope_params only fills in a missing
    original_max_position_embeddings, from max_position_embeddings: a top-level value is not used
    (in a flat mapping it would win). rope reads the same lengths, and the logits agree at lengths
    on both sides of every one of them."""
    full_attention, original = NESTED_WITH_TOP_LEVEL[name]
    model = gemma3_with_top_level_original(full_attention, original, seed=11)
    assert model.config.original_max_position_embeddings == original
    theirs = model.config.rope_parameters["full_attention"]["original_max_position_embeddings"]
    assert theirs != original
    ours = rope.hf.rope_parameters_from_config(model.config)
    assert ours["full_attention"]["original_max_position_embeddings"] == theirs
    assert "original_max_position_embeddings" not in ours["sliding_attention"]  # default RoPE: none, as there
    for length in (12, 24, 40):
        tokens = torch.randint(3, 97, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            expected = model(tokens).logits
        assert expected.abs().max() > 0.1
        torch.testing.assert_close(patched_logits(model, tokens), expected, rtol=1e-4, atol=2e-5)


def test_a_flat_mapping_takes_the_top_level_original_length_as_transformers_does():
    """The contrast (Phi-3): in a flat mapping transformers gives the top-level
    original_max_position_embeddings priority over the mapping's own, and so does rope."""
    parameters = dict(ROPE_PARAMETERS["longrope"], original_max_position_embeddings=8)
    model = tiny_llama(parameters, seed=12)
    model.config.original_max_position_embeddings = 16
    model.config.standardize_rope_params()  # what transformers' frequency functions call at every use
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    assert model.config.rope_parameters["original_max_position_embeddings"] == 16
    ours = rope.hf.rope_parameters_from_config(model.config)
    assert ours["original_max_position_embeddings"] == 16
    tokens = torch.randint(3, 97, (1, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(tokens).logits
    torch.testing.assert_close(patched_logits(model, tokens), expected, rtol=1e-4, atol=2e-5)


def test_the_exact_tables_are_computed_once_per_forward_for_every_layer(monkeypatch):
    """On the CPU a patched model's layers rotate by the float64 cos and sin its rotary module
    computed once per forward, as transformers' layers share its tables: one computation of the
    angles for two layers, and the logits of a model whose layers recompute them."""
    model = tiny_llama({"rope_type": "default", "rope_theta": 10000.0}, seed=3)
    tokens = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    exact = rope.hf.functions._exact

    def per_layer(q, k, source, **options):  # each layer recomputes the angles from the source
        positions = source.position_ids
        fresh = rope.apply.exact_cos_sin(positions, source.inv_freq)
        return exact(q, k, dataclasses.replace(source, exact=fresh), **options)

    monkeypatch.setattr(rope.hf.functions, "_exact", per_layer)
    expected = patched_logits(model, tokens)
    monkeypatch.undo()
    rope.hf.patch(model)
    calls = []
    cos_sin = rope.angles.cos_sin
    monkeypatch.setattr(rope.apply, "cos_sin", lambda *a, **o: calls.append(1) or cos_sin(*a, **o))
    try:
        with torch.no_grad():
            got = model(tokens).logits
    finally:
        rope.hf.unpatch(model)
    assert len(calls) == 1 and model.config.num_hidden_layers == 2
    assert torch.equal(got, expected)
