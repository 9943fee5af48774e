"""rope.mrope (M-RoPE) against explicit float64 block rotations, the 3D relative property, text as
1D RoPE, and transformers' Qwen2-VL / Qwen3-VL / Qwen3.5 tables and models."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rope
from helpers import FLOAT_DTYPES, assert_correctly_rounded, names
from rope.mrope import apply_mrope, check_section, multimodal_positions, pair_positions, section_axes
from rope.reference import rotation_matrix
from strategies import layouts


def axes_by_rule(sections, style):
    """The axis of each pair, written out from the three rules (not through rope.mrope)."""
    if style == "chunked":
        s_t, s_h, s_w = sections
        return [0] * s_t + [1] * s_h + [2] * s_w
    if style == "alternating":  # ERNIE 4.5 VL's order: (s_h, s_w, s_t)
        s_h, s_w, s_t = sections
        return [1, 2] * s_h + [0] * s_t
    if style == "openpangu":  # vLLM: the last pair is t's; deal the rest to the least-served axis
        share = [sections[0] - 1, sections[1], sections[2]]
        got, out = [0, 0, 0], []
        while sum(got) < sum(share):
            open_axes = [a for a in range(3) if got[a] < share[a]]
            choices = [a for a in open_axes if not out or out[-1] != a] or open_axes
            axis = sorted(choices, key=lambda a: (Fraction(got[a], share[a]), a))[0]
            got[axis] += 1
            out.append(axis)
        return out + [0]
    s_t, s_h, s_w = sections
    out = []
    for i in range(s_t + s_h + s_w):
        if i % 3 == 1 and i < 3 * s_h:
            out.append(1)
        elif i % 3 == 2 and i < 3 * s_w:
            out.append(2)
        else:
            out.append(0)
    return out


@st.composite
def sections(draw):
    """(mrope_section, style): chunked or openpangu sections of any sizes, interleaved ones that
    fit, or alternating ones (equal h and w)."""
    style = draw(st.sampled_from(["chunked", "interleaved", "alternating", "openpangu"]))
    if style in ("chunked", "openpangu"):
        return (draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))), style
    if style == "alternating":
        s_hw = draw(st.integers(1, 4))
        return (s_hw, s_hw, draw(st.integers(1, 4))), style
    pairs = draw(st.integers(3, 14))
    s_h = draw(st.integers(1, (pairs + 1) // 3))
    s_w = draw(st.integers(1, pairs // 3))
    return (pairs - s_h - s_w, s_h, s_w), style


@st.composite
def problems(draw, dtype=None, high=None):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    section, style = draw(sections())
    pairs = sum(section)
    batch, seq = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    heads_q, heads_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    head_dim = 2 * pairs + 2 * draw(st.integers(0, 2))
    dtype = dtype or draw(st.sampled_from(FLOAT_DTYPES))
    q = torch.randn(batch, seq, heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, seq, heads_k, head_dim, generator=gen).to(dtype)
    theta = rope.inv_freq({"rope_theta": draw(st.floats(10.0, 1e6))}, 2 * pairs)[0]
    high = high or draw(st.sampled_from([16, 2**12, 2**20]))
    shape = (3, seq) if draw(st.booleans()) else (3, batch, seq)
    positions = torch.randint(0, high, shape, generator=gen)
    return q, k, positions, theta, section, style


def rotate_by_block_matrix(t, positions, theta, axes, layout):
    """Each token times the explicit float64 matrix with pair i turned by p[axes[i]] * theta_i."""
    grid = positions[:, None].expand(3, t.shape[0], t.shape[1]) if positions.dim() == 2 else positions
    out = torch.empty(t.shape, dtype=torch.float64)
    for b in range(t.shape[0]):
        for s in range(t.shape[1]):
            angles = [float(grid[axes[i], b, s]) * float(theta[i]) for i in range(len(axes))]
            matrix = rotation_matrix(1.0, torch.tensor(angles, dtype=torch.float64), head_dim=t.shape[-1],
                                     layout=layout)
            out[b, s] = t[b, s].double() @ matrix.T
    return out


@given(problems(), layouts)
def test_matches_block_matrix_with_one_rounding(problem, layout):
    q, k, positions, theta, section, style = problem
    axes = section_axes(section, len(theta), style=style)
    assert axes.tolist() == axes_by_rule(section, style)
    q_out, k_out = apply_mrope(q, k, positions, theta, axes, layout=layout)
    for t, out in ((q, q_out), (k, k_out)):
        assert out.dtype == t.dtype and out.shape == t.shape
        assert_correctly_rounded(out, rotate_by_block_matrix(t, positions, theta, axes.tolist(), layout))
        assert torch.equal(out[..., 2 * len(theta):], t[..., 2 * len(theta):])


@given(problems(dtype=torch.float64, high=2**12), layouts, st.lists(st.integers(-(2**12), 2**12), min_size=3,
                                                                   max_size=3))
def test_scores_depend_on_the_offset_only(problem, layout, shift):
    """(R_p q)^T (R_p' k) is unchanged when every position moves by the same (dt, dh, dw)."""
    q, k, positions, theta, section, style = problem
    axes = section_axes(section, len(theta), style=style)
    k = k[:, :, :1].expand_as(q).contiguous()
    shifted = positions + torch.tensor(shift).reshape(3, *[1] * (positions.dim() - 1))

    def scores(pos):
        q_rot, k_rot = apply_mrope(q, k, pos, theta, axes, layout=layout)
        return torch.einsum("bshd,bthd->bhst", q_rot, k_rot)

    torch.testing.assert_close(scores(shifted), scores(positions), rtol=1e-9, atol=1e-9)


@given(problems(), layouts)
def test_text_tokens_get_exactly_1d_rope(problem, layout):
    """t = h = w = m: the same numbers as rope.apply_rotary, whatever the sections."""
    q, k, positions, theta, section, style = problem
    axes = section_axes(section, len(theta), style=style)
    text = positions[0]
    ours = apply_mrope(q, k, text.expand(3, *text.shape), theta, axes, layout=layout, attention_factor=1.25)
    plain = rope.apply_rotary(q, k, text, theta, layout=layout, attention_factor=1.25, backend="torch")
    assert all(torch.equal(a, b) for a, b in zip(ours, plain))


@given(problems(dtype=torch.float64), layouts)
def test_conjugate_inverts(problem, layout):
    q, k, positions, theta, section, style = problem
    axes = section_axes(section, len(theta), style=style)
    q_rot, k_rot = apply_mrope(q, k, positions, theta, axes, layout=layout)
    q_back, k_back = apply_mrope(q_rot, k_rot, positions, theta, axes, layout=layout, conjugate=True)
    torch.testing.assert_close(q_back, q, rtol=0, atol=1e-12)
    torch.testing.assert_close(k_back, k, rtol=0, atol=1e-12)


def test_gradients_are_the_conjugate_rotation():
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 2, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 4, 1, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    positions = torch.randint(0, 500, (3, 2, 4), generator=gen)
    theta = rope.inv_freq({}, 10)[0]
    axes = section_axes([2, 2, 1], 5)
    assert torch.autograd.gradcheck(lambda a, b: apply_mrope(a, b, positions, theta, axes), (q, k))


def test_pair_positions_pick_each_pairs_axis():
    gen = torch.Generator().manual_seed(11)
    positions = torch.randint(0, 2**20, (3, 2, 5), generator=gen)
    axes = section_axes([3, 3, 2], 8, style="interleaved")
    rows = pair_positions(positions, axes)
    assert rows.shape == (2, 5, 8) and rows.dtype == positions.dtype
    for i, axis in enumerate(axes.tolist()):
        assert torch.equal(rows[..., i], positions[axis])


# ----- configs and errors -------------------------------------------------------------------------


def test_config_reads_sections_and_the_mrope_alias():
    cfg = rope.parse_config({"type": "mrope", "mrope_section": [16, 24, 24], "rope_theta": 1e6})
    assert cfg.rope_type == "default" and cfg.mrope_section == (16, 24, 24) and cfg.mrope_style == "chunked"
    assert cfg.mrope_axes(128).bincount().tolist() == [16, 24, 24]
    qwen35 = rope.parse_config({"rope_type": "default", "mrope_section": [11, 11, 10], "mrope_interleaved": True,
                                "partial_rotary_factor": 0.25})
    assert qwen35.mrope_axes(256).tolist() == axes_by_rule((11, 11, 10), "interleaved")
    assert rope.parse_config({}).mrope_axes(64) is None
    # any scaling type combines with sections: frequencies from the type, axes from the section
    yarn = rope.parse_config({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                              "mrope_section": [2, 3, 3]})
    assert yarn.mrope_axes(16).tolist() == axes_by_rule((2, 3, 3), "chunked")


@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"type": "mrope"}, ValueError, "rope_type 'mrope' needs the config key 'mrope_section'"),
        ({"mrope_section": [16, 24]}, ValueError, "config key 'mrope_section' must be three positive ints"),
        ({"mrope_section": [16, 0, 48]}, ValueError, "config key 'mrope_section' must be three positive ints"),
        ({"mrope_section": "16,24,24"}, TypeError, "config key 'mrope_section' must be a list of three ints"),
        ({"mrope_section": [16, 24, 24], "mrope_interleaved": 1}, TypeError, "'mrope_interleaved' must be a bool"),
        ({"rope_type": "bogus"}, ValueError, r"unknown rope_type 'bogus'.*\(or 'mrope'\)"),
        ({"mrope_section": [2, 2, 2], "mrope_style": "zigzag"}, ValueError, "'mrope_style' must be one of"),
        ({"mrope_section": [2, 2, 2], "mrope_style": "alternating", "mrope_interleaved": True}, ValueError,
         "disagree"),
    ],
)
def test_config_errors(params, error, message):
    with pytest.raises(error, match=message):
        rope.parse_config(params)


