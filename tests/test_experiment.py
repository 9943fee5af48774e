"""The extrapolation experiment: the synthetic language, every method's scheme, the tiny preset."""

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import LargestTensor
from rope import reference
from rope.attention.encodings import alibi_slopes
from rope.experiment import (
    METHODS,
    PRESETS,
    Context,
    ModelSpec,
    RecallTask,
    TaskSpec,
    TinyTransformer,
    methods,
    run,
    runner,
)
from rope.experiment.__main__ import DEFAULT_OUT, main
from rope.experiment.data import ANCHOR, MARKOV, RECALL, recall_distances
from rope.experiment.methods import Alibi, LogN, ReRoPE, Rotary
from rope.experiment.runner import load_results
from rope.experiment.train import PlainProgress, evaluate, progress_bar, scored_logits
from rope.frequencies import inv_freq

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_DIR = ROOT / "rope" / "experiment" / "results"
SPEC = TaskSpec(markov_vocab=12, successors=3, anchors=10, span=3, event_rate=0.2, seed=7)


@pytest.fixture(scope="module")
def sample():
    task = RecallTask(SPEC)
    tokens, kinds = task.sample(24, 96, seed=5)
    return task, tokens, kinds


def test_sample_is_deterministic_in_its_seed(sample):
    task, tokens, kinds = sample
    again, again_kinds = RecallTask(SPEC).sample(24, 96, seed=5)
    other, _ = task.sample(24, 96, seed=6)
    assert torch.equal(tokens, again) and torch.equal(kinds, again_kinds)
    assert not torch.equal(tokens, other)
    assert tokens.dtype == kinds.dtype == torch.int64 and tokens.shape == kinds.shape == (24, 96)


def test_token_ranges_follow_kinds(sample):
    _, tokens, kinds = sample
    chain = tokens[kinds != ANCHOR]
    assert int(chain.min()) >= 0 and int(chain.max()) < SPEC.markov_vocab
    anchors = tokens[kinds == ANCHOR]
    assert int(anchors.min()) >= SPEC.markov_vocab and int(anchors.max()) < SPEC.vocab_size
    assert {MARKOV, ANCHOR, RECALL} <= set(kinds.unique().tolist())


def test_markov_tokens_are_transitions_of_the_chain(sample):
    """Each Markov token has positive probability from the previous chain token (anchors skipped)."""
    task, tokens, kinds = sample
    checked = 0
    for row, row_kinds in zip(tokens.tolist(), kinds.tolist()):
        state = None
        for token, kind in zip(row, row_kinds):
            if kind == ANCHOR:
                continue
            if kind == MARKOV and state is not None:
                assert task.transitions[state, token] > 0
                checked += 1
            state = token
    assert checked > 1000


def test_recalled_spans_copy_the_first_occurrence(sample):
    """After a repeated anchor, the span equals the tokens after that anchor's first occurrence;
    after a new anchor come Markov tokens; no anchor is new twice."""
    _, tokens, kinds = sample
    recalls = 0
    for row, row_kinds in zip(tokens.tolist(), kinds.tolist()):
        first = {}
        for t, (token, kind) in enumerate(zip(row, row_kinds)):
            if kind != ANCHOR:
                continue
            follow = row_kinds[t + 1 : t + 1 + SPEC.span]
            if token in first:
                source = first[token]
                assert follow == [RECALL] * len(follow)
                assert row[t + 1 : t + 1 + len(follow)] == row[source + 1 : source + 1 + len(follow)]
                recalls += len(follow)
            else:
                assert follow == [MARKOV] * len(follow)
                first[token] = t
    assert recalls == int((kinds == RECALL).sum()) > 50


def test_recall_distances_reach_back_across_the_sequence(sample):
    _, tokens, kinds = sample
    distances = recall_distances(tokens, kinds)
    assert len(distances) == int((kinds == RECALL).sum())
    assert float(distances.min()) >= SPEC.span + 1 and float(distances.max()) < tokens.shape[1]
    assert float(distances.max()) > tokens.shape[1] / 2


