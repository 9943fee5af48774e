"""rope.hf.self_rotating: rope's exact table module in place of the conformers' rotary modules
(wav2vec2-conformer, wav2vec2-bert: a stack of cos and sin of the sequence's own positions).
The stack is checked against mpmath at positions past 2^16, against transformers' module at
small positions (float32 noise), install's swap and refusals on tiny models, and patch, which
swaps the stack and the attention's method (rope.hf.methods) and unpatch restores."""

import math
import types

import mpmath
import pytest
import torch

import rope
from rope.hf.self_rotating import StackedRotaryTable, is_stacked_rotary, reproduce_stacked

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)


def conformer(base=10000):
    config = transformers.Wav2Vec2ConformerConfig(
        **TINY, position_embeddings_type="rotary", rotary_embedding_base=base, conv_dim=(8, 8), conv_kernel=(10, 3),
        conv_stride=(5, 2), num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2)
    return transformers.Wav2Vec2ConformerModel(config).eval(), torch.randn(1, 800)


def bert():
    config = transformers.Wav2Vec2BertConfig(**TINY, position_embeddings_type="rotary", feature_projection_input_dim=16,
                                             conv_depthwise_kernel_size=3)
    return transformers.Wav2Vec2BertModel(config).eval(), torch.randn(1, 40, 16)


def hidden(model, inputs):
    with torch.no_grad():
        return model(inputs).last_hidden_state


def half_ulp(x: float, dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype`` at ``x``, subnormals included (round to nearest is within it)."""
    info = torch.finfo(dtype)
    bits = 1 - round(math.log2(info.eps))
    return 2.0 ** (max(math.frexp(x)[1], math.frexp(info.tiny)[1]) - bits - 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_stack_is_the_exact_cos_and_sin_rounded_once(dtype):
    base, head_dim = float(torch.empty(()).uniform_(500, 1e6)), 8
    table = StackedRotaryTable(base, head_dim)
    n = 2**16 + int(torch.randint(2, 200, ()))
    stack = table(torch.zeros(1, n, 1, dtype=dtype))
    assert stack.shape == (2, n, 1, 1, head_dim) and stack.dtype == dtype
    theta = [float(t) for t in table.inv_freq]
    assert theta == pytest.approx([base ** (-2 * i / head_dim) for i in range(head_dim // 2)], rel=1e-6)
    positions = [0, 1, n - 1, *torch.randint(2**15, n, (6,)).tolist()]
    with mpmath.workprec(200):
        for m in positions:
            for i, t in enumerate(theta):
                angle = mpmath.mpf(m) * mpmath.mpf(t)  # theta_i: rope's float32 frequency, exactly
                for row, exact in enumerate((float(mpmath.cos(angle)), float(mpmath.sin(angle)))):
                    for column in (i, i + head_dim // 2):  # each pair's angle in both halves
                        got = float(stack[row, m, 0, 0, column])
                        assert abs(got - exact) <= max(half_ulp(got, dtype), half_ulp(exact, dtype)), (m, i, row)


@pytest.mark.parametrize("build", [conformer, bert])
def test_the_stack_reproduces_transformers_module_at_small_positions(build):
    model, _ = build()
    (owner, attribute, stock), = [s for s in rope.hf.install.__globals__["rotary_slots"](model)]
    assert is_stacked_rotary(stock)
    new, = rope.hf.rotary_replacements(model)
    for n in (1, 5, 64):
        x = torch.randn(2, n, 3)
        theirs, ours = stock(x), new.new(x)
        assert theirs.shape == ours.shape and theirs.dtype == ours.dtype
        assert (theirs - ours).abs().max() < 1e-5  # transformers' float32 angles m theta_i, m < 64


@pytest.mark.parametrize("build", [conformer, bert])
def test_install_swaps_the_module_and_keeps_the_output(build):
    model, inputs = build()
    before = hidden(model, inputs)
    stock = [m for m in model.modules() if is_stacked_rotary(m)]
    assert rope.hf.install(model) == 1
    swapped = [m for m in model.modules() if is_stacked_rotary(m)]
    assert len(stock) == len(swapped) == 1 and isinstance(swapped[0], StackedRotaryTable)
    after = hidden(model, inputs)
    assert (before - after).abs().max() < 1e-4 and not torch.equal(swapped[0].inv_freq, torch.zeros(4))
    rows = rope.hf.diagnose(model)  # against exact angles, in units of float32
    assert rows and all(max(v for v in (r.worst_within, r.worst_beyond) if v is not None) <= 0.5 for r in rows)
    assert rope.hf.install(model) == 0  # rope's already


def test_install_refuses_what_it_does_not_reproduce_and_changes_nothing():
    model, _ = conformer()
    model.config.rotary_embedding_base = 500  # the module was built with 10000
    stock = model.encoder.embed_positions
    with pytest.raises(ValueError, match=r"encoder.embed_positions \(Wav2Vec2ConformerRotaryPositionalEmbedding\) is "
                                         r"not reproduced by rope's StackedRotaryTable of base 500 on 4 pairs"):
        rope.hf.install(model)
    assert model.encoder.embed_positions is stock and stock.cached_sequence_length is None
    for config in (types.SimpleNamespace(), types.SimpleNamespace(rotary_embedding_base=True)):
        with pytest.raises(ValueError, match="its config has no rotary_embedding_base above 1"):
            reproduce_stacked("encoder.embed_positions", stock, config)

    class OtherRotaryPositionalEmbedding(type(stock)):
        def forward(self, hidden_states):
            return super().forward(hidden_states)[0]

    model.config.rotary_embedding_base = 10000
    model.encoder.embed_positions = OtherRotaryPositionalEmbedding(model.config)
    with pytest.raises(ValueError, match=r"returns \(1, 1, 1, 8\) for 1 positions where rope's StackedRotaryTable "
                                         r"returns \(2, 1, 1, 1, 8\)"):
        rope.hf.install(model)


@pytest.mark.parametrize("build", [conformer, bert])
def test_patch_swaps_the_stack_and_the_method_and_unpatch_restores(build):
    """patch covers the conformers (rope.hf.methods): rope's stack and attention method give the
    model's output to float32 noise; unpatch gives it back bit for bit."""
    model, inputs = build()
    before = hidden(model, inputs)
    record = rope.hf.patch(model)
    try:
        assert isinstance(model.encoder.embed_positions, StackedRotaryTable) and record.rotary_modules
        assert (hidden(model, inputs) - before).abs().max() < 1e-4
    finally:
        rope.hf.unpatch(model)
    assert torch.equal(hidden(model, inputs), before)