def test_section_errors_name_what_does_not_fit():
    with pytest.raises(ValueError, match=r"sums to 64, but there are rotary_dim / 2 = 32 pairs"):
        rope.parse_config({"mrope_section": [16, 24, 24]}).mrope_axes(64)
    with pytest.raises(ValueError, match=r"interleaved mrope_section \[1, 4, 1\] does not fit 6 pairs"):
        section_axes([1, 4, 1], 6, style="interleaved")
    with pytest.raises(ValueError, match="pairs must be >= 1, got 0"):
        section_axes([1, 1, 1], 0)
    with pytest.raises(ValueError, match=r"alternating mrope_section .* needs s_h == s_w"):
        section_axes([2, 3, 1], 6, style="alternating")


@pytest.mark.parametrize("section", [(1, 1, 1), (8, 12, 12), (16, 24, 24), (1, 5, 2), (7, 1, 1), (3, 9, 4)])
def test_openpangu_deals_every_axis_its_share(section):
    """vLLM's openpangu sequence: each axis gets its share, t the last pair, and no axis twice in a
    row while another has pairs left (checked on the sequence itself, not through the rule)."""
    axes = section_axes(section, sum(section), style="openpangu").tolist()
    assert axes == axes_by_rule(section, "openpangu")
    assert [axes.count(a) for a in range(3)] == list(section) and axes[-1] == 0
    body = axes[:-1]
    for i in range(1, len(body)):
        others_left = any(body[j] != body[i - 1] for j in range(i, len(body)))
        assert body[i] != body[i - 1] or not others_left, (section, axes)


