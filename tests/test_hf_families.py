"""rope.hf across transformers' model families: for each family rope.hf.FAMILIES listed by hand (``EARLIER``), a tiny
randomly initialised model gives the same logits after rope.hf.install (rope's cos/sin tables, in
the family's table form) and again with the model's apply function(s) replaced by rope's (exact
angles); tables rope does not reproduce are refused, the model untouched. The helpers here
(``CASES``, ``tiny_model``, ``family_tokens``, ``LOGITS_TOLERANCE``) serve tests/test_hf_patch.py too."""

import importlib

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")

from rope.hf.coverage import LOGITS_TOLERANCE, sample_tokens, tiny_config  # noqa: E402

SEEDS = {"deepseek_v3": (6, 7), "gemma4_text": (9, 10)}  # (weights, tokens); others: seeds()
EARLIER = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "phi", "gemma", "gemma2", "gemma3_text", "gpt_neox",
           "stablelm", "persimmon", "olmo2", "olmo3", "granite", "starcoder2", "smollm3", "seed_oss",
           "exaone4", "nemotron", "lfm2", "minimax", "hunyuan_v1_dense", "apertus", "vaultgemma", "glm", "glm4",
           "ernie4_5", "helium", "cohere", "cohere2", "gpt_oss", "deepseek_v3", "gemma4_text", "llama4_text")
"""The model types rope.hf.FAMILIES listed by hand before rope.hf.coverage generated it; checked
here function by function (tests/test_hf_coverage.py checks every covered type through patch)."""
CASES = [pytest.param(model_type, {}, id=model_type) for model_type in EARLIER] + [
    pytest.param("deepseek_v3", {"rope_interleave": False}, id="deepseek_v3-rope_interleave=False")]
"""(model_type, options of its config) for the earlier families, and DeepSeek-V3's other apply function."""


def seeds(model_type: str) -> tuple[int, int]:
    """The seeds of the family's weights and of the tokens its logits are compared on."""
    return SEEDS.get(model_type, (len(model_type), 1))


def tiny_model(model_type: str, **options):
    """A randomly initialised model of ``model_type`` (rope.hf.coverage.tiny_model), in eval mode."""
    from rope.hf.coverage import tiny_model as build
    return build(model_type, seed=seeds(model_type)[0], config=tiny_config(model_type, **options))


def family_tokens(model_type: str) -> torch.Tensor:
    """The tokens the family's logits are compared on (:func:`seeds`)."""
    return sample_tokens(seeds(model_type)[1])


def assert_same_logits(model, patches: dict, monkeypatch, seed: int = 1):
    """The model's logits, then with rope.hf.install, then also with ``patches`` (the names of
    the model module's functions -> rope's) set: all equal. Returns the installed model."""
    tokens = sample_tokens(seed)
    with torch.no_grad():
        expected = model(tokens).logits
        assert expected.abs().max() > 0.1
        assert rope.hf.install(model) >= 1
        torch.testing.assert_close(model(tokens).logits, expected, **LOGITS_TOLERANCE)
        module = importlib.import_module(type(model).__module__)
        for name, function in patches.items():
            monkeypatch.setattr(module, name, function)
        torch.testing.assert_close(model(tokens).logits, expected, **LOGITS_TOLERANCE)
    return model


@pytest.mark.parametrize("model_type, options", CASES)
def test_same_logits(model_type, options, monkeypatch):
    convention = rope.hf.FAMILIES[model_type]
    model = assert_same_logits(tiny_model(model_type, **options), dict(convention.functions), monkeypatch,
                               seed=seeds(model_type)[1])
    embeddings = [m for m in model.modules() if isinstance(m, rope.hf.RotaryEmbedding)]
    assert embeddings and {m.tables for m in embeddings} == {convention.tables}


def test_install_refuses_tables_it_does_not_reproduce():
    """A rotary module with frequencies the config does not give (here doubled) matches no table
    form: install raises and leaves the model as it was."""
    model = tiny_model("llama")

    class Doubled(type(model.model.rotary_emb)):
        def __init__(self, config):
            super().__init__(config)
            self.inv_freq = self.inv_freq * 2

    original = model.model.rotary_emb = Doubled(model.config)
    with pytest.raises(ValueError, match=r"model.rotary_emb \(Doubled\) is not reproduced .*\(rotate_half: off by"):
        rope.hf.install(model)
    assert model.model.rotary_emb is original