def test_entropy_rate_matches_the_chain():
    """H from the stationary distribution equals a long-run average of -ln P along the chain,
    and pi is stationary (pi P = pi) for a row-stochastic P."""
    task = RecallTask(SPEC)
    p = task.transitions
    assert np.allclose(p.sum(axis=1), 1.0) and ((p > 0).sum(axis=1) == SPEC.successors).all()
    pi = task.stationary_distribution()
    assert np.allclose(pi @ p, pi, atol=1e-12) and (pi >= -1e-12).all()
    rng = np.random.default_rng(11)
    state, total, steps = 0, 0.0, 40000
    for _ in range(steps):
        nxt = rng.choice(SPEC.markov_vocab, p=p[state])
        total -= math.log(p[state, nxt])
        state = nxt
    assert abs(total / steps - task.entropy_rate()) < 0.03


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TaskSpec(markov_vocab=4, successors=5), "successors"),
        (lambda: TaskSpec(event_rate=1.5), "event_rate"),
        (lambda: RecallTask("spec"), "spec"),
        (lambda: RecallTask(SPEC).sample(2, 0, 1), "length"),
        (lambda: ModelSpec(vocab_size=10, d_model=30, num_heads=4), "num_heads"),
        (lambda: run("huge"), "preset"),
        (lambda: dataclasses.replace(PRESETS["tiny"], seed=-1), "seed"),
        (lambda: dataclasses.replace(PRESETS["tiny"], long_eval_multiples=[64]), "long_eval_multiples"),
        (lambda: dataclasses.replace(PRESETS["tiny"], long_eval_multiples=(64, 0)), r"long_eval_multiples\[1\]"),
        (lambda: dataclasses.replace(PRESETS["tiny"], long_eval_multiples=(32.0,)), "long_eval_multiples"),
        (lambda: run(PRESETS["tiny"], methods=["rope", "sinusoidal"]), "sinusoidal"),
        (lambda: run("tiny", output="results.json", overwrite="yes"), "overwrite"),
        (lambda: run("tiny", output=3), "output"),
        (lambda: run("tiny", output="results.md"), r"\.md"),
        (lambda: run("tiny", output="results.MD"), r"\.md"),  # the same file as its table where case is ignored
        (lambda: run("tiny", methods=["rope", "rope"]), "methods must name each method once"),
        (lambda: run("tiny", methods=[]), "methods must name at least one"),
        (lambda: run("tiny", methods=5), "methods must be a list"),
        (lambda: run("tiny", methods=[["rope"]]), "methods must be a list"),
        (lambda: dataclasses.replace(PRESETS["tiny"], eval_multiples=(1, 2, 1)), "eval_multiples must not repeat"),
        (lambda: dataclasses.replace(PRESETS["tiny"], long_eval_multiples=(64, 64)), "long_eval_multiples"),
        # torch.set_num_threads takes a C int ("Overflow when unpacking long" when the run starts)
        (lambda: dataclasses.replace(PRESETS["tiny"], threads=2**31), "^threads must be <= 2147483647"),
        # an odd head dimension: refused when the config is made, not when the run builds the model
        (lambda: dataclasses.replace(PRESETS["tiny"], d_model=6, num_heads=2), "d_model / num_heads"),
    ],
)
def test_bad_input_is_rejected(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


TINY = ModelSpec(vocab_size=SPEC.vocab_size, d_model=32, num_heads=2, num_layers=2)
L = 16


def _ctx(length):
    return Context(length=length, training_length=L, head_dim=TINY.head_dim, num_heads=TINY.num_heads,
                   rope_theta=10000.0, finetune_factor=4.0)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_runs_at_twice_the_training_length(name):
    torch.manual_seed(0)
    model = TinyTransformer(TINY).eval()
    tokens, _ = RecallTask(SPEC).sample(3, 2 * L, seed=1)
    with torch.no_grad():
        logits = scored_logits(model, METHODS[name], _ctx(L), tokens)
    assert logits.shape == (3, 2 * L, SPEC.vocab_size) and torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["pi", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "llama3", "leaky_rerope", "logn"])