def test_openpangu_rope_type():
    """rope_type openpangu is vLLM's: default frequencies, needs mrope_section and mrope_interleaved."""
    config = {"rope_type": "openpangu", "rope_theta": 1e6, "mrope_section": [4, 6, 6], "mrope_interleaved": True}
    parsed = rope.parse_config(config)
    assert parsed.mrope_style == "openpangu"
    assert parsed.mrope_axes(32).tolist() == axes_by_rule((4, 6, 6), "openpangu")
    theta, attention = rope.inv_freq(config, 32)
    assert attention == 1.0 and torch.equal(theta, rope.inv_freq({"rope_theta": 1e6}, 32)[0])
    with pytest.raises(ValueError, match="rope_type 'openpangu' needs config key 'mrope_section'"):
        rope.parse_config({"rope_type": "openpangu"})
    with pytest.raises(ValueError, match="rope_type 'openpangu' needs config key 'mrope_interleaved' true"):
        rope.parse_config({"rope_type": "openpangu", "mrope_section": [4, 6, 6], "mrope_interleaved": False})
    with pytest.raises(ValueError, match="style must be one of"):
        section_axes([2, 2, 2], 6, style="zigzag")


def test_apply_errors():
    q = k = torch.randn(1, 4, 1, 8)
    theta = rope.inv_freq({}, 8)[0]
    axes = section_axes([2, 1, 1], 4)
    expected = r"position_ids must have shape \[3, seq\] = \[3, 4\] or \[3, batch, seq\] = \[3, 1, 4\] \(rows t, h, w\)"
    with pytest.raises(ValueError, match=expected):
        apply_mrope(q, k, torch.arange(4), theta, axes)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        apply_mrope(q, k, torch.zeros(3, 4), theta, axes)
    with pytest.raises(ValueError, match=expected):
        apply_mrope(q, k, torch.zeros(3, 5, dtype=torch.int64), theta, axes)
    with pytest.raises(ValueError, match=r"axes must hold 4 values in \{0, 1, 2\}"):
        apply_mrope(q, k, torch.zeros(3, 4, dtype=torch.int64), theta, torch.tensor([0, 1, 3, 2]))
    with pytest.raises(ValueError, match="axes must hold 4 values"):
        apply_mrope(q, k, torch.zeros(3, 4, dtype=torch.int64), theta, axes[:3])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_axes_of_any_integer_dtype_pick_rows(dtype):
    """Axes of any integer dtype pick the rows that int64 axes pick (uint8 ones are not a mask)."""
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 3, 2, 8, generator=gen), torch.randn(2, 3, 1, 8, generator=gen)
    positions = torch.randint(0, 2**20, (3, 2, 3), generator=gen)
    theta, axes = rope.inv_freq({}, 8)[0], torch.tensor([2, 0, 1, 2])
    expected = apply_mrope(q, k, positions, theta, axes)
    got = apply_mrope(q, k, positions, theta, axes.to(dtype))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert torch.equal(pair_positions(positions, axes.to(dtype)), pair_positions(positions, axes))


