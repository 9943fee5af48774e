"""rope.hf.grid: exact tables for transformers' image-grid rotary modules, and the function that
rotates an image's patches after its class and register tokens (rope.hf.apply_rotary_pos_emb_patches).

* patch centres (DINOv3, Sapiens2, EoMT-DINOv3): rope's tables against cos and sin of
  2 pi c theta_j at the centres c = (2r + 1)/h - 1, in exact arithmetic (mpmath at 200 bits, the
  float32 theta_j = b^(-j/n) taken as they are), correctly rounded to the input's dtype; against
  transformers' own module at float32 noise; in training, against the float64 formula of
  transformers' augmentation on draws made here from the same seed, and transformers' module
  with that seed at float32 noise;
* feature grid (EfficientLoFTR): against cos and sin of i theta_m at the 1-based grid positions,
  exact (mpmath), laid out as transformers' module lays them, and at positions past 2^20 given
  as position ids;
* rope.hf.patch on tiny models of each type swaps the module (in its training mode) and unpatch
  puts it back; a training forward of the patched model draws what transformers' draws;
* the patches function against the float64 formula (prefix tokens untouched, the rest rounded
  once from float64) in every floating dtype, its gradients against float64 autograd;
* bad input to every module, function and reproduce is refused by a ValueError or TypeError
  naming the argument or what differs.
"""

import copy
import math

import pytest
import torch

import rope

transformers = pytest.importorskip("transformers")
mpmath = pytest.importorskip("mpmath")
from helpers import assert_correctly_rounded, exact_cos_sin  # noqa: E402
from rope.hf import coverage, grid, vision  # noqa: E402

CENTRE_TYPES = ["dinov3_vit", "sapiens2", "eomt_dinov3"]
ALL_TYPES = [*CENTRE_TYPES, "efficientloftr"]

_MODELS: dict = {}


def tiny(model_type: str):
    """The type's tiny model (rope.hf.coverage), built once for the module."""
    if model_type not in _MODELS:
        _MODELS[model_type] = coverage.tiny_model(model_type)
    return _MODELS[model_type]


def stock_module(model_type: str):
    """A copy of the type's transformers grid rotary module, and its qualified name."""
    (name, module), = vision.vision_rotary_modules(tiny(model_type))
    return name, copy.deepcopy(module)