def test_extension_methods_change_nothing_within_the_training_length(name):
    """At length <= L every factor is 1: the scheme attends as RoPE does."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4 * L, 2, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    for length in (L, 4 * L):
        inputs = q[:, :length], k[:, :length], v[:, :length], torch.arange(length)
        plain = METHODS["rope"].build(_ctx(length)).attend(*inputs)
        scaled = METHODS[name].build(_ctx(length)).attend(*inputs)
        assert torch.allclose(scaled, plain, rtol=0, atol=1e-12) == (length == L)


def _matrix_logits(q, k, rotation_between):
    """Float64 reference: logit[b, h, m, n] = q_m^T M k_n / sqrt(d), M = rotation_between(m, n) explicit."""
    batch, seq, heads, dim = q.shape
    out = torch.empty(batch, heads, seq, seq, dtype=torch.float64)
    for m in range(seq):
        for n in range(seq):
            rotation = rotation_between(m, n)
            out[:, :, m, n] = torch.einsum("bhd,de,bhe->bh", q[:, m], rotation, k[:, n]) / math.sqrt(dim)
    return out


def test_schemes_match_explicit_rotation_matrices():
    """Rotary, YaRN's attention factor, log-n, ALiBi and (Leaky) ReRoPE against float64 R matrices."""
    gen = torch.Generator().manual_seed(4)
    seq, dim = 12, 8
    q, k = (torch.randn(2, seq, 2, dim, generator=gen, dtype=torch.float64) for _ in range(2))
    positions = torch.arange(seq)
    theta = inv_freq({"rope_type": "default", "rope_theta": 100.0}, dim)[0]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()

    def rot(r):
        return reference.rotation_matrix(r, theta)

    plain = _matrix_logits(q, k, lambda m, n: rot(n - m))  # (R_m q)^T (R_n k) = q^T R_{n-m} k
    assert torch.allclose(Rotary(theta).logits(q, k, positions), plain, atol=1e-12)
    assert torch.allclose(Rotary(theta, 1.3).logits(q, k, positions), 1.3**2 * plain, atol=1e-12)

    length = 4
    scale = torch.tensor([max(1.0, math.log(m + 1) / math.log(length)) for m in range(seq)], dtype=torch.float64)
    assert torch.allclose(LogN(theta, length).logits(q, k, positions), plain * scale[:, None], atol=1e-12)

    slopes = alibi_slopes(2)
    bias = -slopes[:, None, None] * (positions[:, None] - positions[None, :]).abs()
    unrotated = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(dim)
    assert torch.allclose(Alibi(2).logits(q, k, positions), unrotated + bias, atol=1e-12)

    window = 5
    v = torch.randn(2, seq, 2, 3, generator=gen, dtype=torch.float64)
    bends = ((None, lambda r: min(r, window)), (2.5, lambda r: r if r < window else window + (r - window) / 2.5))
    for leaky, bend in bends:
        logits = _matrix_logits(q, k, lambda m, n: rot(-bend(m - n)))  # q^T R_{-r'} k, r' = bent m - n
        weights = logits.masked_fill(~causal, -math.inf).softmax(dim=-1)
        expected = torch.einsum("bhmn,bnhd->bmhd", weights, v)
        got = ReRoPE(theta, window, leaky).attend(q, k, v, positions)
        assert torch.allclose(got, expected, rtol=0, atol=1e-12)
        plain = Rotary(theta).attend(q, k, v, positions)  # control: the bend matters at this length
        assert not torch.allclose(plain, expected, rtol=0, atol=1e-3)