class _LaunchRecorder:
    """Stands for the jitted kernel: ``kernel[grid](*args, **options)`` records the arguments."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **options: self.launches.append(args)


def _as_on_cuda(monkeypatch):
    """The value checks in their CUDA form (rope._checks.assert_values: asynchronous assertions,
    which the CPU runs eagerly), and every read of a tensor's values on the host an error."""
    def assert_async(name, ok, expected):
        torch._assert_async(ok, f"{name} must hold {expected}")

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor's value was read on the host (a device synchronisation on CUDA)")

    monkeypatch.setattr(rope._checks, "assert_values", assert_async)
    monkeypatch.setattr(rope._checks, "reads_are_free", lambda device: False)  # the CPU's reading paths off
    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_apply_mrope_reads_no_tensor_value_on_the_host(backend, monkeypatch):
    """No host synchronisation per call: with the checks as on CUDA and host reads refused,
    apply_mrope rotates (torch path: the same numbers; kernel path: up to the launch, which is
    recorded, with the axes as given) and refuses an axis out of range through the assertion."""
    gen = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 3, 2, 8, generator=gen), torch.randn(2, 3, 1, 8, generator=gen)
    positions = torch.randint(0, 2**31 - 1, (3, 2, 3), generator=gen)
    theta, axes, bad_axes = rope.inv_freq({}, 8)[0], torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 3, 1])
    expected = apply_mrope(q, k, positions, theta, axes, backend="torch")
    if backend == "triton":
        triton_rotary = pytest.importorskip("rope.kernels.triton_rotary")
        names = triton_rotary.rotary_kernel.arg_names
        monkeypatch.setattr(triton_rotary, "rotary_kernel", recorder := _LaunchRecorder())
        triton_rotary.needs_fma_by_parts()  # its one probe of the interpreter (cached) reads values: before
    _as_on_cuda(monkeypatch)
    got = apply_mrope(q, k, positions, theta, axes, backend=backend)
    with pytest.raises(RuntimeError, match=r"^axes must hold"):
        apply_mrope(q, k, positions, theta, bad_axes, backend=backend)
    monkeypatch.undo()
    if backend == "torch":
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    else:
        (launch,) = recorder.launches
        assert torch.equal(dict(zip(names, launch))["AXES"], axes)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("bad, error", [
    (torch.zeros(3, 5, dtype=torch.long), ValueError),  # seq 5, not 4
    (torch.zeros(2, 4, dtype=torch.long), ValueError),  # two rows, not t, h, w
    (torch.zeros(3, 2, 4, dtype=torch.long), ValueError),  # batch 2, not 1
    (torch.zeros(3, 4), TypeError),  # float positions
])
def test_bad_position_ids_are_named_on_both_backends(backend, bad, error):
    """apply_mrope calls its positions position_ids: the kernel path's errors name them so too."""
    if backend == "triton":
        pytest.importorskip("rope.kernels.operators")
    q, k = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16)
    theta, axes = rope.inv_freq({}, 16)[0], section_axes([2, 3, 3], 8)
    with pytest.raises(error, match=r"position_ids"):
        apply_mrope(q, k, bad, theta, axes, backend=backend)