def test_the_pairing_matters():
    """The half-split function in an interleaved family changes the logits: the family test above
    would notice a wrong choice."""
    model = tiny_model("glm")
    tokens = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    module = importlib.import_module(type(model).__module__)
    with torch.no_grad():
        expected = model(tokens).logits
        rope.hf.install(model)
        original = module.apply_rotary_pos_emb
        try:
            module.apply_rotary_pos_emb = rope.hf.apply_rotary_pos_emb
            wrong = model(tokens).logits
        finally:
            module.apply_rotary_pos_emb = original
    assert (wrong - expected).abs().max() > 0.1


def test_interleaved_function_equals_apply_rotary():
    """apply_rotary_pos_emb_interleaved, from the tables or from the exact source, is the
    interleaved rotation of rope.apply_rotary (partial rotary: the tail passes through)."""
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 4, 6, 32, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 32, generator=gen, dtype=torch.float64)
    position_ids = torch.randint(0, 4096, (2, 6), generator=gen)
    params = {"rope_theta": 1e4, "partial_rotary_factor": 0.5}
    cos, sin = rope.hf.RotaryEmbedding(rope_parameters=params, head_dim=32)(q, position_ids)
    theta, _ = rope.inv_freq(params, 32)
    expected = rope.apply_rotary(q.transpose(1, 2), k.transpose(1, 2), position_ids, theta, layout="interleaved")
    exact = rope.hf.apply_rotary_pos_emb_interleaved(q, k, cos, sin)
    table = rope.hf.apply_rotary_pos_emb_interleaved(q, k, cos * 1, sin)  # no source: the table formula
    for got in (exact, table):
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b.transpose(1, 2), rtol=0, atol=1e-12)


def test_half_split_function_on_interleaved_tables_raises():
    """Tables with each angle twice in a row belong to models that pair (2i, 2i + 1): the
    half-split apply function on them (from rope's module) is refused with the right name."""
    model = tiny_model("cohere")
    rope.hf.install(model)
    q = torch.randn(1, 4, 5, 16)
    cos, sin = model.model.rotary_emb(q, torch.arange(5)[None])
    with pytest.raises(ValueError, match="use rope.hf.apply_rotary_pos_emb_interleaved_tables"):
        rope.hf.apply_rotary_pos_emb(q, q, cos, sin)
    rope.hf.apply_rotary_pos_emb_interleaved_tables(q, q, cos, sin)


def test_complex_function_equals_apply_rotary_and_llama4():
    """apply_rotary_emb_complex from rope's freqs_cis is rope.apply_rotary in the interleaved
    layout (exact angles); from a foreign freqs_cis it is Llama 4's complex product."""
    from transformers.models.llama4.modeling_llama4 import apply_rotary_emb

    gen = torch.Generator().manual_seed(12)
    q = torch.randn(2, 5, 3, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 5, 1, 16, generator=gen, dtype=torch.float64)
    position_ids = torch.randint(0, 2**20, (2, 5), generator=gen)
    params = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    freqs_cis = rope.hf.RotaryEmbedding(rope_parameters=params, head_dim=16, tables="complex")(q, position_ids)
    assert freqs_cis.dtype == torch.complex64 and freqs_cis.shape == (2, 5, 8)
    theta, _ = rope.inv_freq(params, 16)
    expected = rope.apply_rotary(q, k, position_ids, theta, layout="interleaved")
    for a, b in zip(rope.hf.apply_rotary_emb_complex(q, k, freqs_cis), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    foreign = freqs_cis * 1  # a new tensor: no source
    for a, b in zip(rope.hf.apply_rotary_emb_complex(q.float(), k.float(), foreign),
                    apply_rotary_emb(q.float(), k.float(), foreign)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_interleave_function_matches_deepseek():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    gen = torch.Generator().manual_seed(13)
    q = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 1, 5, 8, generator=gen, dtype=torch.float64)
    cos, sin = rope.hf.RotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=8)(q, torch.arange(5)[None] + 9)
    for a, b in zip(rope.hf.apply_rotary_pos_emb_interleave(q, k, cos, sin),
                    apply_rotary_pos_emb_interleave(q, k, cos, sin)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_gemma4_proportional_rope_and_wider_global_heads():
    """Gemma 4's full-attention layers: proportional RoPE (a quarter of the pairs rotate, the rest
    get frequency 0) on heads of 32, taken from the per-layer config."""
    model = tiny_model("gemma4_text")
    assert rope.hf.install(model) == 1
    assert isinstance(model.model.rotary_emb, rope.hf.LayerTypeRotaryEmbedding)
    full = model.model.rotary_emb.layer_types["full_attention"]
    assert full.rope_config.rope_type == "proportional" and full.inv_freq.shape == (16,)
    assert int((full.inv_freq != 0).sum()) == 4
