"""rope.hf.coordinates: exact tables for transformers' coordinate rotary modules.

* LightGlue's keypoint encoder: rope's tables are cos and sin of the exact angles W p (mpmath at
  200 bits from the float values of W and p, rounded once), in each dtype and on both of its paths
  (the CPU's two-term sum, the turns), at coordinates up to 2^20 and past it, where transformers'
  float32 angles are off by far more than a unit; the float64 formula written here agrees at
  small coordinates; gradients to the weights and the
  keypoints match float64 autograd of the formula; bad inputs are refused by name; patch shares
  the model's Linear (same parameter, same state-dict key, loading while patched reaches the
  model) and unpatch puts the very module back, outputs bit for bit; diagnose reads the patched
  encoder as exact to 2^20.
* EsmFold2's atom rotary module: rope's tables are cos and sin of float32 coordinates and integer
  space ids times rope's float32 frequencies (themselves within a float32 unit of b^(-j/n),
  mpmath), exact (mpmath) at coordinates and ids far past transformers' float32 range; they
  match transformers' module to float32 noise; bad inputs and impossible settings are refused;
  diagnose reads rope's module in a patched EsmFold2 (atoms at (p, p, p), space id p) as exact
  to 2^20 and finds one that forms its angles in float32, as transformers' does, off by far more
  than half a unit.
"""

import copy

import pytest
import torch
from torch import nn

import rope
from rope.hf import coordinates, vision

transformers = pytest.importorskip("transformers")
mpmath = pytest.importorskip("mpmath")
from helpers import assert_correctly_rounded  # noqa: E402
from rope.hf import coverage  # noqa: E402

_MODELS: dict = {}


def tiny(model_type: str):
    if model_type not in _MODELS:
        _MODELS[model_type] = coverage.tiny_model(model_type)
    return copy.deepcopy(_MODELS[model_type])


def stock_encoder():
    return tiny("lightglue").positional_encoder


def exact_projection(weight: torch.Tensor, keypoints: torch.Tensor):
    """float64 cos and sin ``[..., n]`` of a_i = sum_c W_ic p_c for the float values of W and p,
    in mpmath at 200 bits (exact angles), rounded once to float64."""
    w = weight.detach().double().cpu().tolist()
    points = keypoints.detach().double().cpu().reshape(-1, keypoints.shape[-1]).tolist()
    cos, sin = [], []
    with mpmath.workprec(200):
        for p in points:
            angles = [sum(mpmath.mpf(wc) * mpmath.mpf(pc) for wc, pc in zip(row, p)) for row in w]
            cos.append([float(mpmath.cos(a)) for a in angles])
            sin.append([float(mpmath.sin(a)) for a in angles])
    shape = (*keypoints.shape[:-1], len(w))
    return tuple(torch.tensor(t, dtype=torch.float64).reshape(shape) for t in (cos, sin))


def random_encoder(n: int = 6, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(2, n, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, 2, generator=gen) * 3)
    return coordinates.CoordinateRotaryEmbedding(linear.to(dtype), source="test")


def far_keypoints(dtype, seed: int = 1) -> torch.Tensor:
    """Keypoints [2, 9, 2] in [-1, 1], then at 2^12 to 2^20 and past, fractional, of either sign."""
    gen = torch.Generator().manual_seed(seed)
    near = torch.rand(2, 5, 2, generator=gen, dtype=torch.float64) * 2 - 1
    far = torch.tensor([[4096.5, -3.25], [-1048576.0, 1048575.75], [0.125, 3.0e7], [-65537.0, 2.0**20 + 0.5]],
                       dtype=torch.float64)
    return torch.cat([near, far.expand(2, -1, -1)], dim=1).to(dtype)