# ----- position ids of text and visual blocks -----------------------------------------------------


def test_multimodal_positions_text_image_text():
    positions = multimodal_positions([3, (1, 2, 4), 2], start=5)
    assert positions.shape == (3, 3 + 8 + 2)
    assert torch.equal(positions[:, :3], torch.arange(5, 8).expand(3, -1))
    image = positions[:, 3:11]
    assert torch.equal(image[0], torch.full((8,), 8))
    assert torch.equal(image[1], torch.tensor([8, 8, 8, 8, 9, 9, 9, 9]))
    assert torch.equal(image[2], torch.tensor([8, 9, 10, 11, 8, 9, 10, 11]))
    assert torch.equal(positions[:, 11:], torch.tensor([12, 13]).expand(3, -1))  # 8 + max(H, W)


def test_video_frames_step_by_the_time_interval():
    positions = multimodal_positions([(3, 1, 2), 1], time_interval=4)
    assert positions[0].tolist() == [0, 0, 4, 4, 8, 8, 9]
    assert positions[1].tolist() == [0, 0, 0, 0, 0, 0, 9]
    assert positions[2].tolist() == [0, 1, 0, 1, 0, 1, 9]


@pytest.mark.parametrize("segments, error", [([], ValueError), ([0], ValueError), ([(1, 2)], ValueError),
                                             ([(1, 0, 2)], ValueError), ([True], TypeError), ([2.0], TypeError),
                                             ([(1, 2.0, 2)], TypeError), (["3"], TypeError), ([[1, 2, 2]], TypeError)])
def test_multimodal_positions_errors(segments, error):
    with pytest.raises((TypeError, ValueError), match="segment") as caught:
        multimodal_positions(segments)
    assert type(caught.value) is error


INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("seed", range(4))
def test_an_int_time_interval_multiplies_exactly(seed):
    """Integers stay integers: frame f of a block from s is at s + f * time_interval exactly, also
    where float32 (what a float time_interval uses) would round the product."""
    gen = torch.Generator().manual_seed(seed)
    interval = int(torch.randint(2**40, 2**50, (1,), generator=gen)) | 1  # odd: no float32 value of 24 bits
    frames, start = int(torch.randint(2, 6, (1,), generator=gen)), int(torch.randint(0, 100, (1,), generator=gen))
    positions = multimodal_positions([3, (frames, 1, 2), 1], start=start, time_interval=interval)
    block_start = start + 3
    expected_t = [block_start + f * interval for f in range(frames) for _ in range(2)]
    assert positions[0, 3:-1].tolist() == expected_t
    assert positions[:, -1].tolist() == [expected_t[-1] + 1] * 3  # text continues past the block
    assert positions[0, 3:-1].tolist() != (torch.arange(frames) * float(interval)).long().repeat_interleave(2).add(
        block_start).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_positions_past_int64_are_refused_naming_time_interval(seed):
    gen = torch.Generator().manual_seed(seed)
    frames = int(torch.randint(2, 6, (1,), generator=gen))
    largest = INT64_MAX // (frames - 1)  # the largest int interval whose last frame fits
    slack = INT64_MAX - (frames - 1) * largest
    t = multimodal_positions([(frames, 1, 1)], start=slack, time_interval=largest)[0]
    assert t.tolist() == [slack + f * largest for f in range(frames)] and t[-1] == INT64_MAX
    for interval, start, segments in [(largest + 1, 0, [(frames, 1, 1)]),  # the frame itself
                                      (largest, slack + 1, [(frames, 1, 1)]),  # the frame plus the block's start
                                      (largest, 0, [(frames, 1, 1), slack + 1]),  # the text after it
                                      (float(2**64) * (1 + float(torch.rand(1, generator=gen))), 0, [(frames, 1, 1)]),
                                      (1e300, 0, [(frames, 1, 1)])]:  # not even a float32
        with pytest.raises(ValueError) as caught:
            multimodal_positions(segments, start=start, time_interval=interval)
        assert names(str(caught.value), "time_interval"), str(caught.value)
    with pytest.raises(ValueError, match="start"):
        multimodal_positions([3], start=INT64_MAX - 1)
    assert multimodal_positions([2], start=INT64_MAX - 1)[0].tolist() == [INT64_MAX - 1, INT64_MAX]