@pytest.mark.parametrize("leaky", [None, 3.0])
def test_rerope_attends_through_the_fused_kernel_where_it_uses_the_kernel(leaky, monkeypatch):
    """The CUDA branch of ReRoPE.attend, run by Triton's interpreter on CPU tensors: float32 q, k, v
    give the float64 attention of the rotated inputs within float32 rounding, and never reach the
    blockwise operator."""
    gen = torch.Generator().manual_seed(11)
    seq, dim = 48, 16
    q, k, v = (torch.randn(1, seq, 2, dim, generator=gen) for _ in range(3))
    theta = inv_freq({"rope_type": "default", "rope_theta": 10000.0}, dim)[0]
    positions = torch.arange(seq)
    expected = ReRoPE(theta, 8, leaky).attend(q.double(), k.double(), v.double(), positions)
    monkeypatch.setattr(methods, "uses_kernel", lambda device: True)
    monkeypatch.setattr("rope.attention.blockwise.rotary_attention", None)  # would fail if called
    got = ReRoPE(theta, 8, leaky).attend(q, k, v, positions)
    assert got.dtype == torch.float32 and got.shape == (1, seq, 2, dim)
    assert (got.double() - expected).abs().max() < 1e-5


def test_only_cuda_devices_use_the_kernel():
    assert methods.uses_kernel(torch.device("cuda", 0)) and not methods.uses_kernel(torch.device("cpu"))


@pytest.mark.parametrize("name", ["rerope", "leaky_rerope"])
def test_rerope_never_forms_the_seq_by_seq_matrix_in_the_model(name):
    """A whole forward pass of the model at 1024 tokens: ReRoPE's largest tensor is a tile, a
    quarter of seq^2 at most, where RoPE's written-out attention forms heads x seq^2."""
    torch.manual_seed(0)
    model = TinyTransformer(TINY).eval()
    seq = 1024
    tokens, _ = RecallTask(SPEC).sample(1, seq, seed=4)
    with torch.no_grad():
        with LargestTensor() as rerope_mode:
            logits = model(tokens, METHODS[name].build(_ctx(seq)))
        with LargestTensor() as rope_mode:
            model(tokens, METHODS["rope"].build(_ctx(seq)))
    assert torch.isfinite(logits).all()
    assert rerope_mode.inside > 0 and rerope_mode.largest <= seq**2 // 4
    assert rope_mode.largest >= TINY.num_heads * seq**2


def test_dynamic_ntk_reads_each_block_with_its_prefix_length():
    """Per-prefix evaluation: the first L positions get RoPE's logits, the last block equals NTK at the full length."""
    torch.manual_seed(0)
    model = TinyTransformer(TINY).eval()
    tokens, _ = RecallTask(SPEC).sample(2, 3 * L, seed=2)
    with torch.no_grad():
        dynamic = scored_logits(model, METHODS["dynamic_ntk"], _ctx(L), tokens)
        plain = model(tokens[:, :L], METHODS["rope"].build(_ctx(L)))
        ntk = model(tokens, METHODS["ntk"].build(_ctx(3 * L)))
    assert torch.allclose(dynamic[:, :L], plain, atol=1e-6)
    assert torch.allclose(dynamic[:, 2 * L :], ntk[:, 2 * L :], atol=1e-5)
    assert not torch.allclose(dynamic[:, L : 2 * L], ntk[:, L : 2 * L], atol=1e-4)


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    path = tmp_path_factory.mktemp("experiment") / "tiny.json"
    results = run("tiny", output=path, progress=False)
    return path, results


