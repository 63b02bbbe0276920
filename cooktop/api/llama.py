"""``cooktop.Llama``: a loaded model and its context, with llama-cpp-python's names and semantics.

Code written for ``llama_cpp.Llama`` runs with only its import changed::

    from cooktop import Llama
    llm = Llama(model_path="stories260K.gguf", n_ctx=512)
    out = llm.create_completion("Once upon a time", max_tokens=32, temperature=0)
    print(out["choices"][0]["text"])

The class is assembled from one mixin per concern: completions
(:mod:`.completion`), chat (:mod:`.chat`), embeddings (:mod:`.embedding`).
Response dicts follow llama-cpp-python's ``llama_types`` (OpenAI's schemas).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import threading
from typing import Any

import numpy as np

from .. import cluster, notices
from ..engine import generate as _generate
from ..engine.speculative import LlamaMTPDecoding, MTPDraft, Speculation
from ..errors import CooktopError
from ..format.gguf import GGUFFile, read_raw_metadata
from ..format.kvtypes import KVConfig
from ..model.lora import parse_lora_request
from ..runtime.placement import TensorPlacement
from ..text.tokenizer import Tokenizer
from . import options
from .batch import BatchMixin
from .chat import ChatMixin
from .completion import CompletionMixin
from .embedding import EmbeddingMixin

log = logging.getLogger("cooktop")


def _check_handler(handler: Any) -> Any:
    """``handler`` when it is a multimodal projector (:class:`~cooktop.api.multimodal.MTMDChatHandler`) or None.

    Raises:
        UnsupportedArgumentError: any other chat handler (a llama-cpp-python callable).
    """
    if handler is None:
        return None
    from .multimodal import MTMDChatHandler

    if not isinstance(handler, MTMDChatHandler):
        raise options.UnsupportedArgumentError(
            f"Llama(chat_handler={type(handler).__name__}): only multimodal projectors are supported "
            "(cooktop.api.multimodal.MTMDChatHandler, Llava15ChatHandler, Gemma3ChatHandler); for text use "
            "chat_format= or the model's chat template")
    return handler


@dataclasses.dataclass
class LlamaState:
    """What :meth:`Llama.save_state` returns: the context's tokens and logits rows.

    ``load_state`` rebuilds the KV cache by evaluating ``input_ids`` again (same
    values as the saved cache, at the cost of one prompt evaluation).
    """

    input_ids: np.ndarray
    scores: np.ndarray
    n_tokens: int
    seed: int


class Llama(CompletionMixin, ChatMixin, EmbeddingMixin, BatchMixin):
    """A loaded model and its context, llama-cpp-python style.

    Every argument of ``llama_cpp.Llama`` is accepted (see :mod:`cooktop.api.options`).
    Honoured: ``n_ctx`` (0: the model's, capped at 4096), ``n_batch``,
    ``n_gpu_layers`` (0 none, -1 all; cooktop also takes ``"auto"``), ``tensor_split`` (as cooktop's ``split``),
    ``split_mode`` / ``main_gpu`` (``split_mode=0`` puts everything on device
    number ``main_gpu`` of ``device``), ``seed`` (-1 or 0xFFFFFFFF: random),
    ``logits_all``, ``embedding``, ``pooling_type``, ``n_threads`` /
    ``n_threads_batch`` (BLAS threads of the numpy backend, process-wide),
    ``last_n_tokens_size`` (penalty window), ``chat_format``, ``spm_infill``,
    ``type_k``/``type_v`` (GGML type ids of the KV cache: 0 f32, 1 f16 (default), 30 bf16, 8 q8_0,
    2 q4_0, 3 q4_1, 6 q5_0, 7 q5_1), ``flash_attn`` (False as llama-cpp-python: then a quantized
    ``type_v`` is refused, as llama.cpp does; True or ``"auto"``), ``swa_full`` (sliding-window layers
    keep the whole context's K/V: llama-cpp-python's default; False: only their window, ``model/swa.py``),
    ``vocab_only`` (tokenizer only),
    ``verbose``, ``lora_path`` / ``lora_scale`` (a GGUF LoRA adapter applied at that scale, not merged
    into the weights: ``model/lora.py``; ``lora_base`` is accepted and unused, as in llama-cpp-python).
    cooktop's own: ``lora_adapters`` (``[(path, scale), ...]``: several adapters, ids in that order after
    ``lora_path``'s; llama.cpp ``--lora`` / ``--lora-scaled``; their scales change with
    :meth:`set_lora_adapters`), ``device`` (``--device``), ``split``,
    ``chat_template`` / ``chat_template_file`` (llama-server's ``--chat-template``,
    ``--chat-template-file``: a format name or jinja text, a jinja file),
    ``ray_address`` (default ``COOKTOP_RAY``): run the model's segments on the nodes
    of that Ray cluster (``device`` then takes ``NODE/DEVICE`` selectors; see
    ``cooktop.cluster``; needs ``cooktop[ray]``), and llama.cpp's expert placement (no
    llama-cpp-python spelling exists): ``n_cpu_moe`` (``--n-cpu-moe``: experts of the first N
    blocks on the host), ``cpu_moe`` (``--cpu-moe``: all of them), ``override_tensor``
    (``-ot``: ``"REGEX=DEVICE"`` strings; see ``runtime/placement.py``), and ``n_seq_max`` (llama.cpp's
    context parameter: the sequences that will share the cache, the server's ``-np``; ``-ngl auto`` and
    the memory check count their K/V and recurrent states), ``context_shift`` / ``n_keep`` (llama.cpp's
    ``--context-shift`` / ``--keep``: a generation that fills the context keeps its first ``n_keep``
    tokens (-1: the prompt), drops the older half of the rest and goes on, instead of ending with
    finish reason ``length``; refused on a model with recurrent layers, whose state cannot drop tokens).

    ``chat_handler`` (llama-cpp-python's): a :class:`~cooktop.api.multimodal.MTMDChatHandler` (or
    ``Llava15ChatHandler`` / ``Gemma3ChatHandler``) holding an mmproj: chat messages may then carry
    ``image_url`` parts (:meth:`create_chat_completion`); its embedding width must be the model's.

    Raises:
        GGUFError, UnsupportedModelError (also: a chat handler's mmproj for another model), DeviceError,
        ChatTemplateError (an unknown ``chat_format``), UnsupportedArgumentError (also: a chat handler
        that is not a multimodal projector) (all ``CooktopError``).
    """

    def __init__(self, model_path: str, *, n_gpu_layers: int | str = 0, split_mode: int = options.SPLIT_MODE_LAYER,
                 main_gpu: int = 0, tensor_split: list[float] | None = None, vocab_only: bool = False,
                 seed: int = -1, n_ctx: int = 512, n_batch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, pooling_type: int = -1, logits_all: bool = False,
                 embedding: bool = False, last_n_tokens_size: int = 64, chat_format: str | None = None,
                 type_k: int | None = None, type_v: int | None = None, flash_attn: bool | str = False,
                 swa_full: bool | None = None, spm_infill: bool = False,
                 verbose: bool = True, device: str | None = None, split: str | list[float] | None = None,
                 chat_template: str | None = None, chat_template_file: str | None = None,
                 ray_address: str | None = None, n_cpu_moe: int = 0, cpu_moe: bool = False,
                 override_tensor: str | list[str] | None = None, draft_model: Any = None, n_seq_max: int = 1,
                 context_shift: bool = False, n_keep: int = 0, lora_path: str | None = None,
                 lora_scale: float = 1.0, lora_adapters: list[tuple[str, float]] | None = None,
                 chat_handler: Any = None, **kwargs: Any):
        self._engine_or_none: _generate.Engine | None = None
        self._last = None
        notices.set_verbose(verbose)  # process-wide, like llama-cpp-python's log callback: False prints nothing
        self.model_path = os.fspath(model_path)
        self.verbose = verbose
        options.check_extra(kwargs)
        self.chat_handler = _check_handler(chat_handler)
        kv = options.kv_config(type_k, type_v, flash_attn, swa_full)
        options.pooling_name(pooling_type)
        options.set_threads(n_threads_batch or n_threads)
        self._n_batch_arg = n_batch
        if isinstance(n_keep, bool) or not isinstance(n_keep, int) or n_keep < -1:
            raise CooktopError(f"n_keep must be an integer >= -1 (-1: the whole prompt), got {n_keep!r}")
        #: the generations' ``n_keep`` (``Engine.generate``): None without context shift
        self._n_keep: int | None = n_keep if context_shift else None
        self.draft_model = draft_model
        self.seed = -1 if seed in (None, -1, 0xFFFFFFFF) else int(seed)
        self.context_params = dict(n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                   n_threads_batch=n_threads_batch, pooling_type=pooling_type,
                                   embeddings=embedding, logits_all=logits_all)
        self.embedding_enabled = bool(embedding)
        self.pooling_type = int(pooling_type)
        self.last_n_tokens_size = int(last_n_tokens_size)
        self.spm_infill = bool(spm_infill)
        self.chat_format = chat_format
        self.chat_template_override = chat_template
        self.chat_template_file = chat_template_file
        self._logits_all = logits_all
        self._vocab_only = bool(vocab_only)
        if tensor_split is not None and split is None:
            split = [float(x) for x in tensor_split]
        if vocab_only:
            self._gf: GGUFFile | _VocabFile = _VocabFile(self.model_path)  # only .metadata is used
            self._tokenizer = Tokenizer.from_gguf(self._gf.raw)
            self._n_ctx = n_ctx
        else:
            if split_mode == options.SPLIT_MODE_NONE:
                device = _one_device(device, main_gpu)
            elif split_mode == options.SPLIT_MODE_ROW:
                log.warning("Llama(split_mode=2) (row split) accepted, runs as split_mode=1: cooktop splits by layer")
            load = _generate.load
            ray_address = cluster.address_from(ray_address)
            if ray_address is not None or cluster.is_cluster_selector(device):
                from ..cluster.load import load as cluster_load

                load = functools.partial(cluster_load, ray_address=ray_address)
            extra: dict[str, Any] = {"kv": kv}
            if load is not _generate.load:  # a cluster's segments keep the default cache type
                if (kv.type_k, kv.type_v) != (KVConfig().type_k, KVConfig().type_v):
                    raise CooktopError(f"type_k/type_v ({kv.label()}) are not supported on a Ray cluster yet")
                extra = {}
            tp = TensorPlacement.parse(n_cpu_moe, cpu_moe, override_tensor)
            if tp != TensorPlacement():
                extra["tensors"] = tp
            if isinstance(n_seq_max, bool) or not isinstance(n_seq_max, int) or n_seq_max < 1:
                raise CooktopError(f"Llama(n_seq_max={n_seq_max!r}): the sequences sharing the cache must be an "
                                   "integer >= 1")
            if n_seq_max != 1:
                extra["n_seq_max"] = n_seq_max
            loras = ([(os.fspath(lora_path), lora_scale)] if lora_path else []) + [
                (os.fspath(p), s) for p, s in lora_adapters or ()]
            if loras:
                if load is not _generate.load:
                    raise CooktopError("LoRA adapters are not supported on a Ray cluster yet")
                extra["lora"] = loras
            self._engine_or_none = load(self.model_path, n_ctx=n_ctx, n_batch=n_batch, device=device,
                                        n_gpu_layers=n_gpu_layers, split=split, logits_all=logits_all,
                                        keep_scores=True, **extra)
            self._gf, self._tokenizer = self._engine.gf, self._engine.tokenizer
            self._n_ctx = self._engine.n_ctx
            if context_shift and any(getattr(self._engine.cfg, "recurrent_layers", ())):
                self.close()
                raise CooktopError(f"{self.model_path}: context shift is not supported by this model: its recurrent "
                                   "layers' state cannot drop tokens (llama.cpp refuses it too); leave it off")
            if self.chat_handler is not None:
                try:
                    self.chat_handler.mmproj.check_model(self._engine.cfg.n_embd, self.model_path)
                except BaseException:
                    self.close()
                    raise
        self._chat = None  # resolved chat template (TemplateChoice), on first use
        if chat_format is not None or chat_template is not None or chat_template_file is not None:
            self.chat_template_choice()  # an unknown name fails now
        if verbose and self._engine_or_none is not None:
            print(f"cooktop: loaded {self.model_path} in {self._engine.load_ms:.1f} ms; "
                  f"{self._engine.placement.summary()}", file=sys.stderr)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None, additional_files: list[str] | None = None,
                        local_dir: str | os.PathLike | None = None, local_dir_use_symlinks: Any = "auto",
                        cache_dir: str | os.PathLike | None = None, **kwargs: Any) -> Llama:
        """Load a GGUF from a Hugging Face repo, like llama-cpp-python.

        Args:
            repo_id: ``owner/name``.
            filename: a file name or a glob (``"*Q4_K_M.gguf"``) matching exactly one
                GGUF of the repo (the first shard of a split model also matches);
                ``None``: the repo's default quant, as ``-hf`` picks it.
            additional_files: more files (names or globs) to download beside it.
            local_dir: download into this folder instead of the cache.
            local_dir_use_symlinks: accepted (huggingface_hub no longer uses it).
            cache_dir: the Hugging Face cache folder (default: ``HF_HUB_CACHE``).
            **kwargs: passed to :class:`Llama`.
        Raises:
            CooktopError: no file or several files match; the download failed (offline,
                not found); plus what ``Llama(...)`` raises.
        """
        from ..tools import hub
        path = hub.download(repo_id, filename, cache_dir=cache_dir, local_dir=local_dir)
        for extra in additional_files or []:
            hub.download(repo_id, extra, cache_dir=cache_dir, local_dir=local_dir)
        return cls(model_path=path, **kwargs)

    # -- guards ------------------------------------------------------------
    @property
    def _engine(self) -> _generate.Engine:
        """The engine; CooktopError once :meth:`close` was called, or with ``vocab_only``."""
        eng = self._engine_or_none
        if eng is None:
            if self._vocab_only and not self._closed:
                raise CooktopError(f"this Llama ({self.model_path}) was loaded with vocab_only=True: it can "
                                   "tokenize but not evaluate; load it without vocab_only to generate")
            raise CooktopError(f"this Llama ({self.model_path}) is closed: close() was called or its "
                               "with-block ended; create a new Llama to use the model again")
        return eng

    _closed = False
    _local = None

    @property
    def _active_seq(self):
        """The sequence completions of the calling thread run on (None: the engine's default
        one), or a chooser ``f(prompt_tokens) -> Sequence``; per thread, so the server's slot
        threads and :meth:`create_completions` each run their own."""
        local = self.__dict__.get("_local")
        return getattr(local, "seq", None) if local is not None else None

    @_active_seq.setter
    def _active_seq(self, seq) -> None:
        if self.__dict__.get("_local") is None:
            self.__dict__["_local"] = threading.local()
        self.__dict__["_local"].seq = seq

    @property
    def _last(self) -> _generate.GenerationResult | None:
        """The last finished completion's result (any thread's; :attr:`last_timings`)."""
        return self.__dict__.get("_last_any")

    @_last.setter
    def _last(self, result: _generate.GenerationResult | None) -> None:
        self.__dict__["_last_any"] = result
        if self.__dict__.get("_local") is None:
            self.__dict__["_local"] = threading.local()
        self.__dict__["_local"].last = result

    def _last_here(self) -> _generate.GenerationResult | None:
        """The last completion finished on the calling thread (the server's slot threads each read their own)."""
        local = self.__dict__.get("_local")
        return getattr(local, "last", None) if local is not None else None

    @property
    def draft_model(self) -> Any:
        """The ``draft_model`` (llama-cpp-python's; None: no speculative decoding). Setting it
        (a ``LlamaDraftModel``, any callable ``input_ids -> ids``, or a ``Speculation``) applies to
        the next generations.

        Raises:
            CooktopError: (setting) not a draft model.
        """
        return self.__dict__.get("_draft_model")

    @draft_model.setter
    def draft_model(self, value: Any) -> None:
        self._speculation_base = _speculation_of(value, self.__dict__.get("_n_batch_arg", 512))
        self.__dict__["_draft_model"] = value
        self.__dict__.pop("_spec_local", None)

    def _speculation(self) -> Speculation | None:
        """The calling thread's speculation (``draft_model``; None without one): the server's slot
        threads each get a fork, so a draft model's sequence is never shared."""
        base = self._speculation_base
        if base is None:
            return None
        if isinstance(base.drafter, LlamaMTPDecoding):  # its MTP block loads with the model
            base.drafter.bind(self._engine.model)
        local = self.__dict__.setdefault("_spec_local", threading.local())
        spec = getattr(local, "spec", None)
        if spec is None:
            spec = local.spec = base if threading.current_thread() is threading.main_thread() else base.fork()
        return spec

    @property
    def _tokenizer(self):
        """The vocabulary (CooktopError once closed)."""
        if self._closed:
            self._engine  # noqa: B018 - raises the closed error
        return self._tok

    @_tokenizer.setter
    def _tokenizer(self, value) -> None:
        self._tok = value

    # -- model facts -------------------------------------------------------
    @property
    def metadata(self) -> dict[str, str]:
        """GGUF metadata as strings (llama-cpp-python's ``Llama.metadata``); arrays are left out."""
        out = {}
        for k, v in self._gf.metadata.items():
            if isinstance(v, (list, tuple, np.ndarray)):
                continue
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    def n_ctx(self) -> int:
        """Context length (tokens)."""
        self._tokenizer  # noqa: B018 - raises when closed
        return self._n_ctx

    def n_embd(self) -> int:
        """Embedding width (``n_embd``)."""
        if not self._vocab_only:
            return self._engine.cfg.n_embd
        arch = self._gf.metadata.get("general.architecture", "llama")
        return int(self._gf.metadata.get(f"{arch}.embedding_length", 0))

    def n_vocab(self) -> int:
        """Vocabulary size (tokens)."""
        return self._tokenizer.n_vocab

    def token_bos(self) -> int:
        """Beginning-of-sequence token id (-1 if none)."""
        return self._tokenizer.bos_id

    def token_eos(self) -> int:
        """End-of-sequence token id (-1 if none)."""
        return self._tokenizer.eos_id

    def token_nl(self) -> int:
        """Id of the newline token (llama.cpp ``llama_token_nl``: the token of ``"\\n"``)."""
        ids = self._tokenizer.tokenize(b"\n", add_bos=False, special=False)
        return ids[-1] if ids else -1

    def _special_id(self, key: str) -> int:
        """The tokenizer's special id ``key`` (``fim_pre``...: from the file's ``fim_*_token_id`` keys,
        their older ``prefix`` / ``suffix`` / ``middle`` spellings, or the token's text, as llama.cpp
        src/llama-vocab.cpp finds them); -1 when the vocabulary has none."""
        v = self._tokenizer.special_ids.get(key, -1)
        return int(v) if 0 <= v < self.n_vocab() else -1

    def token_prefix(self) -> int:
        """Fill-in-the-middle prefix token id (-1 if none): llama.cpp's ``llama_vocab_fim_pre``."""
        return self._special_id("fim_pre")

    def token_suffix(self) -> int:
        """Fill-in-the-middle suffix token id (-1 if none): ``llama_vocab_fim_suf``."""
        return self._special_id("fim_suf")

    def token_middle(self) -> int:
        """Fill-in-the-middle middle token id (-1 if none): ``llama_vocab_fim_mid``."""
        return self._special_id("fim_mid")

    # -- tokens ------------------------------------------------------------
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 ``text`` (BOS prepended when ``add_bos`` and the vocabulary wants it;
        ``special``: parse special-token texts such as ``<s>``)."""
        return self._tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None, special: bool = False) -> bytes:
        """UTF-8 bytes of ``tokens`` (control tokens omitted unless ``special``)."""
        return self._tokenizer.detokenize([int(t) for t in tokens], special=special)

    # -- context -----------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        """Tokens in the context."""
        return 0 if self._vocab_only and not self._closed else len(self._engine.tokens)

    @property
    def input_ids(self) -> np.ndarray:
        """int [n_tokens] ids in the context."""
        return np.array(self._engine.tokens, dtype=np.intc)

    @property
    def scores(self) -> np.ndarray:
        """float32 [n_tokens, n_vocab]: row i holds the logits after context position i.

        Every row when ``logits_all``; otherwise only the rows of the last token
        of each evaluation (prompt chunks, generated tokens) are filled and the
        others are zero, as in llama-cpp-python.
        """
        return self._scores[: self.n_tokens]

    @property
    def _scores(self) -> np.ndarray:
        """The default sequence's whole logits buffer (rows past ``n_tokens`` are zero)."""
        scores = self._engine.seq.scores
        assert scores is not None  # Llama loads its engine with keep_scores=True
        return scores

    def reset(self) -> None:
        """Empty the context."""
        self._engine.reset()

    def eval(self, tokens: list[int]) -> None:
        """Append ``tokens`` to the context and evaluate them (fills :attr:`scores`).

        Raises:
            ContextOverflowError: more than ``n_ctx`` tokens in total.
            InvalidTokenError: an empty list or an id outside ``0 .. n_vocab - 1``.
        """
        self._engine.eval(list(tokens), logits_all=self._logits_all)

    def set_seed(self, seed: int) -> None:
        """The seed of the next completions (-1: random each time)."""
        self.seed = -1 if seed in (None, -1, 0xFFFFFFFF) else int(seed)

    def save_state(self) -> LlamaState:
        """A copy of the context (tokens, logits rows, seed)."""
        n = self.n_tokens
        return LlamaState(self.input_ids.copy(), self.scores.copy(), n, self.seed)

    def load_state(self, state: LlamaState) -> None:
        """Restore a context saved by :meth:`save_state` (its KV cache is evaluated again).

        Raises:
            CooktopError: ``state`` is not a :class:`LlamaState`, its scores do not match this model, or
                it holds image positions (negative placeholder ids: they cannot be evaluated again as tokens).
        """
        if not isinstance(state, LlamaState):
            raise CooktopError(f"load_state takes what save_state returned, not {type(state).__name__}")
        if state.n_tokens and bool((np.asarray(state.input_ids[: state.n_tokens]) < 0).any()):
            raise CooktopError("this state holds image positions (a chat with images): cooktop cannot restore "
                               "them by evaluating tokens again")
        eng = self._engine
        eng.reset()
        if state.n_tokens:
            if state.scores.shape[-1] != self.n_vocab():
                raise CooktopError("this state was saved from a model with another vocabulary")
            eng.eval([int(t) for t in state.input_ids[: state.n_tokens]], logits_all=self._logits_all)
            rows = np.asarray(state.scores[: state.n_tokens], dtype=np.float32)
            self._scores[: len(rows)] = rows
        self.seed = state.seed

    @property
    def last_timings(self) -> _generate.Timings:
        """Timings of the last finished completion (milliseconds).

        Raises:
            CooktopError: no completion has finished yet, or the Llama is closed.
        """
        self._engine  # noqa: B018 - raises when closed
        if self._last is None:
            raise CooktopError("no completion has finished yet: last_timings has nothing to report")
        return self._last.timings

    def get_lora_adapters(self) -> list[dict[str, Any]]:
        """The loaded LoRA adapters: ``[{"id", "path", "scale"}]`` (llama-server ``GET /lora-adapters``).

        Raises:
            CooktopError: the Llama is closed, or runs on a Ray cluster (no adapters there).
        """
        return self._lora_set().entries()

    def set_lora_adapters(self, adapters: list[dict[str, Any]]) -> None:
        """Set adapter scales from ``[{"id": int, "scale": float}]`` (llama-server ``POST /lora-adapters``:
        adapters left out get scale 0); the next forward pass uses them (``llama_set_adapters_lora``).

        Raises:
            CooktopError: an entry that is not such an object, an unknown id, a scale that is not a finite number.
        """
        lora = self._lora_set()
        lora.set_scales(lora.construct(parse_lora_request(adapters)))

    def _lora_set(self):
        lora = getattr(self._engine.model, "lora", None)
        if lora is None:
            raise CooktopError("LoRA adapters are not supported on a Ray cluster yet")
        return lora

    def close(self) -> None:
        """Release the device buffers (model and context) now. Idempotent; afterwards every
        other method raises ``CooktopError("... is closed ...")``. Dropping the last
        reference (``del llm``) frees them too, at once."""
        eng, self._engine_or_none = self._engine_or_none, None
        self._closed = True
        self._close_batch()
        seq = self.__dict__.pop("_embd_seq", None)
        if seq is not None:
            seq.close()
        dm = self.__dict__.get("_draft_model")
        if isinstance(dm, LlamaMTPDecoding):
            dm.close()
        if eng is not None:
            eng.close()

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def _one_device(device: str | None, main_gpu: int) -> str:
    """``split_mode=0``: the ``main_gpu``-th device of the ``device`` selection (llama.cpp semantics).

    Raises:
        DeviceError: ``main_gpu`` is out of range.
    """
    from ..backends import registry
    from ..errors import DeviceError
    sels = registry.resolve(device)
    if not 0 <= main_gpu < len(sels):
        raise DeviceError(f"main_gpu={main_gpu} but only {len(sels)} device(s) are selected: {', '.join(sels)}")
    return sels[main_gpu]


class _VocabFile:
    """The file of a ``Llama(vocab_only=True)``: its metadata from one fast pass over the header
    (:func:`~cooktop.format.gguf.read_raw_metadata`; no tensors, and not ``gguf.GGUFReader``,
    whose per-string objects take seconds on a 150k-token vocabulary).

    Raises:
        GGUFError: not a readable GGUF.
    """

    def __init__(self, path: str):
        self.path = path
        self.raw = read_raw_metadata(path)

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        """key -> value like ``GGUFFile.metadata``; strings decoded for display (invalid UTF-8 replaced)."""
        def value(v: Any) -> Any:
            if isinstance(v, bytes):
                return v.decode("utf-8", "replace")
            if isinstance(v, list):
                return [value(x) for x in v]
            return v.tolist() if isinstance(v, np.ndarray) else v
        return {key: value(v.value) for key, v in self.raw.items()}


def _speculation_of(draft_model: Any, n_batch: int) -> Speculation | None:
    """``Llama(draft_model=...)`` as a :class:`Speculation`: a llama-cpp-python draft model (any
    callable ``input_ids -> ids``, e.g. ``LlamaPromptLookupDecoding``) verifies all it proposes
    (up to ``n_batch - 1`` tokens); a ``Speculation`` (cooktop serve's ``-md``) keeps its limits.

    Raises:
        CooktopError: ``draft_model`` is neither.
    """
    if draft_model is None or isinstance(draft_model, Speculation):
        return draft_model
    if isinstance(draft_model, MTPDraft):  # LlamaMTPDecoding: its own draft length
        return Speculation(draft_model, n_max=draft_model.n_max)
    if not callable(draft_model):
        raise CooktopError(f"draft_model must be a LlamaDraftModel (e.g. LlamaPromptLookupDecoding(...)) or a "
                           f"callable input_ids -> draft ids, got {draft_model!r}")
    return Speculation(draft_model, n_max=max(1, int(n_batch) - 1))
