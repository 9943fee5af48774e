"""Experiment settings and the three presets: ``tiny`` (seconds), ``cpu`` (minutes), ``gpu``.

Every number that shapes a result lives in :class:`ExperimentConfig` and is written into the
results file, so a results file says how it was made.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .._checks import integer, number, optional_integer
from .data import TaskSpec
from .model import ModelSpec

MAX_SEED = 2**64 - 1
"""The largest run seed: :func:`torch.manual_seed` takes the seeds of a uint64 (and negative ones, which
it maps to these; a run seed is >= 0)."""

MAX_THREADS = 2**31 - 1
"""The largest thread count: :func:`torch.set_num_threads` takes a C int."""


@dataclass(frozen=True)
class ExperimentConfig:
    """One run: the task, the model sizes, training, fine-tuning and evaluation.

    Args:
        name: the run's name (the preset's).
        task: the synthetic language.
        d_model: the model's width (:class:`rope.experiment.model.ModelSpec`).
        num_heads: the attention heads per layer.
        num_layers: the number of blocks.
        mlp_ratio: the MLP's hidden width over d_model.
        rope_theta: the base b of the RoPE frequencies, > 1.
        training_length: L, the training context, >= 4 (ReRoPE's window is half of it).
        steps: the training steps of each base model.
        batch_size: the sequences per training batch.
        learning_rate: the peak learning rate of training.
        warmup_steps: the warmup steps of training.
        weight_decay: AdamW's weight decay.
        finetune_factor: the fine-tuning length over L, and the fine-tuned methods' factor.
        finetune_steps: the fine-tuning steps.
        finetune_learning_rate: the peak learning rate of fine-tuning.
        eval_multiples: the evaluation lengths, in multiples of L, none twice.
        long_eval_multiples: the further lengths of the linear-memory methods, in multiples of L.
        eval_tokens: about how many tokens are evaluated at each length.
        eval_batch_tokens: about how many tokens go through one evaluation pass.
        seed: the run seed (initialization and training batches), in [0, 2^64 - 1].
        threads: torch's thread count during the run, in [1, 2^31 - 1], or ``None`` to leave it.
    """

    name: str
    task: TaskSpec = field(default_factory=TaskSpec)
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    mlp_ratio: int = 4
    rope_theta: float = 10000.0
    training_length: int = 64
    steps: int = 1500
    batch_size: int = 32
    learning_rate: float = 1e-2
    warmup_steps: int = 100
    weight_decay: float = 0.01
    finetune_factor: int = 4
    finetune_steps: int = 100
    finetune_learning_rate: float = 1e-3
    eval_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    long_eval_multiples: tuple[int, ...] = (32, 64, 128, 256)  # linear-memory methods only
    eval_tokens: int = 8192
    eval_batch_tokens: int = 4096
    seed: int = 0
    threads: int | None = None

    def __post_init__(self):
        """Checks every field and stores NumPy numbers as ints and floats (the config is written to JSON)."""
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__} {self.name!r}")
        if not isinstance(self.task, TaskSpec):
            raise TypeError(f"task must be a TaskSpec, got {type(self.task).__name__}")
        for key, minimum in (("d_model", 1), ("num_heads", 1), ("num_layers", 1), ("mlp_ratio", 1),
                             ("training_length", 4),  # ReRoPE's window is half of it
                             ("steps", 1), ("batch_size", 1), ("warmup_steps", 0), ("finetune_factor", 1),
                             ("finetune_steps", 1), ("eval_tokens", 1), ("eval_batch_tokens", 1)):
            self._store(key, integer(key, getattr(self, key), minimum=minimum))
        # the initialization's torch.manual_seed(seed) takes [0, 2^64 - 1]: refused here, not when training starts
        self._store("seed", integer("seed", self.seed, minimum=0, maximum=MAX_SEED))
        # torch.set_num_threads takes a C int: a larger count surfaced as "Overflow when unpacking long"
        self._store("threads", optional_integer("threads", self.threads, minimum=1, maximum=MAX_THREADS))
        for key, bounds in (("learning_rate", {"positive": True}), ("finetune_learning_rate", {"positive": True}),
                            ("weight_decay", {"minimum": 0.0})):
            self._store(key, number(key, getattr(self, key), **bounds))
        self._store("rope_theta", number("rope_theta", self.rope_theta))
        if not self.rope_theta > 1:
            raise ValueError(f"rope_theta must be > 1, got {self.rope_theta}")
        for key in ("eval_multiples", "long_eval_multiples"):
            multiples = getattr(self, key)
            if not isinstance(multiples, tuple):
                raise TypeError(f"{key} must be a tuple of positive ints, got {multiples!r}")
            self._store(key, tuple(integer(f"{key}[{i}]", m, minimum=1) for i, m in enumerate(multiples)))
            if len(set(multiples)) != len(multiples):  # one evaluation per length: a repeat has no column of its own
                raise ValueError(f"{key} must not repeat a multiple, got {multiples}")
        if not self.eval_multiples:
            raise ValueError("eval_multiples must hold at least one multiple of training_length")
        self.model_spec  # noqa: B018  (refuses sizes no model has, e.g. an odd head dimension, here)

    @property
    def model_spec(self) -> ModelSpec:
        """The sizes of the run's model (:class:`rope.experiment.model.ModelSpec`, which checks them)."""
        return ModelSpec(self.task.vocab_size, self.d_model, self.num_heads, self.num_layers, self.mlp_ratio)

    def _store(self, key: str, value) -> None:
        object.__setattr__(self, key, value)  # frozen: the checked value replaces the given one

    @property
    def eval_lengths(self) -> list[int]:
        """The lengths every method is evaluated at."""
        return [m * self.training_length for m in self.eval_multiples]

    @property
    def long_eval_lengths(self) -> list[int]:
        """The further lengths at which only the methods that attend in O(seq) memory are evaluated
        (``Method.linear_memory``: ReRoPE and Leaky ReRoPE, with RoPE inside attention)."""
        return [m * self.training_length for m in self.long_eval_multiples]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["eval_multiples"] = list(self.eval_multiples)
        out["long_eval_multiples"] = list(self.long_eval_multiples)
        return out


PRESETS: dict[str, ExperimentConfig] = {
    # Seconds on one thread: the chapter runs it live and the tests run it.
    "tiny": ExperimentConfig(
        name="tiny",
        task=TaskSpec(markov_vocab=16, successors=3, anchors=16, span=3),
        d_model=32, num_heads=2, num_layers=2, training_length=16,
        steps=40, batch_size=16, warmup_steps=5, finetune_steps=8,
        eval_tokens=512, eval_batch_tokens=1024, long_eval_multiples=(64,), threads=1,
    ),
    # A few minutes on one CPU thread (more threads were slower on a shared 2-core machine):
    # the committed results file.
    "cpu": ExperimentConfig(name="cpu", threads=1),
    # A larger run for a GPU (Colab): longer training context, wider model, more evaluation tokens.
    "gpu": ExperimentConfig(
        name="gpu",
        task=TaskSpec(markov_vocab=128, successors=4, anchors=256, span=6),
        d_model=256, num_heads=8, num_layers=4, training_length=256,
        steps=4000, batch_size=64, learning_rate=1e-3, warmup_steps=200,
        finetune_steps=400, finetune_learning_rate=3e-4,
        eval_tokens=131072, eval_batch_tokens=8192, long_eval_multiples=(32, 64, 128, 256),
    ),
}