def test_numpy_integers_are_ints_in_the_mrope_helpers():
    """README "Errors": NumPy integers are integers (and numbers), giving what the int gives."""
    gen = torch.Generator().manual_seed(7)
    section = torch.randint(1, 5, (3,), generator=gen).tolist()
    pairs = sum(section)
    for style in ("chunked", "interleaved"):
        as_numpy = [np.int64(section[0]), np.int32(section[1]), np.uint8(section[2])]
        try:
            expected = section_axes(section, pairs, style=style)
        except ValueError:  # an interleaved section that does not fit: the same error for NumPy ints
            with pytest.raises(ValueError, match="does not fit"):
                section_axes(as_numpy, np.int64(pairs), style=style)
            continue
        assert torch.equal(section_axes(as_numpy, np.int64(pairs), style=style), expected)
    checked = check_section([np.int64(s) for s in section])
    assert checked == tuple(section) and all(type(s) is int for s in checked)
    segments = [3, (2, 2, 3), 1]
    expected = multimodal_positions(segments, start=4, time_interval=3)
    numpy_segments = [np.int64(3), (np.int32(2), np.int64(2), np.uint8(3)), np.int16(1)]
    assert torch.equal(multimodal_positions(numpy_segments, start=np.int64(4), time_interval=np.int64(3)), expected)
    interval = float(np.float32(torch.rand(1, generator=gen).item() * 10))
    assert torch.equal(multimodal_positions(segments, time_interval=np.float32(interval)),
                       multimodal_positions(segments, time_interval=interval))


@pytest.mark.parametrize(
    "call, error, argument",
    [
        (lambda: section_axes([2.0, 1, 1], 4), TypeError, "mrope_section"),
        (lambda: section_axes([2, True, 1], 4), TypeError, "mrope_section"),
        (lambda: section_axes([2, 1, 1], 4.0), TypeError, "pairs"),
        (lambda: section_axes([2, 1, 1], "4"), TypeError, "pairs"),
        (lambda: section_axes([2, 1, 1], 4, style=None), ValueError, "style"),
        (lambda: check_section([1, 2]), ValueError, "mrope_section"),
        (lambda: multimodal_positions([3], start=2.0), TypeError, "start"),
        (lambda: multimodal_positions([3], start=-1), ValueError, "start"),
        (lambda: multimodal_positions([(2, 1, 1)], time_interval="1"), TypeError, "time_interval"),
        (lambda: multimodal_positions([(2, 1, 1)], time_interval=True), TypeError, "time_interval"),
        (lambda: multimodal_positions([(2, 1, 1)], time_interval=-0.5), ValueError, "time_interval"),
        (lambda: multimodal_positions([(2, 1, 1)], time_interval=np.int64(-1)), ValueError, "time_interval"),
    ],
)
def test_wrong_types_are_type_errors_and_wrong_values_value_errors(call, error, argument):
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    assert type(caught.value) is error, repr(caught.value)
    assert names(str(caught.value), argument), str(caught.value)