def exact_centres(rows: int, columns: int, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 cos and sin ``[rows * columns, 4n]`` of 2 pi c theta_j at the patch centres, row-major,
    (y angles, x angles) then the same again: mpmath at 200 bits, rounded once to float64."""
    with mpmath.workprec(200):
        thetas = [mpmath.mpf(float(t)) for t in theta]
        two_pi = 2 * mpmath.pi
        cos, sin = [], []
        for r in range(rows):
            for c in range(columns):
                y, x = mpmath.mpf(2 * r + 1) / rows - 1, mpmath.mpf(2 * c + 1) / columns - 1
                angles = [two_pi * y * t for t in thetas] + [two_pi * x * t for t in thetas]
                cos.append([float(mpmath.cos(a)) for a in angles] * 2)
                sin.append([float(mpmath.sin(a)) for a in angles] * 2)
    shape = (rows * columns, 4 * len(thetas))
    return tuple(torch.tensor(t, dtype=torch.float64).reshape(shape) for t in (cos, sin))


def centre_module(n: int = 4, base: float = 100.0, patch=(4, 3), config=None):
    theta = vision.axial_frequencies(base, n)
    return grid.PatchCentreRotaryEmbedding(theta, patch, config=config, source="test")


class Augmentation:
    """A config holding only the augmentation settings."""

    def __init__(self, shift=None, jitter=None, rescale=None):
        self.pos_embed_shift, self.pos_embed_jitter, self.pos_embed_rescale = shift, jitter, rescale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_patch_centre_tables_are_the_exact_angles_rounded_once(dtype):
    module = centre_module().eval()
    for rows, columns in [(5, 7), (1, 1), (16, 3)]:
        pixels = torch.zeros(2, 3, rows * 4 + 3, columns * 3 + 2, dtype=dtype)  # leftover pixels: no patch
        cos, sin = module(pixels)
        expected_cos, expected_sin = exact_centres(rows, columns, module.inv_freq)
        assert cos.dtype == sin.dtype == dtype and cos.shape == (rows * columns, 16)
        assert_correctly_rounded(cos, expected_cos)
        assert_correctly_rounded(sin, expected_sin)


def test_patch_centre_tables_match_the_float64_formula():
    """The transformers formula written out in float64: coords 2 (i + 1/2)/N - 1, angles
    2 pi c theta_j, flattened over (axis, j), tiled twice."""
    module = centre_module(n=8, base=1e4).eval()
    rows, columns = 9, 4
    cos, sin = module(torch.zeros(1, 1, rows * 4, columns * 3, dtype=torch.float64))
    y = (torch.arange(rows, dtype=torch.float64) + 0.5) / rows * 2 - 1
    x = (torch.arange(columns, dtype=torch.float64) + 0.5) / columns * 2 - 1
    coords = torch.stack(torch.meshgrid(y, x, indexing="ij"), dim=-1).flatten(0, 1)
    angles = (2 * math.pi * coords[:, :, None] * module.inv_freq.double()).flatten(1, 2).tile(2)
    torch.testing.assert_close(cos, angles.cos(), rtol=0, atol=1e-14)
    torch.testing.assert_close(sin, angles.sin(), rtol=0, atol=1e-14)


@pytest.mark.parametrize("model_type", CENTRE_TYPES)
def test_reproduce_gives_transformers_tables_to_float32_noise(model_type):
    name, stock = stock_module(model_type)
    new = vision.reproduce(name, stock)
    assert isinstance(new, grid.PatchCentreRotaryEmbedding) and new.training == stock.training
    base = getattr(stock, "base", None) or stock.config.rope_parameters["rope_theta"]
    assert torch.equal(new.inv_freq, vision.axial_frequencies(base, new.inv_freq.numel()))
    stock.eval(), new.eval()
    patch = new.patch_size
    for dtype in (torch.float32, torch.bfloat16):
        pixels = torch.randn(1, 3, 6 * patch[0], 11 * patch[1]).to(dtype)
        for theirs, ours in zip(stock(pixels), new(pixels)):
            assert theirs.shape == ours.shape and theirs.dtype == ours.dtype == dtype
            torch.testing.assert_close(ours.float(), theirs.float(), rtol=0, atol=4e-6 if dtype == torch.float32
                                       else 2 * 2.0**-8)


def test_training_moves_the_centres_as_transformers_draws():
    settings = Augmentation(shift=0.25, jitter=1.5, rescale=2.0)
    module = centre_module(n=4, config=settings).train()
    pixels = torch.zeros(1, 3, 5 * 4, 7 * 3)
    torch.manual_seed(3)
    cos, sin = module(pixels)
    torch.manual_seed(3)  # the draws, in transformers' order and dtype
    shift = torch.empty((1, 2)).uniform_(-0.25, 0.25).double()
    jitter = torch.empty((1, 2)).uniform_(-math.log(1.5), math.log(1.5)).double().exp()
    rescale = torch.empty(1).uniform_(-math.log(2.0), math.log(2.0)).double().exp()
    y = (torch.arange(5, dtype=torch.float64) + 0.5) / 5 * 2 - 1
    x = (torch.arange(7, dtype=torch.float64) + 0.5) / 7 * 2 - 1
    coords = (torch.stack(torch.meshgrid(y, x, indexing="ij"), dim=-1).flatten(0, 1) + shift) * jitter * rescale
    angles = (2 * math.pi * coords[:, :, None] * module.inv_freq.double()).flatten(1, 2).tile(2)
    assert not torch.allclose(cos.double(), module.eval()(pixels)[0].double(), atol=1e-3)  # they did move
    for got, expected in ((cos, angles.cos()), (sin, angles.sin())):
        assert ((got.double() - expected).abs() <= 0.5 * 2.0**-23 * expected.abs() + 1e-13).all()


@pytest.mark.parametrize("model_type", ["dinov3_vit"])
def test_training_draws_as_transformers_module_does(model_type):
    name, stock = stock_module(model_type)
    stock.config.pos_embed_shift, stock.config.pos_embed_jitter = 0.1, 1.2
    new = vision.reproduce(name, stock.train())
    assert new.training
    pixels = torch.zeros(1, 3, 6 * new.patch_size[0], 5 * new.patch_size[1])
    torch.manual_seed(11)
    theirs = stock(pixels)
    after_theirs = torch.rand(1)
    torch.manual_seed(11)
    ours = new(pixels)
    assert torch.equal(torch.rand(1), after_theirs)  # the same draws were taken
    for a, b in zip(theirs, ours):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_training_refuses_bad_augmentation_settings_by_name():
    pixels = torch.zeros(1, 3, 8, 6)
    for settings, name in [(Augmentation(jitter=0.5), "config.pos_embed_jitter"),
                           (Augmentation(rescale=float("nan")), "config.pos_embed_rescale"),
                           (Augmentation(shift=-1.0), "config.pos_embed_shift"),
                           (Augmentation(shift="1"), "config.pos_embed_shift")]:
        with pytest.raises((ValueError, TypeError), match=name):
            centre_module(config=settings).train()(pixels)
    cos, _ = centre_module(config=None).train()(pixels)  # no config: no augmentation
    torch.testing.assert_close(cos, centre_module().eval()(pixels)[0], rtol=0, atol=0)


def test_an_image_smaller_than_a_patch_has_no_patches():
    cos, sin = centre_module().eval()(torch.zeros(1, 3, 3, 2))
    assert cos.shape == sin.shape == (0, 16)


@pytest.mark.parametrize("pixels, error, name", [
    ("pixels", TypeError, "pixel_values"),
    (torch.zeros(1, 3, 8, 6, dtype=torch.int64), TypeError, "pixel_values"),
    (torch.zeros(1, 3, 8, 6, dtype=torch.complex64), TypeError, "pixel_values"),
    (torch.zeros(3, 8, 6), ValueError, "pixel_values"),
])
def test_patch_centres_refuse_bad_pixel_values_by_name(pixels, error, name):
    with pytest.raises(error, match=name):
        centre_module()(pixels)


@pytest.mark.parametrize("build, error, name", [
    (lambda: grid.PatchCentreRotaryEmbedding(torch.ones(4, dtype=torch.float16), 4), TypeError, "theta"),
    (lambda: grid.PatchCentreRotaryEmbedding(torch.tensor([1.0, float("nan")]), 4), ValueError, "theta"),
    (lambda: grid.PatchCentreRotaryEmbedding(torch.ones(4), 0), ValueError, "patch_size"),
    (lambda: grid.PatchCentreRotaryEmbedding(torch.ones(4), (2, 2, 2)), ValueError, "patch_size"),
    (lambda: grid.PatchCentreRotaryEmbedding(torch.ones(4), 2.0), TypeError, "patch_size"),
    (lambda: grid.FeatureGridRotaryEmbedding(torch.ones(4), 0, 4), ValueError, "kernel_size"),
    (lambda: grid.FeatureGridRotaryEmbedding(torch.ones(4), 4, True), TypeError, "stride"),
    (lambda: grid.FeatureGridRotaryEmbedding(torch.ones(2, 2), 4, 4), ValueError, "theta"),
])
def test_constructors_refuse_bad_arguments_by_name(build, error, name):
    with pytest.raises(error, match=name):
        build()


def test_casts_keep_the_float32_frequencies_and_the_tables_dtype_follows_the_input():
    module = centre_module()
    theta = module.inv_freq.clone()
    module.to(torch.bfloat16).half()
    assert module.inv_freq.dtype == torch.float32 and torch.equal(module.inv_freq, theta)
    cos, _ = module.eval()(torch.zeros(1, 3, 8, 6, dtype=torch.bfloat16))
    assert cos.dtype == torch.bfloat16
    feature = grid.FeatureGridRotaryEmbedding(theta, 4, 4).double()
    assert feature.inv_freq.dtype == torch.float32


def feature_module(n: int = 4, base: float = 1e4, kernel: int = 4, stride: int = 4):
    theta, _ = rope.inv_freq({"rope_type": "default", "rope_theta": base}, 2 * n)
    return grid.FeatureGridRotaryEmbedding(theta, kernel, stride, source="test")


def feature_layout(cos_axes: torch.Tensor) -> torch.Tensor:
    """transformers' layout from per-axis tables [..., 2, n]: (i theta_0, j theta_0, i theta_1, ...),
    each entry twice in a row, written out entry by entry."""
    n = cos_axes.shape[-1]
    columns = [cos_axes[..., axis, m] for m in range(n) for axis in (0, 1) for _ in range(2)]
    return torch.stack(columns, dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_feature_grid_tables_are_the_exact_angles_rounded_once(dtype):
    module = feature_module()
    x = torch.zeros(2, 16, 4 + 4 * 4 + 3, 4 + 4 * 6, dtype=dtype)  # a grid of 5 x 7 cells
    cos, sin = module(x)
    assert cos.shape == (1, 5, 7, 16) and cos.dtype == dtype
    i, j = torch.meshgrid(torch.arange(1, 6), torch.arange(1, 8), indexing="ij")
    exact_cos, exact_sin = exact_cos_sin(torch.stack((i, j), dim=-1)[None], module.inv_freq)  # [1, 5, 7, 2, n]
    assert_correctly_rounded(cos, feature_layout(exact_cos))
    assert_correctly_rounded(sin, feature_layout(exact_sin))


def test_feature_grid_position_ids_are_exact_past_2_20():
    module = feature_module(n=8)
    positions = torch.tensor([[2**20 + 3, 5], [7, 2**21 - 1], [-9, 2**24 + 1]])
    cos, sin = module(torch.zeros(1), positions)
    exact_cos, exact_sin = exact_cos_sin(positions, module.inv_freq)
    assert cos.shape == (3, 32) and cos.dtype == torch.float32
    assert_correctly_rounded(cos, feature_layout(exact_cos))
    assert_correctly_rounded(sin, feature_layout(exact_sin))


def test_reproduce_gives_efficientloftr_s_tables_to_float32_noise():
    name, stock = stock_module("efficientloftr")
    new = vision.reproduce(name, stock)
    assert isinstance(new, grid.FeatureGridRotaryEmbedding)
    x = torch.randn(2, 64, 30, 18)
    for theirs, ours in zip(stock(x), new(x)):
        assert theirs.shape == ours.shape and theirs.dtype == ours.dtype
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)


@pytest.mark.parametrize("arguments, error, name", [
    (("x",), TypeError, "x"),
    ((torch.zeros(8, dtype=torch.int32),), TypeError, "x"),
    ((torch.zeros(8),), ValueError, "x"),
    ((torch.zeros(1, 3, 3, 40),), ValueError, "x"),
    ((torch.zeros(1), torch.zeros(4, 2)), TypeError, "position_ids"),
    ((torch.zeros(1), torch.zeros(4, 3, dtype=torch.int64)), ValueError, "position_ids"),
    ((torch.zeros(1), torch.tensor(3)), ValueError, "position_ids"),
])
def test_feature_grid_refuses_bad_input_by_name(arguments, error, name):
    with pytest.raises(error, match=name):
        feature_module()(*arguments)


def _edited(model_type: str, edit):
    name, stock = stock_module(model_type)
    edit(stock)
    return name, stock


@pytest.mark.parametrize("model_type, edit, message", [
    ("dinov3_vit", lambda m: m.to(torch.bfloat16), "its inv_freq is bfloat16, not float32"),
    ("dinov3_vit", lambda m: m.inv_freq[1:2].mul_(1.01), r"its inv_freq\[1\] = .* is not rope's axial frequency"),
    ("dinov3_vit", lambda m: setattr(m.config, "patch_size", 0), "patch_size must be >= 1"),
    ("sapiens2", lambda m: setattr(m, "forward", lambda pixel_values: (pixel_values, pixel_values)),
     "it returns no \\(cos, sin\\) pair"),
    ("dinov3_vit", lambda m: setattr(m, "forward", lambda pixel_values: tuple(t.flip(0) for t in type(m).forward(
        m, pixel_values))), "off from rope's by"),
    ("efficientloftr", lambda m: m.config.rope_parameters.update(rope_type="linear", factor=2.0),
     "rope_type is 'linear', not 'default'"),
    ("efficientloftr", lambda m: setattr(m.config, "q_aggregation_stride", 0),
     "config.q_aggregation_stride must be >= 1"),
])
def test_reproduce_refuses_naming_what_differs(model_type, edit, message):
    name, stock = _edited(model_type, edit)
    with pytest.raises(ValueError, match=f"vision: {name} .* is not reproduced: .*{message}"):
        vision.reproduce(name, stock)


def test_rope_s_own_modules_are_not_reproduced_again():
    with pytest.raises(ValueError, match="not a transformers image-grid rotary module"):
        grid.reproduce("m", centre_module())
    with pytest.raises(TypeError, match="module"):
        grid.reproduce("m", "module")
    assert grid.form_of(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_patch_swaps_the_grid_module_and_unpatch_restores_it(model_type):
    model = tiny(model_type)
    (name, old), = vision.vision_rotary_modules(model)
    record = rope.hf.patch(model)
    try:
        new = model.get_submodule(name)
        assert isinstance(new, grid.GRID_MODULES) and record.vision_modules[0].old is old
        assert new.training == old.training and not record.vision_left
    finally:
        rope.hf.unpatch(model)
    assert model.get_submodule(name) is old


def test_a_patched_model_in_training_draws_what_transformers_draws():
    model = copy.deepcopy(tiny("dinov3_vit")).train()
    model.config.pos_embed_shift = 0.2
    for module in model.modules():  # no dropout: only the augmentation draws
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    pixels = torch.randn(1, 3, 4 * model.config.patch_size, 6 * model.config.patch_size)
    torch.manual_seed(5)
    expected = model(pixels).last_hidden_state
    rope.hf.patch(model)
    try:
        torch.manual_seed(5)
        got = model(pixels).last_hidden_state
    finally:
        rope.hf.unpatch(model)
    torch.testing.assert_close(got, expected, **coverage.LOGITS_TOLERANCE)


def patches_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DINOv3's function in float64: the last cos.shape[-2] tokens turned by Llama's formula,
    the rest as they are."""
    x = x.double()
    patches, half = cos.shape[-2], cos.shape[-1] // 2
    prefix, body = x[..., : x.shape[-2] - patches, :], x[..., x.shape[-2] - patches:, :]
    turned = torch.cat((-body[..., half: 2 * half], body[..., :half]), dim=-1)
    rotated = body[..., : 2 * half] * cos.double() + turned * sin.double()
    return torch.cat((prefix, torch.cat((rotated, body[..., 2 * half:]), dim=-1)), dim=-2)


def patch_inputs(gen, dtype, tokens=9, patches=6, head_dim=16, width=16):
    q = torch.randn(2, 3, tokens, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 3, tokens, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    angles = torch.rand(patches, width // 2, generator=gen, dtype=torch.float64) * 20
    cos, sin = (f(angles).tile(2).to(dtype) for f in (torch.cos, torch.sin))
    return q, k, cos, sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_patches_function_is_the_float64_formula_rounded_once(dtype):
    gen = torch.Generator().manual_seed(7)
    for tokens, patches, width in [(9, 6, 16), (6, 6, 16), (12, 5, 8)]:
        q, k, cos, sin = patch_inputs(gen, dtype, tokens, patches, width=width)
        got = rope.hf.apply_rotary_pos_emb_patches(q, k, cos, sin)
        for x, out in zip((q, k), got):
            expected = patches_formula(x, cos, sin)
            assert out.dtype == dtype and out.shape == x.shape
            assert torch.equal(out[..., : tokens - patches, :], x[..., : tokens - patches, :])
            assert torch.equal(out, expected.to(dtype)) or dtype in (torch.bfloat16, torch.float16)
            assert_correctly_rounded(out, expected)


def test_patches_function_is_transformers_on_float32():
    from transformers.models.dinov3_vit import modeling_dinov3_vit as theirs
    gen = torch.Generator().manual_seed(8)
    q, k, cos, sin = patch_inputs(gen, torch.float32)
    for a, b in zip(theirs.apply_rotary_pos_emb(q, k, cos, sin), rope.hf.apply_rotary_pos_emb_patches(q, k, cos, sin)):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_patches_function_gradients_match_float64_autograd(dtype, tolerance):
    gen = torch.Generator().manual_seed(9)
    q, k, cos, sin = patch_inputs(gen, torch.float64)
    weights = [torch.randn(q.shape, generator=gen, dtype=torch.float64) for _ in range(2)]
    leaves = [t.clone().requires_grad_(True) for t in (q, k)]
    expected = [patches_formula(x, cos, sin) for x in leaves]
    sum((w * e).sum() for w, e in zip(weights, expected)).backward()
    reference = [leaf.grad for leaf in leaves]
    low = [t.to(dtype).requires_grad_(True) for t in (q, k)]
    out = rope.hf.apply_rotary_pos_emb_patches(*low, cos.to(dtype), sin.to(dtype))
    sum((w * o.double()).sum() for w, o in zip(weights, out)).backward()
    for leaf, expected_grad in zip(low, reference):
        assert leaf.grad.dtype == dtype
        torch.testing.assert_close(leaf.grad.double(), expected_grad, rtol=tolerance, atol=tolerance * 4)
    assert torch.autograd.gradcheck(lambda a, b: rope.hf.apply_rotary_pos_emb_patches(a, b, cos, sin),
                                    tuple(t.clone().requires_grad_(True) for t in (q, k)))


@pytest.mark.parametrize("arguments, error, name", [
    (lambda q, k, c, s: ("q", k, c, s), TypeError, "q"),
    (lambda q, k, c, s: (q, k.long(), c, s), TypeError, "k"),
    (lambda q, k, c, s: (q, k, c.long(), s), TypeError, "cos"),
    (lambda q, k, c, s: (q, k, c, s[:-1]), ValueError, "sin"),
    (lambda q, k, c, s: (q, k, c[0], s[0]), ValueError, "cos"),
    (lambda q, k, c, s: (q[..., :4, :], k, c, s), ValueError, "q"),
    (lambda q, k, c, s: (q, k[..., :4, :], c, s), ValueError, "k"),
    (lambda q, k, c, s: (q[..., :8], k[..., :8], c, s), ValueError, "cos"),
    (lambda q, k, c, s: (q, k, c[:, :5], s[:, :5]), ValueError, "cos"),
])
def test_patches_function_refuses_bad_input_by_name(arguments, error, name):
    q, k, cos, sin = patch_inputs(torch.Generator().manual_seed(1), torch.float32)
    with pytest.raises(error, match=name):
        rope.hf.apply_rotary_pos_emb_patches(*arguments(q, k, cos, sin))
