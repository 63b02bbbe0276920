"""The report's fixed suite: what is measured, at which settings, under one version number.

Two reports can be compared figure by figure only when they ran the same suite: any change to a
setting below (tests, repetitions, shapes, the KLD text) must bump :data:`SUITE_VERSION`.

The default models are synthetic (``cooktop.tools.synth``, seeded, so every machine measures the
same files): ``--quick`` a tiny llama (``QUICK_SHAPE``), ``--full`` tinyllama-1.1b's widths
(n_embd 2048, n_ff 5632, n_vocab 32000) with :data:`FULL_LAYERS` of its 22 blocks, so that the
numpy reference finishes pp512 on a two-core machine inside the suite's time.
"""

from __future__ import annotations

import dataclasses

from ..tools.synth import SHAPES, Shape

#: Version of the suite definition (settings below). Reports of different versions are not compared.
SUITE_VERSION = 1

#: Blocks of the full suite's 1.1B-wide synthetic model.
FULL_LAYERS = 2

#: The quick suite's model shape: a small llama (n_embd 256, 2 blocks, 4096-token vocabulary).
QUICK_SHAPE = Shape(256, 2, 4, 2, 768, 4096, 512)

#: The fixed text of the KLD step (English prose; tokenized by each model's own vocabulary).
KLD_TEXT = (
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch. "
    "In the evening the wind rose and the rain began to fall on the fields, the barn and the road. "
    "Children ran home from school, their boots splashing in the puddles, and the lamps were lit one by one. "
    "A kettle sang on the stove; somebody laughed in the next room; the old clock struck seven. "
    "Numbers such as 3.14159, 2048 and 1.1 billion appear in reports, tables and plots of every kind. "
) * 8


@dataclasses.dataclass(frozen=True)
class Suite:
    """One suite level (``quick`` or ``full``): its settings, all versioned by :data:`SUITE_VERSION`.

    Attributes:
        level: ``quick`` / ``full``; shape: the synthetic models' shape (``synth.Shape``);
        weight_types: synth ``--type`` of each default model; n_prompt / n_gen / n_depth: the bench
        tests (``ppP``, ``tgN``, and ``tgN @ dD``); reps: timed runs per test; n_batch: prompt chunk;
        ops_shape / ops_quick / ops_types: ``bench --ops`` plan (``--shape``, ``--quick``, ``--types``);
        kld_ctx / kld_chunks: tokens per chunk and chunks of the KLD step; seed: synth and token seed.
    """

    level: str
    shape: Shape
    weight_types: tuple[str, ...]
    n_prompt: int
    n_gen: int
    n_depth: int
    reps: int
    n_batch: int
    ops_shape: str
    ops_quick: bool
    ops_types: tuple[str, ...]
    kld_ctx: int
    kld_chunks: int
    seed: int = 1234

    @property
    def version(self) -> int:
        """:data:`SUITE_VERSION`."""
        return SUITE_VERSION

    def to_dict(self) -> dict:
        """JSON-ready settings (the report's ``suite``), the shape as its fields."""
        d = dataclasses.asdict(self)
        defaults = {f.name: f.default for f in dataclasses.fields(Shape)}
        d["shape"] = {k: v for k, v in dataclasses.asdict(self.shape).items() if k not in defaults
                      or defaults[k] is dataclasses.MISSING or v != defaults[k]}
        d["weight_types"] = list(self.weight_types)
        d["ops_types"] = list(self.ops_types)
        d["version"] = SUITE_VERSION
        return d


def _full_shape() -> Shape:
    return dataclasses.replace(SHAPES["tinyllama-1.1b"], n_layer=FULL_LAYERS)


SUITES = {
    "quick": Suite("quick", QUICK_SHAPE, ("Q4_0", "Q8_0"), n_prompt=64, n_gen=16, n_depth=64, reps=2, n_batch=64,
                   ops_shape="stories15m", ops_quick=True, ops_types=("Q4_0", "Q8_0"), kld_ctx=64, kld_chunks=2),
    "full": Suite("full", _full_shape(), ("Q4_0", "Q4_K_M", "Q8_0"), n_prompt=512, n_gen=128, n_depth=512, reps=2,
                  n_batch=512, ops_shape="tinyllama-1.1b", ops_quick=False, ops_types=("Q4_0", "Q4_K", "Q8_0"),
                  kld_ctx=128, kld_chunks=4),
}