def test_tiny_preset_results_file_has_every_method_and_finite_numbers(tiny_results):
    path, results = tiny_results
    loaded = load_results(path)
    config = PRESETS["tiny"]
    assert loaded["lengths"] == [m * config.training_length for m in config.eval_multiples]
    assert set(loaded["methods"]) == set(METHODS)
    for row in loaded["methods"].values():
        assert all(0.0 <= a <= 1.0 for a in row["recall_accuracy"])
        assert all(0.0 < x < 2 * math.log(config.task.vocab_size) for x in row["loss"])
    for key in ("device", "torch", "threads"):
        assert key in loaded["environment"]
    assert loaded["wall_time_s"] > 0 and set(loaded["training"]) == {"rope", "alibi", "nope", "pi_finetuned",
                                                                     "yarn_finetuned"}
    # Training lowers the loss, and at 1x every frequency method is exactly the RoPE model.
    assert all(t["final_loss"] < t["first_loss"] for t in loaded["training"].values())
    for name in ("pi", "ntk", "dynamic_ntk", "ntk_by_parts", "yarn", "llama3", "logn", "leaky_rerope"):
        assert loaded["methods"][name]["loss"][0] == pytest.approx(loaded["methods"]["rope"]["loss"][0], abs=1e-6)
    # The longer lengths: the O(seq)-memory methods alone, scored as evaluate() scores them.
    long = loaded["long"]
    assert long["lengths"] == config.long_eval_lengths == [64 * config.training_length]
    assert set(long["methods"]) == {n for n, m in METHODS.items() if m.linear_memory} == {"rerope", "leaky_rerope"}
    assert [s["length"] for s in long["samples"]] == long["lengths"]
    length = long["lengths"][0]
    spec = ModelSpec(config.task.vocab_size, config.d_model, config.num_heads, config.num_layers, config.mlp_ratio)
    torch.manual_seed(config.seed)
    untrained = TinyTransformer(spec)
    tokens, kinds = RecallTask(config.task).sample(1, length, runner.EVAL_SEED + length)
    ctx = Context(length=length, training_length=config.training_length, head_dim=spec.head_dim,
                  num_heads=spec.num_heads, rope_theta=config.rope_theta, finetune_factor=4.0)
    fresh = evaluate(untrained, METHODS["rerope"], ctx, tokens, kinds, batch_size=1)
    assert fresh["loss"] > long["methods"]["rerope"]["loss"][0] + 0.1  # the trained model was scored
    for row in long["methods"].values():
        assert all(0.0 < x < 2 * math.log(config.task.vocab_size) for x in row["loss"])
    assert "O(seq)-memory methods at longer lengths" in path.with_suffix(".md").read_text()


@pytest.mark.slow
def test_tiny_preset_is_deterministic_and_the_command_line_writes_it(tiny_results, tmp_path, capsys):
    _, results = tiny_results
    path = tmp_path / "again.json"
    main(["--preset", "tiny", "--methods", "rope", "yarn", "--output", str(path), "--no-progress"])
    again = load_results(path)
    for name in ("rope", "yarn"):
        assert again["methods"][name] == results["methods"][name]
    assert again["long"] == {"lengths": [], "samples": [], "methods": {}}  # no O(seq)-memory method was asked for
    assert "YaRN" in capsys.readouterr().out
    table = path.with_suffix(".md").read_text()
    assert "preset `tiny`" in table and f"| YaRN | {again['methods']['yarn']['loss'][0]:.3f} |" in table
    assert torch.get_num_threads() >= 1 and not torch.are_deterministic_algorithms_enabled()


@pytest.mark.slow
def test_progress_without_tqdm_is_plain_lines_and_the_same_results(tiny_results, tmp_path, monkeypatch, capsys):
    """tqdm is optional (the ``experiment`` extra): without it the command line runs, shows its
    progress as plain lines on stderr, and writes the same numbers."""
    _, results = tiny_results
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm.auto now raises ImportError
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    path = tmp_path / "plain.json"
    main(["--preset", "tiny", "--methods", "rope", "--output", str(path)])
    err = capsys.readouterr().err
    steps = PRESETS["tiny"].steps
    assert f"train rope: {steps}/{steps}, loss=" in err and "evaluate: " in err
    assert load_results(path)["methods"]["rope"] == results["methods"]["rope"]


