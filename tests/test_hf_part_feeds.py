"""The types the probe runs by their rotating part (rope.hf.part_feeds). The video trackers
(SAM 2 Video, SAM 3 Tracker Video), run through their memory attention alone:

* rope.hf.apply_rotary_pos_emb_2d with the memory attention's keywords (num_k_exclude_rope: the
  last keys pass unrotated; repeat_freqs_k: keys of several frames, each turned by the queries'
  tables) against the float64 formula written here, rounded once, and transformers' function;
  bad values refused by name; gradients in float32, bfloat16 and float16 against float64 autograd;
* the memory attention fed object pointers too (which the probe's feed leaves out), patched,
  equals transformers' near position 0, and unpatch restores it bit for bit;
* patch swaps SAM 3 Tracker Video's vision tower's rotary modules too, which the probe's feed
  does not run.

EdgeTAM Video, run through its memory attention too: fed the 1-D latents of every memory frame
and object pointers (the keys its cross-attention leaves unrotated, which the probe's feed leaves
out), patched (rope's two functions called), it equals transformers' near position 0, and
unpatch restores it bit for bit.

Qwen2.5-Omni's token-to-wave model, run through its DiT: its own forward (a seeded diffusion
start, the sampler's guided calls of the DiT) samples the same mel spectrogram patched.

EsmFold2, run through its input embedder on a complex a feed builds (Feed.build): the complex is
one (its atoms in their tokens' order, each atom's space id its token, one-hot features, as
EsmFold2's featurizer encodes them), drawn from the tokens' seed; the feed runs the embedder on
exactly those inputs; patch swaps both atom encoders' rotary modules (the structure head's too,
which the feed does not run) and the modeling module's function, and the structure head's atom
encoder patched equals transformers' near position 0; a feed naming no builder is refused by name.

BLT's local encoder, fed patch ids: patches of feeds.PATCH positions in order, as many as its
num_patches, so that every patch pools bytes.
"""

import importlib

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")
from helpers import assert_correctly_rounded  # noqa: E402
from rope.hf import coverage, coverage_table, feeds, part_feeds, vision  # noqa: E402
from rope.hf.feeds import Feed  # noqa: E402

TRACKERS = ["sam2_video", "sam3_tracker_video"]


def reference(q, k, cos, sin, excluded, frames):
    """q cos + rotate_pairs(q) sin in float64; the keys but the last ``excluded`` in ``frames``
    blocks of q's length, each turned by the same tables; the excluded keys as they are."""
    def turn(x, c, s):
        x = x.double()
        return x * c.double() + torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2) * s.double()

    kept = k.shape[-2] - excluded
    tiled = [torch.cat([t] * frames, dim=-2) for t in (cos, sin)]
    return turn(q, cos, sin), torch.cat([turn(k[..., :kept, :], *tiled), k[..., kept:, :].double()], dim=-2)