# ----- transformers ------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")
from transformers import Qwen2VLTextConfig, Qwen3VLTextConfig  # noqa: E402
from transformers.models.qwen2_vl import modeling_qwen2_vl  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl  # noqa: E402

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MODELS = {
    "qwen2_vl": (Qwen2VLTextConfig, modeling_qwen2_vl.Qwen2VLTextModel, modeling_qwen2_vl,
                 {"type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 1e4}),
    "qwen3_vl": (Qwen3VLTextConfig, modeling_qwen3_vl.Qwen3VLTextModel, modeling_qwen3_vl,
                 {"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True, "rope_theta": 5e5}),
}


def tiny_model(name, seed):
    config_class, model_class, _, params = MODELS[name]
    torch.manual_seed(seed)
    config = config_class(**TINY, head_dim=16, rope_parameters=dict(params), initializer_range=0.2)
    return model_class(config).eval()


@pytest.mark.parametrize("name", list(MODELS))
def test_tables_match_transformers_within_its_float32_angle_error(name):
    model = tiny_model(name, seed=1)
    gen = torch.Generator().manual_seed(len(name))
    position_ids = torch.randint(0, 4096, (3, 2, 24), generator=gen)
    x = torch.randn(2, 24, 8)
    theirs = model.rotary_emb(x, position_ids)
    ours = rope.hf.RotaryEmbedding(model.config)(x, position_ids)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape == (2, 24, 16) and a.dtype == b.dtype
        assert (a - b).abs().max() <= 4096 * 2.0**-24 + 2.0**-23


def test_qwen35_partial_rotary_tables_match_transformers():
    """Qwen3.5: interleaved sections over a quarter of the head (the pairs transformers rotates)."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    params = {"rope_type": "default", "mrope_section": [3, 3, 2], "mrope_interleaved": True, "rope_theta": 1e7,
              "partial_rotary_factor": 0.25}
    config = Qwen3_5TextConfig(**TINY, head_dim=64, rope_parameters=params)
    gen = torch.Generator().manual_seed(35)
    position_ids = torch.randint(0, 4096, (3, 1, 10), generator=gen)
    x = torch.randn(1, 10, 8)
    theirs = Qwen3_5TextRotaryEmbedding(config)(x, position_ids)
    ours = rope.hf.RotaryEmbedding(config)(x, position_ids)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape == (1, 10, 16)
        assert (a - b).abs().max() <= 4096 * 2.0**-24 + 2.0**-23


@pytest.mark.parametrize("name", list(MODELS))
def test_same_hidden_states_with_rope_installed(name, monkeypatch):
    model = tiny_model(name, seed=len(name))
    module = MODELS[name][2]
    position_ids = multimodal_positions([3, (1, 3, 4), (2, 2, 2), 4])[:, None].expand(3, 2, -1)
    tokens = torch.randint(0, 97, (2, position_ids.shape[-1]), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(input_ids=tokens, position_ids=position_ids).last_hidden_state
        assert rope.hf.install(model) == 1
        monkeypatch.setattr(module, "apply_rotary_pos_emb", rope.hf.apply_rotary_pos_emb)
        got = model(input_ids=tokens, position_ids=position_ids).last_hidden_state
    assert isinstance(model.rotary_emb, rope.hf.RotaryEmbedding) and model.rotary_emb.mrope_axes is not None
    assert got.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)


def test_glm4v_interleaved_tables_and_pairs(monkeypatch):
    """GLM-4V: chunked sections, each angle twice in a row in the tables, pairs (2i, 2i + 1) over
    half the head. install finds the table form; rope's function for those tables, fed rope's
    tables, rotates from the exact angles; the hidden states match transformers'."""
    from transformers import Glm4vTextConfig
    from transformers.models.glm4v import modeling_glm4v

    config = Glm4vTextConfig(**TINY, head_dim=16,
                             rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1e4,
                                              "partial_rotary_factor": 0.5})
    torch.manual_seed(4)
    model = modeling_glm4v.Glm4vTextModel(config).eval()
    position_ids = multimodal_positions([3, (1, 3, 4), 4])[:, None].expand(3, 2, -1)
    tokens = torch.randint(0, 97, (2, position_ids.shape[-1]), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(input_ids=tokens, position_ids=position_ids).last_hidden_state
        assert rope.hf.install(model) == 1
        assert model.rotary_emb.tables == "interleaved" and model.rotary_emb.mrope_axes is not None
        torch.testing.assert_close(model(input_ids=tokens, position_ids=position_ids).last_hidden_state, expected,
                                   rtol=1e-4, atol=2e-5)
        monkeypatch.setattr(modeling_glm4v, "apply_rotary_pos_emb", rope.hf.apply_rotary_pos_emb_interleaved_tables)
        got = model(input_ids=tokens, position_ids=position_ids).last_hidden_state
    assert got.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)


def test_multimodal_positions_equal_transformers_get_rope_index_for_images():
    """Text, an image, text, another image, text: the position ids transformers' Qwen2-VL computes
    from token types and the images' patch grids (before the 2 x 2 merge)."""
    import functools
    import types

    model = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(
        spatial_merge_size=2)))
    model.get_vision_position_ids = functools.partial(modeling_qwen2_vl.Qwen2VLModel.get_vision_position_ids, model)
    token_types = [0] * 3 + [1] * 6 + [0] * 2 + [1] * 3 + [0] * 4
    grids = torch.tensor([[1, 4, 6], [1, 6, 2]])  # patches; merged 2 x 2 into 2 x 3 and 3 x 1 tokens
    theirs, _ = modeling_qwen2_vl.Qwen2VLModel.get_rope_index(
        model, torch.zeros(1, len(token_types), dtype=torch.long), torch.tensor([token_types]), image_grid_thw=grids)
    ours = multimodal_positions([3, (1, 2, 3), 2, (1, 3, 1), 4])
    assert torch.equal(theirs[:, 0], ours)


def test_video_frames_match_transformers_vision_position_ids():
    """A video block with a fractional frame spacing (Qwen2.5-VL: seconds per frame times tokens
    per second): the same position ids as transformers' get_vision_position_ids."""
    for interval in (0.5, 2.5, 7):
        theirs = modeling_qwen2_vl.Qwen2VLModel.get_vision_position_ids(
            None, 5, torch.tensor([4, 4, 6]), 1, 2, time_interval=interval)
        ours = multimodal_positions([(4, 2, 3)], start=5, time_interval=interval)
        assert torch.equal(theirs, ours)
    with pytest.raises(ValueError, match="time_interval must be finite"):
        multimodal_positions([(1, 1, 1)], time_interval=float("nan"))


def default_sections_model(model_type: str, class_name: str, **sizes):
    """A tiny text model of a vision-language family whose config names no mrope_section, so that
    transformers' module uses its class default (sized for heads of 128)."""
    import importlib

    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type).get_text_config()
    for key, value in dict(TINY, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                           **sizes).items():
        if hasattr(config, key):
            setattr(config, key, value)
    assert "mrope_section" not in (config.rope_parameters or {})
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    torch.manual_seed(len(model_type))
    return getattr(module, class_name)(config).eval()


