"""The speculative-decoding settings of a command line (llama.cpp's ``-md``, ``--spec-type``,
``--draft-max``...; see cooktop/cli/spec_options.py), turned into a
:class:`~cooktop.engine.speculative.Speculation` by :meth:`SpecOptions.build` (which loads the
draft model beside the target). Used by ``cooktop run`` and ``cooktop serve``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import CooktopError
from ..runtime.placement import parse_ngl
from .generate import load as _load
from .speculative import DraftModel, FirstOf, MTPDraft, NgramSimple, Speculation

#: ``--spec-type`` names (llama.cpp common/speculative.cpp) cooktop implements.
SPEC_TYPES = ("none", "draft-simple", "draft-mtp", "ngram-simple")

#: The order drafters are tried in when several are enabled: llama.cpp's priority
#: (common/speculative.cpp common_speculative_init: the n-gram types before the draft models).
PRIORITY = ("ngram-simple", "draft-simple", "draft-mtp")


class DraftLoadError(CooktopError):
    """The draft model (``-md``) failed to load (the message names it, not the target)."""


@dataclasses.dataclass(frozen=True)
class SpecOptions:
    """The speculative options of one command line (llama.cpp names; see the module doc)."""

    model_draft: str | None = None
    draft_max: int = 3
    draft_min: int = 0
    draft_p_min: float = 0.0
    gpu_layers_draft: str | None = None
    device_draft: str | None = None
    spec_type: tuple[str, ...] = ()
    ngram_size_n: int = 12
    ngram_size_m: int = 48

    def types(self) -> list[str]:
        """The drafting types, in llama.cpp's order of priority (:data:`PRIORITY`).

        An explicit ``--spec-type`` list is taken as it is (llama.cpp: ``-md`` with ``--spec-type
        ngram-simple`` runs only ngram-simple; :meth:`notice` says the draft model is unused);
        ``-md`` without ``--spec-type`` means ``draft-simple``.

        Raises:
            CooktopError: an unknown or unimplemented type, or ``draft-simple`` without ``-md``.
        """
        names = []
        for v in self.spec_type:
            items = [t.strip() for t in v.split(",")]
            if "" in items:
                raise CooktopError(f"--spec-type {v!r}: unknown speculative type '' (a comma list of: "
                                   f"{', '.join(SPEC_TYPES)})")
            bad = [t for t in items if t not in SPEC_TYPES]
            if bad:
                raise CooktopError(f"--spec-type {bad[0]} is not supported by cooktop "
                                   f"(it has: {', '.join(SPEC_TYPES)})")
            # llama.cpp common_speculative_types_from_names: a list naming none is none
            names += [] if "none" in items else items
        if not self.spec_type and self.model_draft:
            names = ["draft-simple"]
        if "draft-simple" in names and not self.model_draft:
            raise CooktopError("--spec-type draft-simple needs a draft model: give -md / --model-draft FNAME")
        return [t for t in PRIORITY if t in names]

    def check(self) -> list[str]:
        """:meth:`types`, with the sizes checked: what can be refused before any model loads.

        Raises:
            CooktopError: what :meth:`types` raises; ``--draft-max`` < 1, ``--draft-min`` < 0 or
                (with a draft model) past ``--draft-max`` (no draft could ever be that long:
                llama.cpp drops drafts shorter than n_min and stops at n_max, so it would never
                draft), ``--draft-p-min`` outside [0, 1].
        """
        types = self.types()
        if not types:
            return types
        if self.draft_max < 1 or self.draft_min < 0 or not 0.0 <= self.draft_p_min <= 1.0:
            raise CooktopError(f"--draft-max must be >= 1, --draft-min >= 0 and --draft-p-min in [0, 1]; got "
                               f"{self.draft_max}, {self.draft_min}, {self.draft_p_min}")
        if ("draft-simple" in types or "draft-mtp" in types) and self.draft_min > self.draft_max:
            raise CooktopError(f"--draft-min {self.draft_min} is past --draft-max {self.draft_max}: the draft model "
                               "would never draft (drafts shorter than --draft-min are dropped)")
        return types

    def notice(self) -> str:
        """One line where ``-md`` and another ``--spec-type`` are both given (empty otherwise): which
        drafters run, in which order, or that the draft model is not used."""
        types = self.types()
        if not self.model_draft or types == ["draft-simple"]:
            return ""
        if "draft-simple" not in types:
            return (f"the draft model -md {self.model_draft} is not used: --spec-type {','.join(types) or 'none'} "
                    "does not include draft-simple (as llama.cpp)")
        names = [f"draft-simple (-md {self.model_draft})" if t == "draft-simple" else t for t in types]
        return f"speculative decoding tries {', then '.join(names)}: the first non-empty draft is verified"

    def build(self, target: Any, device: str | None, n_gpu_layers: Any) -> tuple[Speculation | None, Any]:
        """(the speculation to pass to ``generate(draft=...)`` or None, what to close after it or None:
        the draft engine, or the MTP block).

        The draft model is loaded with the target's ``n_ctx`` and ``n_batch``, on ``-devd`` (default
        the target's ``device``) with ``-ngld`` layers (default the target's ``n_gpu_layers``).
        ``draft-mtp`` loads the target file's multi-token-prediction block on the device of the target's
        head (:class:`~cooktop.model.mtp.MTPModel`).

        Raises:
            CooktopError: bad options, a draft model of another vocabulary; what loading raises.
            NoMTPError: ``draft-mtp`` on a file or architecture without an MTP block.
        """
        types = self.check()
        if not types:
            return None, None
        draft_engine: Any = None
        mtp: Any = None
        drafters: list[Any] = []
        n_max = self.draft_max
        try:
            for t in types:
                if t == "draft-mtp":
                    from ..model.mtp import MTPModel  # noqa: PLC0415 (loaded only when asked for)
                    mtp = MTPModel(target.model)
                    drafters.append(MTPDraft(mtp, target.model, self.draft_max, self.draft_p_min))
                elif t == "draft-simple":
                    ngl = parse_ngl(self.gpu_layers_draft) if self.gpu_layers_draft is not None else n_gpu_layers
                    try:
                        draft_engine = _load(str(self.model_draft), n_ctx=target.n_ctx, n_batch=target.n_batch,
                                             device=self.device_draft or device, n_gpu_layers=ngl)
                    except CooktopError as e:
                        raise DraftLoadError(f"cannot load the draft model (-md) {self.model_draft}: {e}") from None
                    drafters.append(DraftModel(draft_engine, self.draft_max, self.draft_p_min, vocab_of=target))
                else:
                    drafters.append(NgramSimple(self.ngram_size_n, self.ngram_size_m))
                    n_max = max(n_max, self.ngram_size_m)  # llama.cpp: ngram-simple drafts up to size_m
            drafter = drafters[0] if len(drafters) == 1 else FirstOf(drafters)
            closer = draft_engine if mtp is None else mtp if draft_engine is None else _Both(draft_engine, mtp)
            return Speculation(drafter, n_max=n_max, n_min=self.draft_min), closer
        except BaseException:
            for x in (draft_engine, mtp):
                if x is not None:
                    x.close()
            raise


class _Both:
    """A draft engine and an MTP block closed together (``--spec-type draft-simple,draft-mtp``)."""

    def __init__(self, *parts: Any):
        self.parts = parts

    def close(self) -> None:
        """Close each part."""
        for p in self.parts:
            p.close()