def tracker_inputs(gen, dtype, frames=3, excluded=4, seq=12, dim=16):
    q = torch.randn(2, 1, seq, dim, generator=gen).to(dtype)
    k = torch.randn(2, 1, frames * seq + excluded, dim, generator=gen).to(dtype)
    angles = (torch.rand(seq, dim // 2, generator=gen, dtype=torch.float64) * 2**17).repeat_interleave(2, dim=-1)
    return q, k, angles.cos().float()[None], angles.sin().float()[None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("frames, excluded", [(1, 0), (3, 0), (1, 5), (3, 4), (2, 0)])
def test_memory_keywords_round_the_exact_formula_once(dtype, frames, excluded):
    gen = torch.Generator().manual_seed(frames * 10 + excluded)
    q, k, cos, sin = tracker_inputs(gen, dtype, frames, excluded)
    got = rope.hf.apply_rotary_pos_emb_2d(q, k, cos, sin, num_k_exclude_rope=excluded, repeat_freqs_k=frames > 1)
    for out, expected, x in zip(got, reference(q, k, cos, sin, excluded, frames), (q, k)):
        assert out.dtype == dtype and out.shape == x.shape
        assert_correctly_rounded(out, expected)
    assert torch.equal(got[1][..., k.shape[-2] - excluded:, :], k[..., k.shape[-2] - excluded:, :])
    for model_type in TRACKERS:
        theirs = importlib.import_module(coverage.module_name(model_type)).apply_rotary_pos_emb_2d
        for a, b in zip(got, theirs(q, k, cos, sin, num_k_exclude_rope=excluded, repeat_freqs_k=frames > 1)):
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-2)


def test_every_key_excluded_leaves_the_keys():
    gen = torch.Generator().manual_seed(5)
    q, k, cos, sin = tracker_inputs(gen, torch.float32, frames=0, excluded=7)
    out_q, out_k = rope.hf.apply_rotary_pos_emb_2d(q, k, cos, sin, num_k_exclude_rope=7, repeat_freqs_k=True)
    assert torch.equal(out_k, k)
    assert_correctly_rounded(out_q, reference(q, q, cos, sin, 0, 1)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradients_match_float64_autograd(dtype):
    gen = torch.Generator().manual_seed(7)
    q, k, cos, sin = tracker_inputs(gen, torch.float64, frames=2, excluded=3)
    upstream = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in (q, k)]

    def grads(q, k, function):
        q, k = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        outs = function(q, k)
        sum((o.double() * u).sum() for o, u in zip(outs, upstream)).backward()
        return q.grad.double(), k.grad.double()

    expected = grads(q, k, lambda a, b: reference(a, b, cos, sin, 3, 2))
    got = grads(q.to(dtype), k.to(dtype), lambda a, b: rope.hf.apply_rotary_pos_emb_2d(
        a, b, cos, sin, num_k_exclude_rope=3, repeat_freqs_k=True))
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * 4)


BAD = [
    pytest.param(dict(num_k_exclude_rope=True), TypeError, "num_k_exclude_rope", id="bool count"),
    pytest.param(dict(num_k_exclude_rope=1.0), TypeError, "num_k_exclude_rope", id="float count"),
    pytest.param(dict(num_k_exclude_rope=-1), ValueError, "num_k_exclude_rope", id="negative count"),
    pytest.param(dict(num_k_exclude_rope=41), ValueError, "num_k_exclude_rope", id="more than the keys"),
    pytest.param(dict(repeat_freqs_k=1), TypeError, "repeat_freqs_k", id="int flag"),
    pytest.param(dict(num_k_exclude_rope=3, repeat_freqs_k=True), ValueError, "k has 37 rotated keys",
                 id="not a multiple"),
]


@pytest.mark.parametrize("keywords, error, match", BAD)
def test_bad_memory_keywords_are_refused_by_name(keywords, error, match):
    q, k, cos, sin = tracker_inputs(torch.Generator().manual_seed(1), torch.float32, frames=3, excluded=4)
    with pytest.raises(error, match=rf"^{match}"):
        rope.hf.apply_rotary_pos_emb_2d(q, k, cos, sin, **keywords)


def test_integer_keys_and_a_flat_table_are_refused_by_name():
    q, k, cos, sin = tracker_inputs(torch.Generator().manual_seed(2), torch.float32, frames=2, excluded=0)
    with pytest.raises(TypeError, match="^k "):
        rope.hf.apply_rotary_pos_emb_2d(q, k.long(), cos, sin, repeat_freqs_k=True)
    with pytest.raises(ValueError, match=r"^cos must have shape \[seq, width\]"):
        rope.hf.apply_rotary_pos_emb_2d(q, k, cos[0, 0], sin[0, 0], repeat_freqs_k=True)


@pytest.mark.parametrize("model_type", TRACKERS)
def test_memory_attention_with_object_pointers_is_transformers(model_type):
    """The probe's feed plus object pointer tokens (keys the rotation leaves out), patched: the
    output near position 0 is transformers'; unpatched again, bit for bit."""
    model = coverage.tiny_model(model_type)
    (feed,) = part_feeds.memory_attention(model.config)
    pointers = feeds.LENGTH // 2  # what the feed makes for a num_ argument
    memory = (feed.extra[0][1][0] + pointers, *feed.extra[0][1][1:])
    extra = (("memory", memory), ("memory_posision_embeddings", memory), ("num_object_pointer_tokens", ()))
    with_pointers = Feed(feed.part, feed.argument, feed.shape, extra)
    tokens = coverage.sample_tokens(seed=4)
    expected = coverage.output(model, tokens, feed=with_pointers)
    rope.hf.patch(model)
    try:
        torch.testing.assert_close(coverage.output(model, tokens, feed=with_pointers), expected,
                                   **coverage.LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model)
    assert torch.equal(coverage.output(model, tokens, feed=with_pointers), expected)


@pytest.mark.parametrize("latents, pointers", [(0, 3), (4, 0), (4, 5)])
def test_edgetam_memory_attention_with_latents_and_object_pointers_is_transformers(latents, pointers, monkeypatch):
    """The probe's feed with ``latents`` 1-D latents before each frame's spatial keys (temporal
    keys) and ``pointers`` object pointer keys after the frames, both unrotated, patched: rope's
    functions run, and the output near position 0 is transformers'; unpatched, bit for bit."""
    model = coverage.tiny_model("edgetam_video")
    (feed,) = part_feeds.edgetam_memory_attention(model.config)
    keys = model.config.memory_attention_rope_k_sizes[0] * model.config.memory_attention_rope_k_sizes[1]
    memory = (part_feeds.MEMORY_FRAMES * (latents + keys) + pointers, *feed.extra[0][1][1:])
    extra = (("memory", memory), ("memory_posision_embeddings", memory),
             ("num_spatial_memory_tokens", (part_feeds.MEMORY_FRAMES,)), ("num_object_pointer_tokens", (pointers,)))
    fed = Feed(feed.part, feed.argument, feed.shape, extra)
    tokens = coverage.sample_tokens(seed=latents + pointers)
    expected = coverage.output(model, tokens, feed=fed)
    assert expected.abs().max() > coverage.LIVE_OUTPUT
    modeling, calls = importlib.import_module(coverage.module_name("edgetam_video")), []

    def counted(name):
        ours = getattr(rope.hf.functions_2d, name)
        assert getattr(modeling, name) is ours  # patched
        return lambda *args, **kwargs: (calls.append((name, kwargs)), ours(*args, **kwargs))[1]

    rope.hf.patch(model)
    try:
        with monkeypatch.context() as m:
            for name in ("apply_rotary_pos_emb_2d_self_attn", "apply_rotary_pos_emb_2d_cross_attn"):
                m.setattr(modeling, name, counted(name))
            got = coverage.output(model, tokens, feed=fed)
        torch.testing.assert_close(got, expected, **coverage.LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model)
    layers = model.config.memory_attention_num_layers
    assert sorted(name for name, _ in calls) == sorted(["apply_rotary_pos_emb_2d_self_attn",
                                                        "apply_rotary_pos_emb_2d_cross_attn"] * layers)
    assert all(kwargs["num_k_exclude_rope"] == pointers and kwargs["repeat_freqs_k"] == part_feeds.MEMORY_FRAMES
               for name, kwargs in calls if name.endswith("cross_attn"))
    assert torch.equal(coverage.output(model, tokens, feed=fed), expected)


def test_patch_swaps_the_tracker_vision_tower_too():
    model = coverage.tiny_model("sam3_tracker_video")
    held = dict(vision.vision_rotary_modules(model))
    assert any(name.startswith("vision_encoder.") for name in held)
    record = rope.hf.patch(model)
    try:
        assert not vision.vision_rotary_modules(model) and not record.vision_left
        assert {r.name for r in record.vision_modules} == set(held)
    finally:
        rope.hf.unpatch(model)
    assert all(model.get_submodule(name) is module for name, module in held.items())


class _Mel(Exception):
    """Raised by a hook with the mel spectrogram the vocoder receives (the tiny vocoder is not run)."""


def _sampled_mel(model, inputs) -> torch.Tensor:
    """The mel spectrogram the token-to-wave model's own forward samples (4 Runge-Kutta steps,
    classifier-free guidance) and hands its vocoder, from the noise of a seeded generator."""
    def stop(module, args):
        raise _Mel(args[0])

    handle = model.code2wav_bigvgan_model.register_forward_pre_hook(stop)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), pytest.raises(_Mel) as caught:
            torch.manual_seed(0)
            model(*inputs, num_steps=4)
    finally:
        handle.remove()
    return caught.value.args[0]