@pytest.mark.parametrize("model_type, class_name, sizes, sections, style, ours", [
    ("qwen2_5_vl", "Qwen2_5_VLTextModel", {}, (16, 24, 24), "chunked", rope.hf.apply_rotary_pos_emb),
    ("qwen3_vl_moe", "Qwen3VLMoeTextModel", dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
     (24, 20, 20), "interleaved", rope.hf.apply_rotary_pos_emb),
    ("ernie4_5_vl_moe", "Ernie4_5_VLMoeTextModel", {}, (22, 22, 20), "alternating",
     rope.hf.apply_rotary_pos_emb_interleaved_tables),
])
def test_install_finds_the_model_default_sections(model_type, class_name, sizes, sections, style, ours, monkeypatch):
    """With no mrope_section in the config, install takes the sections from the module it replaces
    and finds by probing how the model deals them to pairs (ERNIE 4.5 VL also lays its tables out
    with each angle twice in a row and pairs (2i, 2i + 1)); rope's apply function then agrees too."""
    import importlib

    model = default_sections_model(model_type, class_name, **sizes)
    position_ids = multimodal_positions([3, (1, 3, 4), 4])[:, None].expand(3, 2, -1)
    tokens = torch.randint(0, 97, (2, position_ids.shape[-1]), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(input_ids=tokens, position_ids=position_ids).last_hidden_state
        assert rope.hf.install(model) == 1
        installed = model(input_ids=tokens, position_ids=position_ids).last_hidden_state
        monkeypatch.setattr(importlib.import_module(type(model).__module__), "apply_rotary_pos_emb", ours)
        patched = model(input_ids=tokens, position_ids=position_ids).last_hidden_state
    config = model.rotary_emb.rope_config
    assert config.mrope_section == sections and config.mrope_style == style
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(installed, expected, rtol=1e-4, atol=2e-5)
    torch.testing.assert_close(patched, expected, rtol=1e-4, atol=2e-5)


def test_three_rows_of_positions_need_sections():
    embedding = rope.hf.RotaryEmbedding(rope_parameters={"rope_theta": 1e4}, head_dim=16)
    with pytest.raises(ValueError, match=r"look like M-RoPE's \[3, batch, seq\], but the rope_parameters have no"):
        embedding(torch.zeros(1), torch.zeros(3, 1, 4, dtype=torch.long))


@pytest.mark.parametrize("seed", range(6))
def test_fractional_frame_spacing_rounds_as_transformers_does(seed):
    """Fresh intervals of every size that fits: transformers' get_vision_position_ids (float32
    frame times, truncated) and multimodal_positions agree position for position."""
    gen = torch.Generator().manual_seed(seed)
    frames, start = int(torch.randint(1, 40, (1,), generator=gen)), int(torch.randint(0, 10**6, (1,), generator=gen))
    for exponent in (-3, 0, 3, 9, 15):
        interval = float(torch.rand(1, generator=gen, dtype=torch.float64)) * 10.0**exponent
        theirs = modeling_qwen2_vl.Qwen2VLModel.get_vision_position_ids(
            None, start, torch.tensor([frames, 4, 2]), 1, 2, time_interval=interval)
        ours = multimodal_positions([(frames, 2, 1)], start=start, time_interval=interval)
        assert torch.equal(theirs, ours), interval