@pytest.mark.parametrize("turns", [False, True], ids=["cpu-path", "turns"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_keypoint_tables_are_the_exact_angles_rounded_once(dtype, turns, monkeypatch):
    if turns:  # the path of devices whose reads are not free: the angles reduced as turns
        monkeypatch.setattr(coordinates._checks, "reads_are_free", lambda device: False)
    module = random_encoder(dtype=dtype)
    keypoints = far_keypoints(dtype)
    if dtype == torch.float16:
        keypoints = keypoints.clamp(-60000, 60000)  # float16's range
    (cos, sin), = module(keypoints)
    expected_cos, expected_sin = exact_projection(module.projector.weight, keypoints)
    assert cos.dtype == sin.dtype == dtype and cos.shape == (2, 9, 12)
    assert_correctly_rounded(cos, expected_cos.repeat_interleave(2, dim=-1))
    assert_correctly_rounded(sin, expected_sin.repeat_interleave(2, dim=-1))
    pair_cos, pair_sin = module.pair_cos_sin(keypoints)  # float64, within 2^-52
    assert (pair_cos - expected_cos).abs().max() <= 2.0**-51 and (pair_sin - expected_sin).abs().max() <= 2.0**-51


def test_keypoint_tables_match_the_float64_formula_and_transformers_near_the_origin():
    encoder = stock_encoder()
    new = vision.reproduce("positional_encoder", encoder)
    gen = torch.Generator().manual_seed(2)
    keypoints = torch.rand(2, 30, 2, generator=gen) * 2 - 1
    (cos, sin), projected = new(keypoints, output_hidden_states=True)
    angles = keypoints.double() @ encoder.projector.weight.double().T  # the formula, in float64
    assert (cos.double() - angles.cos().repeat_interleave(2, dim=-1)).abs().max() <= 2.0**-24
    assert (sin.double() - angles.sin().repeat_interleave(2, dim=-1)).abs().max() <= 2.0**-24
    (their_cos, their_sin), their_projected = encoder(keypoints, output_hidden_states=True)
    assert torch.equal(projected, their_projected)
    torch.testing.assert_close(cos, their_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, their_sin, rtol=0, atol=1e-6)
    far = torch.full((1, 1, 2), 2.0**20) + torch.tensor([0.5, -0.25])  # transformers' float32 angles drift there
    (exact_cos, _), = new(far)
    (float32_cos, _), = encoder(far)
    assert (exact_cos - float32_cos).abs().max() > 1e-3


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_keypoint_gradients_match_float64_autograd(dtype, rtol):
    module = random_encoder(dtype=dtype, seed=3)
    weight = module.projector.weight
    gen = torch.Generator().manual_seed(4)
    keypoints = (torch.rand(3, 7, 2, generator=gen) * 4 - 2).to(dtype).requires_grad_()
    g_cos, g_sin = (torch.randn(3, 7, 12, generator=gen) for _ in range(2))
    (cos, sin), = module(keypoints)
    ((cos.double() * g_cos).sum() + (sin.double() * g_sin).sum()).backward()
    w64 = weight.detach().double().requires_grad_()
    p64 = keypoints.detach().double().requires_grad_()
    angles = (p64 @ w64.T).repeat_interleave(2, dim=-1)
    ((angles.cos() * g_cos.double()).sum() + (angles.sin() * g_sin.double()).sum()).backward()
    assert weight.grad.dtype == dtype and keypoints.grad.dtype == dtype
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=rtol, atol=rtol * float(w64.grad.abs().max()))
    torch.testing.assert_close(keypoints.grad.double(), p64.grad, rtol=rtol,
                               atol=rtol * float(p64.grad.abs().max()))


@pytest.mark.parametrize("keypoints, weight_edit, error, name", [
    (torch.zeros(1, 3, 2, dtype=torch.int64), None, TypeError, "keypoints"),
    (torch.zeros(1, 3, 3), None, ValueError, "keypoints"),
    (torch.tensor([[[0.5, float("nan")]]]), None, ValueError, "keypoints"),
    (torch.tensor([[[1e38, 0.0]]]), None, ValueError, "keypoints"),
    (torch.zeros(1, 3, 2), float("inf"), ValueError, "projector.weight"),
    ([[0.5, 0.5]], None, TypeError, "keypoints"),
])
def test_keypoint_module_refuses_bad_input_by_name(keypoints, weight_edit, error, name):
    module = random_encoder()
    if weight_edit is not None:
        with torch.no_grad():
            module.projector.weight[0, 0] = weight_edit
    with pytest.raises(error, match=name):
        module(keypoints)


def test_keypoint_module_refuses_a_linear_with_bias():
    with pytest.raises(TypeError, match="projector"):
        coordinates.CoordinateRotaryEmbedding(nn.Linear(2, 4))


def test_patch_shares_the_weights_and_unpatch_restores_bit_for_bit():
    model = tiny("lightglue")
    tokens = coverage.sample_tokens()
    before = coverage.output(model, tokens)
    encoder, weight = model.positional_encoder, model.positional_encoder.projector.weight
    keys = set(model.state_dict())
    record = rope.hf.patch(model)
    try:
        assert isinstance(model.positional_encoder, coordinates.CoordinateRotaryEmbedding)
        assert [r.name for r in record.vision_modules] == ["positional_encoder"] and not record.vision_left
        assert model.positional_encoder.projector is encoder.projector
        assert model.positional_encoder.projector.weight is weight and set(model.state_dict()) == keys
        assert sum(p is weight for p in model.parameters()) == 1
        torch.testing.assert_close(coverage.output(model, tokens), before, **coverage.LOGITS_TOLERANCE)
        (row,) = rope.hf.diagnose(model)  # the encoder's tables, read at coordinates (p, p) up to 2^20
        assert row.form == "called with coordinates [1, n, 2]" and row.limit == 2**20
        assert row.worst_within <= 0.5 and row.first_position is None, row
        state = model.state_dict()
        state["positional_encoder.projector.weight"] = state["positional_encoder.projector.weight"] * 2
        model.load_state_dict(state)  # loading while patched reaches the model's own weight
        moved = coverage.output(model, tokens)
        assert not torch.allclose(moved, before, **coverage.LOGITS_TOLERANCE)
        with torch.no_grad():
            weight.mul_(0.5)
    finally:
        rope.hf.unpatch(model)
    assert model.positional_encoder is encoder and encoder.projector.weight is weight
    assert torch.equal(coverage.output(model, tokens), before)


def test_reproduce_refuses_an_encoder_of_another_layout():
    encoder = stock_encoder()

    class HalvesPositionalEncoder(type(encoder)):  # the same Linear, tables laid out as halves, not pairs
        def forward(self, keypoints, output_hidden_states=False):
            projected = self.projector(keypoints)
            embeddings = projected.repeat(1, 1, 2)
            return ((embeddings.cos(), embeddings.sin()), projected) if output_hidden_states else \
                ((embeddings.cos(), embeddings.sin()),)

    odd = HalvesPositionalEncoder.__new__(HalvesPositionalEncoder)
    odd.__dict__ = copy.deepcopy(encoder).__dict__
    HalvesPositionalEncoder.__module__ = type(encoder).__module__
    assert coordinates.is_coordinate_rotary(odd)
    with pytest.raises(ValueError, match="another layout or formula"):
        coordinates.reproduce("positional_encoder", odd)
    with pytest.raises(ValueError, match="not a transformers coordinate rotary module"):
        coordinates.reproduce("x", nn.Linear(2, 4))


# EsmFold2's atom rotary module


def atom_module():
    return tiny("esmfold2").input_embedder.atom_encoder.rotary_emb


def exact_atoms(module, ref_pos: torch.Tensor, uid: torch.Tensor):
    """float64 cos and sin ``[..., atoms, 2P]``: pair k < 3 n_s at x_(k // n_s) theta_(k mod n_s),
    then u phi_j, then angle 0, twice; the float32 values of the coordinates and frequencies,
    exact angles in mpmath at 200 bits, rounded once to float64."""
    spatial = module.spatial_inv_freq.tolist()
    ids = module.uid_inv_freq.tolist()
    cos, sin = [], []
    with mpmath.workprec(200):
        for p, u in zip(ref_pos.float().double().reshape(-1, 3).tolist(), uid.reshape(-1).tolist()):
            angles = [mpmath.mpf(x) * mpmath.mpf(t) for x in p for t in spatial]
            angles += [mpmath.mpf(u) * mpmath.mpf(t) for t in ids] + [mpmath.mpf(0)] * module.num_inactive_channels
            cos.append([float(mpmath.cos(a)) for a in angles] * 2)
            sin.append([float(mpmath.sin(a)) for a in angles] * 2)
    shape = (*uid.shape, len(cos[0]))
    return tuple(torch.tensor(t, dtype=torch.float64).reshape(shape) for t in (cos, sin))


def test_atom_frequencies_are_rope_s_float32_powers():
    new = vision.reproduce("rotary_emb", atom_module())
    for theta, base, n in ((new.spatial_inv_freq, new.spatial_rope_base_frequency, new.num_spatial_pairs_per_axis),
                           (new.uid_inv_freq, new.uid_rope_base_frequency, new.num_uid_pairs)):
        assert theta.dtype == torch.float32 and theta.numel() == n
        with mpmath.workprec(100):
            exact = torch.tensor([float(mpmath.mpf(base) ** (mpmath.mpf(-j) / n)) for j in range(n)],
                                 dtype=torch.float64)
        assert ((theta.double() - exact).abs() <= 2.0**-24 * exact).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_atom_tables_are_exact_far_past_float32(dtype):
    new = vision.reproduce("rotary_emb", atom_module())
    gen = torch.Generator().manual_seed(5)
    ref_pos = torch.cat([torch.rand(1, 6, 3, generator=gen, dtype=torch.float64) * 60 - 30,
                         torch.tensor([[[1.0e5 + 0.375, -2.0**20, 3.0e7], [0.1, -77.7, 123456.789]]])], dim=1)
    uid = torch.tensor([[0, 1, 2, 5, 40, 99, 2**40 + 3, -(2**33) - 1]])
    cos, sin = new(ref_pos, uid, dtype)
    expected_cos, expected_sin = exact_atoms(new, ref_pos, uid)
    assert cos.dtype == sin.dtype == dtype and cos.shape == expected_cos.shape
    assert_correctly_rounded(cos, expected_cos)
    assert_correctly_rounded(sin, expected_sin)


def test_atom_tables_match_transformers_to_float32_noise_and_a_float_uid_is_its_float32_value():
    module = atom_module()
    new = vision.reproduce("rotary_emb", module)
    gen = torch.Generator().manual_seed(6)
    ref_pos = torch.rand(2, 11, 3, generator=gen) * 40 - 20
    uid = torch.randint(0, 300, (2, 11), generator=gen)
    for ours, theirs in zip(new(ref_pos, uid, torch.float32), module(ref_pos, uid, torch.float32)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-5)
    for a, b in zip(new(ref_pos, uid.double() + 0.5, torch.float32),
                    exact_atoms(new, ref_pos, (uid.double() + 0.5).float().double())):
        assert_correctly_rounded(a, b)


@pytest.mark.parametrize("ref_pos, uid, dtype, error, name", [
    (torch.zeros(1, 4, 3, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int64), torch.float32, TypeError,
     "ref_pos"),
    (torch.zeros(1, 4, 2), torch.zeros(1, 4, dtype=torch.int64), torch.float32, ValueError, "ref_pos"),
    (torch.zeros(1, 4, 3), torch.zeros(1, 5, dtype=torch.int64), torch.float32, ValueError, "ref_space_uid"),
    (torch.full((1, 4, 3), float("nan")), torch.zeros(1, 4, dtype=torch.int64), torch.float32, ValueError, "ref_pos"),
    (torch.zeros(1, 4, 3), torch.zeros(1, 4, dtype=torch.bool), torch.float32, TypeError, "ref_space_uid"),
    (torch.zeros(1, 4, 3), torch.full((1, 4), float("inf")), torch.float32, ValueError, "ref_space_uid"),
    (torch.zeros(1, 4, 3), torch.zeros(1, 4, dtype=torch.int64), torch.int32, ValueError, "dtype"),
    (torch.zeros(1, 4, 3), torch.zeros(1, 4, dtype=torch.int64), "float32", TypeError, "dtype"),
])
def test_atom_module_refuses_bad_input_by_name(ref_pos, uid, dtype, error, name):
    new = vision.reproduce("rotary_emb", atom_module())
    with pytest.raises(error, match=name):
        new(ref_pos, uid, dtype)


def test_atom_module_refuses_heads_too_narrow_for_its_pairs_and_keeps_float32_frequencies():
    module = atom_module()
    module.num_uid_pairs, module.num_inactive_channels = 10, -5  # transformers' default at a head of 16
    with pytest.raises(ValueError, match="num_inactive_channels < 0"):
        vision.reproduce("rotary_emb", module)
    new = vision.reproduce("rotary_emb", atom_module()).to(torch.bfloat16)
    assert new.spatial_inv_freq.dtype == new.uid_inv_freq.dtype == torch.float32
    with pytest.raises(ValueError, match="uid_pairs"):
        coordinates.AtomRotaryEmbedding(1, -1, 0, 20.0, 1e4)


def test_diagnose_reads_rope_s_atom_module_and_finds_float32_angles():
    model = tiny("esmfold2")
    rope.hf.patch(model)
    try:
        (row,) = (r for r in rope.hf.diagnose(model) if r.module == "input_embedder.atom_encoder.rotary_emb")
        assert row.form == "called with atom coordinates [1, n, 3] and space ids [1, n]"
        assert row.reference == "rope's float32 frequencies" and row.limit == 2**20
        assert row.copies == ("structure_head.atom_encoder.rotary_emb",)
        assert row.worst_within <= 0.5 and row.first_position is None, row
        ours = model.input_embedder.atom_encoder.rotary_emb

        class Float32Angles(type(ours)):  # a planted bug: the angles formed in float32, as transformers forms them
            def pair_cos_sin(self, ref_pos, ref_space_uid):
                theta = torch.cat((self.spatial_inv_freq.repeat(3), self.uid_inv_freq,
                                   self.spatial_inv_freq.new_zeros(self.num_inactive_channels)))
                n = self.num_spatial_pairs_per_axis
                positions = torch.cat((ref_pos.float().repeat_interleave(n, dim=-1),
                                       ref_space_uid.float()[..., None].expand(*ref_space_uid.shape,
                                                                               len(theta) - 3 * n)), dim=-1)
                angles = positions * theta
                return angles.cos().double(), angles.sin().double()

        planted = copy.deepcopy(ours)
        planted.__class__ = Float32Angles
        model.input_embedder.atom_encoder.rotary_emb = planted
        try:
            (bad,) = (r for r in rope.hf.diagnose(model) if r.module == "input_embedder.atom_encoder.rotary_emb")
        finally:
            model.input_embedder.atom_encoder.rotary_emb = ours
        assert bad.form == row.form and bad.worst_within > 1000 and bad.first_position is not None, bad
    finally:
        rope.hf.unpatch(model)