def test_token_to_wave_forward_patched_samples_transformers_mel():
    """The probe runs the token-to-wave model's DiT (its FEEDS entry); its own forward, whose
    sampler calls that DiT with guidance, samples the same mel spectrogram patched, from the same
    seeded noise, and unpatched again bit for bit."""
    model = coverage.tiny_model("qwen2_5_omni_token2wav")
    dit = model.config.dit_config
    (feed,) = part_feeds.token_to_wave(model.config)
    assert feed.part == "code2wav_dit_model" and coverage_table.FEEDS["qwen2_5_omni_token2wav"][0] == feed.part
    gen = torch.Generator().manual_seed(11)
    inputs = (torch.randint(3, 97, (2, 10), generator=gen), torch.randn(2, dit.enc_emb_dim, generator=gen),
              torch.randn(2, 20, dit.mel_dim, generator=gen))
    expected = _sampled_mel(model, inputs)
    assert expected.shape == (2, dit.mel_dim, 20) and expected.abs().max() > 0.1
    record = rope.hf.patch(model)
    try:
        assert [r.name for r in record.rotary_modules] == ["code2wav_dit_model.rotary_embed"]
        torch.testing.assert_close(_sampled_mel(model, inputs), expected, **coverage.LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model)
    assert torch.equal(_sampled_mel(model, inputs), expected)