def test_plain_progress_reports_every_tenth_and_the_end(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    bar = progress_bar(range(25), True, "count")
    assert isinstance(bar, PlainProgress) and progress_bar(range(3), False, "off") == range(3)
    for i in bar:
        bar.set_postfix(last=i)
    expected = [f"count: {n}/25, last={n - 1}" for n in (*range(2, 25, 2), 25)]
    assert capsys.readouterr().err.splitlines() == expected


@pytest.mark.slow
def test_run_seed_changes_training_but_not_the_evaluation_tokens(tiny_results, tmp_path):
    _, results = tiny_results
    main(["--preset", "tiny", "--seed", "1", "--methods", "rope", "--output", str(tmp_path / "s1.json"),
          "--no-progress"])
    other = load_results(tmp_path / "s1.json")
    assert other["config"]["seed"] == 1 and results["config"]["seed"] == 0
    assert other["task"] == results["task"]  # same language, same held-out sequences
    assert other["training"]["rope"]["first_loss"] != results["training"]["rope"]["first_loss"]
    assert other["methods"]["rope"]["loss"] != results["methods"]["rope"]["loss"]


def _committed_results() -> dict[Path, tuple[bytes, int]]:
    """The committed results files of the chapter (rope/experiment/results/): bytes and mtime."""
    files = sorted(COMMITTED_DIR.glob("extrapolation_results*"))
    assert {"extrapolation_results.json", "extrapolation_results.md"} <= {f.name for f in files}
    return {f: (f.read_bytes(), f.stat().st_mtime_ns) for f in files}


@pytest.mark.slow
def test_the_default_run_writes_its_own_folder_not_the_committed_results(tiny_results, tmp_path, monkeypatch):
    _, results = tiny_results
    before = _committed_results()
    monkeypatch.chdir(tmp_path)
    main(["--preset", "tiny", "--methods", "rope", "--no-progress"])
    assert _committed_results() == before
    written = tmp_path / DEFAULT_OUT / "extrapolation_results_tiny.json"
    assert sorted(p.name for p in written.parent.iterdir()) == [written.name, written.with_suffix(".md").name]
    assert load_results(written)["methods"]["rope"] == results["methods"]["rope"]


@pytest.mark.parametrize("seed", [[], ["--seed", "1"]])
def test_the_committed_results_are_refused_before_the_run_without_overwrite(seed, monkeypatch, capsys):
    """Even pointed at the committed results' folder, the command line stops at once, naming the file and the flag."""
    before = _committed_results()
    monkeypatch.setattr(runner, "_run", lambda *args: pytest.fail("the experiment ran"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", "cpu", "--out", str(COMMITTED_DIR), *seed])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    name = "extrapolation_results" + ("_seed1" if seed else "")
    assert f"{name}.json" in err and f"{name}.md" in err and "--overwrite" in err
    assert _committed_results() == before


@pytest.mark.parametrize("argv, flag", [
    (["--out", "{file}"], "--out"),  # an existing file as the results folder
    (["--out", "{file}/deeper"], "--out"),  # a folder under a file
    (["--output", "{file}/results.json"], "--output"),
    (["--output", "{folder}"], "--output"),  # a folder as the results file
    (["--output", ""], "--output"),
    (["--out", ""], "--out"),
    (["--device", "bogus"], "--device"),
    (["--device", "cuda:99"], "--device"),  # no CUDA here, or no 100th GPU
    (["--device", "meta"], "--device"),
    (["--seed", str(2**64)], "--seed"),  # beyond torch.manual_seed's range
    (["--seed", "-1"], "--seed"),
    (["--seed", "1.5"], "--seed"),
    (["--methods", "rope", "yarn", "rope"], "--methods"),  # a method twice: its rows would outgrow the lengths
    # names too long for the file system (255 bytes on Linux and macOS): os.access cannot tell, writing does
    (["--output", "{folder}/" + "x" * 300 + ".json"], "--output"),
    (["--out", "{folder}/new/" + "x" * 300], "--out"),  # and the folder "new", made to try, is removed
])
def test_every_argument_is_checked_before_the_run(argv, flag, tmp_path, monkeypatch, capsys):
    """A bad argument stops the command line at once with a usage error naming it (exit status 2),
    not after minutes of training, and not with a traceback."""
    monkeypatch.setattr(runner, "_run", lambda *args: pytest.fail("the experiment ran"))
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    argv = [arg.format(file=a_file, folder=tmp_path) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", "tiny", "--methods", "rope", "--no-progress", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:") and (f"error: argument {flag}:" in err or f"error: {flag}:" in err), err
    assert a_file.read_text() == "not a folder" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_run_checks_its_output_and_device_before_training(tmp_path, monkeypatch):
    """The Python API refuses the same arguments before anything is trained, naming them."""
    monkeypatch.setattr(runner, "_run", lambda *args: pytest.fail("the experiment ran"))
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for arguments, error, named in [
        (dict(output=a_file / "results.json"), ValueError, "output"),
        (dict(output=a_file / "deeper" / "results.json"), ValueError, "output"),
        (dict(output=tmp_path), ValueError, "output"),  # a folder is no results file
        (dict(device="bogus"), ValueError, "device"),
        (dict(device="cuda:99"), ValueError, "device"),
        (dict(device="meta"), ValueError, "device"),
        (dict(device=0), TypeError, "device"),
    ]:
        with pytest.raises(error, match=f"^{named}"):
            run("tiny", progress=False, **arguments)
    with pytest.raises(ValueError, match="^seed must be <= 18446744073709551615"):
        dataclasses.replace(PRESETS["tiny"], seed=2**64)


def test_what_the_file_system_refuses_is_refused_before_the_run(tmp_path, monkeypatch):
    """Where os.access says yes but writing fails (root on a read-only or virtual file system such
    as /proc), trying to write decides: the error names the argument and the system's reason, and
    the folders made to try are removed again."""
    monkeypatch.setattr(runner, "_run", lambda *args: pytest.fail("the experiment ran"))
    real_open = open

    def read_only(path, *args, **kwargs):
        if Path(path).parent.is_relative_to(tmp_path):
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", read_only)
    with pytest.raises(ValueError, match="^output: .*cannot be written there: Read-only file system"):
        run("tiny", output=tmp_path / "new" / "deeper" / "results.json", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_the_run_checks_every_scheme_before_training(monkeypatch):
    """A config whose frequencies are fine at the training length but underflow float32 at a
    longer evaluation length (PI divides them by 16 at 16 L) is refused naming rope_theta before
    anything is trained, not after the training."""
    monkeypatch.setattr(runner, "_run", lambda *args: pytest.fail("the experiment ran"))
    config = dataclasses.replace(PRESETS["tiny"], rope_theta=1e51)
    runner.check_schemes(config, ["rope"])  # the training scheme is fine
    with pytest.raises(ValueError, match="rope_theta"):
        run(config, methods=["rope", "pi"], progress=False)


def test_the_held_out_sequences_are_drawn_before_training(monkeypatch):
    """An evaluation length beyond memory fails before the training, not after it."""
    monkeypatch.setattr(runner, "_train_models", lambda *args: pytest.fail("the models were trained"))
    config = dataclasses.replace(PRESETS["tiny"], eval_multiples=(1, 2**40))
    with pytest.raises((MemoryError, ValueError)):
        run(config, methods=["rope"], progress=False)


def test_an_unwritable_folder_is_refused_before_the_run(tmp_path, monkeypatch):
    """os.access decides (the tests may run as root, who may write anywhere)."""
    monkeypatch.setattr(runner.os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(ValueError, match="not writable"):
        runner.check_output(tmp_path / "new" / "results.json")


@pytest.mark.parametrize("setting", [dict(learning_rate=1e308), dict(weight_decay=1e308)])
def test_a_diverging_training_stops_naming_its_setting(setting):
    """Finite settings whose training overflows the weights stop at the first loss that is not
    finite, naming the learning rate, instead of finishing the run with NaN results."""
    config = dataclasses.replace(PRESETS["tiny"], steps=4, warmup_steps=0, **setting)
    with pytest.raises(ValueError, match="^training diverged: the loss of step [1-3] is nan .*learning_rate"):
        runner._pretrain(config, config.model_spec, RecallTask(config.task), "rope", torch.device("cpu"), False)


def test_the_largest_seed_torch_takes_trains():
    """2^64 - 1, the largest seed of torch.manual_seed, seeds the initialization and the batches."""
    from rope.experiment.presets import MAX_SEED

    config = dataclasses.replace(PRESETS["tiny"], seed=MAX_SEED, steps=1, warmup_steps=0)
    spec = ModelSpec(config.task.vocab_size, config.d_model, config.num_heads, config.num_layers, config.mlp_ratio)
    _, summary = runner._pretrain(config, spec, RecallTask(config.task), "nope", torch.device("cpu"), False)
    assert summary["steps"] == 1 and math.isfinite(summary["first_loss"])
    with pytest.raises((ValueError, RuntimeError), match="Overflow"):  # torch's limit: one more is refused there
        torch.manual_seed(MAX_SEED + 1)


@pytest.mark.slow
def test_existing_results_are_refused_then_replaced_with_overwrite(tiny_results, tmp_path, monkeypatch, capsys):
    _, results = tiny_results
    out = tmp_path / "results"
    out.mkdir()
    table = out / "extrapolation_results_tiny.md"
    table.write_text("stale")  # the table alone is enough to refuse
    argv = ["--preset", "tiny", "--methods", "rope", "--out", str(out), "--no-progress"]
    with monkeypatch.context() as patched:
        patched.setattr(runner, "_run", lambda *args: pytest.fail("the experiment ran"))
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert str(table) in err and "--overwrite" in err and table.read_text() == "stale"
        with pytest.raises(FileExistsError, match="overwrite=True"):
            run("tiny", output=out / "extrapolation_results_tiny.json", progress=False)
    assert sorted(p.name for p in out.iterdir()) == [table.name]
    main([*argv, "--overwrite"])
    assert load_results(out / "extrapolation_results_tiny.json")["methods"]["rope"] == results["methods"]["rope"]
    assert "preset `tiny`" in table.read_text()


@pytest.mark.slow
def test_gpu_preset_sizes_run_end_to_end():
    """The gpu preset's model, task and lengths (L = 256, 4 layers of width 256), with a few steps
    and a short evaluation so that it fits in the CPU suite: shapes and configs are consistent."""
    config = dataclasses.replace(
        PRESETS["gpu"], name="gpu-smoke", steps=2, batch_size=2, warmup_steps=1, finetune_steps=1,
        eval_multiples=(1, 2), long_eval_multiples=(3,), eval_tokens=512, eval_batch_tokens=512, threads=1,
    )
    results = run(config, methods=["rope", "dynamic_ntk", "leaky_rerope", "alibi", "yarn_finetuned"], progress=False)
    assert results["lengths"] == [256, 512] and results["long"]["lengths"] == [768]
    assert list(results["long"]["methods"]) == ["leaky_rerope"]
    assert results["config"]["d_model"] == PRESETS["gpu"].d_model
    for row in results["methods"].values():
        assert all(math.isfinite(v) for v in row["loss"])


def test_greedy_chain_accuracy_is_the_long_run_hit_rate_of_the_likeliest_successor():
    task = RecallTask(SPEC)
    tokens, kinds = task.sample(64, 400, seed=9)
    best = task.transitions.argmax(axis=1)
    hits = total = 0
    for row, row_kinds in zip(tokens.tolist(), kinds.tolist()):
        state = None
        for token, kind in zip(row, row_kinds):
            if kind == MARKOV and state is not None:
                hits += int(best[state] == token)
                total += 1
            if kind != ANCHOR:
                state = token
    assert abs(hits / total - task.greedy_chain_accuracy()) < 0.03
    assert 0.0 < task.chain_only_recall_accuracy(tokens, kinds) < 1.0