def esmfold2():
    model = coverage.tiny_model("esmfold2")
    (feed,) = part_feeds.folded_complex(model.config)
    return model, feed


def test_the_built_complex_is_one_complex_seeded_by_the_tokens():
    model, feed = esmfold2()
    config = model.config
    tokens = coverage.sample_tokens(seed=2)
    built = part_feeds.complex_inputs(model.input_embedder, feed, tokens)
    atoms, count = built["atom_inputs"], built["num_tokens"]
    batch, length = feed.shape
    assert count == part_feeds.COMPLEX_TOKENS and length == count * part_feeds.ATOMS_PER_TOKEN
    expected_token = torch.arange(count).repeat_interleave(part_feeds.ATOMS_PER_TOKEN).expand(batch, -1)
    assert torch.equal(atoms.atom_to_token, expected_token) and torch.equal(atoms.ref_space_uid, expected_token)
    assert not atoms.ref_space_uid.is_floating_point()  # the positions the probe's shift moves
    assert atoms.atom_attention_mask.dtype == torch.bool and atoms.atom_attention_mask.all()
    for one_hot, classes in ((atoms.ref_element, config.max_atomic_number),
                             (atoms.ref_atom_name_chars, config.char_vocab_size),
                             (built["res_type_one_hot"], config.num_res_types)):
        assert one_hot.shape[-1] == classes and torch.equal(one_hot.sum(-1), torch.ones(one_hot.shape[:-1]))
        assert set(one_hot.unique().tolist()) == {0.0, 1.0}
    assert atoms.ref_pos.shape == (batch, length, 3) and set(atoms.ref_charge.unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert torch.equal(built["token_index"], torch.arange(count).expand(batch, -1))
    again = part_feeds.complex_inputs(model.input_embedder, feed, tokens)
    assert torch.equal(again["atom_inputs"].ref_pos, atoms.ref_pos)
    other = part_feeds.complex_inputs(model.input_embedder, feed, coverage.sample_tokens(seed=3))
    assert not torch.equal(other["atom_inputs"].ref_pos, atoms.ref_pos)


def test_a_built_feed_runs_its_part_on_the_built_inputs():
    model, feed = esmfold2()
    tokens = coverage.sample_tokens(seed=5)
    with torch.no_grad():
        direct = model.input_embedder(**part_feeds.complex_inputs(model.input_embedder, feed, tokens))
    assert torch.equal(coverage.output(model, tokens, feed=feed), feeds.first_output(direct))
    assert coverage_table.FEEDS["esmfold2"] == (feed.part, feed.argument, feed.shape, feed.extra, feed.build)
    with pytest.raises(ValueError, match="^build: no feed builder is named 'nothing'"):
        coverage.output(model, tokens, feed=Feed(feed.part, feed.argument, feed.shape, feed.extra, "nothing"))


def test_patch_swaps_both_atom_encoders_and_the_structure_head_is_transformers():
    """The feed runs the trunk's atom encoder; the structure head's (the diffusion module's, fed
    the trunk's atom embeddings as its forward's caller does) is swapped too and, patched, gives
    transformers' output near position 0; unpatched, bit for bit."""
    model, feed = esmfold2()
    modeling = importlib.import_module(coverage.module_name("esmfold2"))
    stock = modeling.apply_rotary_pos_emb
    encoder = model.structure_head.atom_encoder
    atoms = part_feeds.complex_inputs(model.input_embedder, feed, coverage.sample_tokens(seed=6))["atom_inputs"]

    def head():
        with torch.no_grad():
            embeds, tables = encoder.embed_atoms(atoms)
            return encoder(embeds, embeds, encoder.build_attention_mask(atoms.atom_attention_mask, embeds), tables,
                           atoms.atom_attention_mask, atoms.atom_to_token, part_feeds.COMPLEX_TOKENS)[1]

    expected = head()
    assert expected.abs().max() > coverage.LIVE_OUTPUT
    held = dict(vision.vision_rotary_modules(model))
    assert set(held) == {"input_embedder.atom_encoder.rotary_emb", "structure_head.atom_encoder.rotary_emb"}
    record = rope.hf.patch(model)
    try:
        assert {r.name for r in record.vision_modules} == set(held) and not vision.vision_rotary_modules(model)
        assert modeling.apply_rotary_pos_emb is not stock
        torch.testing.assert_close(head(), expected, **coverage.LOGITS_TOLERANCE)
    finally:
        rope.hf.unpatch(model)
    assert modeling.apply_rotary_pos_emb is stock
    assert all(model.get_submodule(name) is module for name, module in held.items())
    assert torch.equal(head(), expected)


def test_blt_local_encoder_patches_are_fixed_size_and_all_pooled():
    model = coverage.tiny_model("blt_local_encoder")
    tokens = coverage.sample_tokens(seed=7)
    extra = dict(coverage.FEED_EXTRAS["blt_local_encoder"](model.config))
    patch_ids = feeds._value("patch_ids", extra["patch_ids"], tokens, 1)
    count = feeds._value("num_patches", extra["num_patches"], tokens, 2)
    assert torch.equal(patch_ids, torch.arange(feeds.LENGTH).div(feeds.PATCH, rounding_mode="floor").expand(2, -1))
    assert count == feeds.LENGTH // feeds.PATCH
    assert torch.equal(torch.bincount(patch_ids[0], minlength=count), torch.full((count,), feeds.PATCH))
    with torch.no_grad():
        _, patches = model(tokens, patch_ids=patch_ids, num_patches=count)
    assert patches.shape[1] == count * model.config.cross_attn_k
