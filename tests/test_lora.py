"""LoRA adapters (``model/lora.py``, ``backends/lora.py``) against llama.cpp (llama-cpp-python's
``Llama(lora_path=..., lora_scale=...)``) on numpy, OpenCL and Vulkan.

One tiny F32 llama (2 blocks, untied output head) and one rank-4 adapter with alpha 8 of every
attention and feed-forward matrix, the output head and the token embedding (``tools/synth_lora.py``). The prompt's
logits at scales 0, 0.5 and 1 match llama.cpp's within nmse 1e-5; scale 0 is the base model's
exactly; the scale changes between passes on one loaded model (the graph key covers it).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import open_family_device, rewrite_gguf, skip_or_fail
from gguf import GGUFValueType

from cooktop import Llama
from cooktop.backends import registry
from cooktop.backends.base import nmse
from cooktop.cli.lora_options import parse_lora
from cooktop.errors import CooktopError, UnsupportedModelError
from cooktop.model.lora import LoraError
from cooktop.tools import synth, synth_lora

SHAPE = synth.Shape(64, 2, 4, 2, 96, 300, 256)
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 21)]
N_CTX, N_BATCH = 64, 7
SCALES = (0.0, 0.5, 1.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    model, adapter = d / "base.gguf", d / "adapter.gguf"
    synth.write(model, SHAPE, "F32", seed=3, scales={"attn_q": 0.2, "attn_k": 0.2})
    synth_lora.write_adapter(adapter, model, rank=4, alpha=8.0, seed=1, token_embd=True)
    return model, adapter


def _scores(llm) -> np.ndarray:
    llm.reset()
    llm.eval(PROMPT)
    return np.array(llm.scores[:len(PROMPT)], dtype=np.float64)


@pytest.fixture(scope="module")
def reference(files):
    """llama.cpp's prompt logits at each scale of :data:`SCALES` (one load each)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    model, adapter = files
    out = {}
    for s in SCALES:
        llm = llama_cpp.Llama(model_path=str(model), lora_path=str(adapter), lora_scale=s, logits_all=True,
                              n_ctx=N_CTX, n_batch=16, n_ubatch=16, verbose=False)
        try:
            out[s] = _scores(llm)
        finally:
            llm.close()
    return out


@pytest.fixture(scope="module", params=list(registry.FAMILIES))
def family(request):
    if request.param != "cpu":
        open_family_device(request.param)
    return request.param


def test_logits_match_llama_cpp_at_each_scale(family, files, reference):
    model, adapter = files
    base = Llama(model_path=str(model), n_ctx=N_CTX, n_batch=N_BATCH, logits_all=True, verbose=False,
                 device=family, n_gpu_layers=-1)
    try:
        base_logits = _scores(base)
    finally:
        base.close()
    llm = Llama(model_path=str(model), lora_path=str(adapter), lora_scale=1.0, n_ctx=N_CTX, n_batch=N_BATCH,
                logits_all=True, verbose=False, device=family, n_gpu_layers=-1)
    try:
        assert llm.get_lora_adapters() == [{"id": 0, "path": str(adapter), "scale": 1.0}]
        for s in (1.0, 0.5, 0.0, 1.0):  # the scale changes on one loaded model, back and forth
            llm.set_lora_adapters([{"id": 0, "scale": s}])
            got = _scores(llm)
            err = nmse(got, reference[s])
            print(f"LoRA scale {s} on {family}: nmse {err:.3g} vs llama.cpp")
            assert err <= 1e-5, f"scale {s} on {family}: nmse {err:.3g}"
            if s == 0.0:
                np.testing.assert_array_equal(got, base_logits)  # scale 0 adds nothing: the base model's logits
        assert nmse(reference[1.0], reference[0.0]) > 0.1  # the adapter matters
    finally:
        llm.close()


@pytest.fixture(scope="module")
def q8_case(files, tmp_path_factory):
    """A Q8_0 base of the same shape (the adapter fits it) and llama.cpp's logits of :data:`PROMPT`
    with the adapter at scale 1."""
    q8 = tmp_path_factory.mktemp("lora_q8") / "base-q8.gguf"
    synth.write(q8, SHAPE, "Q8_0", seed=3, scales={"attn_q": 0.2, "attn_k": 0.2})
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    llm = llama_cpp.Llama(model_path=str(q8), lora_path=str(files[1]), lora_scale=1.0, logits_all=True,
                          n_ctx=N_CTX, n_batch=16, n_ubatch=16, verbose=False)
    try:
        return q8, _scores(llm)
    finally:
        llm.close()


def test_quantized_base_token_by_token(family, files, q8_case):
    """A Q8_0 base decoding one token per pass (OpenCL's fused 8-bit Q/K/V and gate/up mat-vec,
    Vulkan's 8-bit paths): the adapter still applies, within the quantized bound (3e-3) of llama.cpp."""
    q8, ref = q8_case
    llm = Llama(model_path=str(q8), lora_path=str(files[1]), n_ctx=N_CTX, n_batch=N_BATCH, logits_all=True,
                verbose=False, device=family, n_gpu_layers=-1)
    try:
        for t in PROMPT:
            llm.eval([t])
        got = np.array(llm.scores[:len(PROMPT)], dtype=np.float64)
    finally:
        llm.close()
    err = nmse(got, ref)
    print(f"LoRA on a Q8_0 base, token by token on {family}: nmse {err:.3g} vs llama.cpp")
    assert err <= 3e-3


def test_fused_weights_get_their_rows_of_b(tmp_path):
    """phi3's fused ``attn_qkv`` and gate/up ``ffn_up`` are uploaded as row ranges (``TensorSpec.parts``):
    each part gets its rows of B; the logits match llama.cpp's (numpy)."""
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail("llama_cpp", f"llama-cpp-python is not installed ({e}); pip install llama-cpp-python")
    model, adapter = tmp_path / "phi3.gguf", tmp_path / "phi3-lora.gguf"
    synth.write(model, synth.Shape(64, 2, 4, 4, 96, 300, 1024, arch="phi3"), "F32", seed=3, scales={"attn_qkv": 0.2})
    names = synth_lora.write_adapter(adapter, model, seed=1)
    assert "blk.0.attn_qkv.weight" in names and "blk.0.ffn_up.weight" in names
    ref = llama_cpp.Llama(model_path=str(model), lora_path=str(adapter), logits_all=True, n_ctx=N_CTX, n_batch=16,
                          n_ubatch=16, verbose=False)
    try:
        want = _scores(ref)
    finally:
        ref.close()
    llm = Llama(model_path=str(model), lora_path=str(adapter), n_ctx=N_CTX, n_batch=N_BATCH, logits_all=True,
                verbose=False, device="cpu")
    try:
        err = nmse(_scores(llm), want)
    finally:
        llm.close()
    assert err <= 1e-5, f"phi3 with a LoRA of its fused weights: nmse {err:.3g}"


def test_moe_expert_tensors_are_refused_by_name(tmp_path):
    """A LoRA of expert tensors (llama.cpp ``build_lora_mm_id``) is refused naming the tensor; the
    router and attention of the same model take theirs."""
    model, ok, exps = tmp_path / "moe.gguf", tmp_path / "ok.gguf", tmp_path / "exps.gguf"
    synth.write(model, synth.Shape(64, 2, 4, 2, 96, 300, 256, arch="qwen3moe", n_expert=4, n_expert_used=2,
                                   n_ff_exp=32), "F32", seed=3)
    synth_lora.write_adapter(ok, model, targets=("blk.*.attn_q.weight", "blk.*.ffn_gate_inp.weight"))
    llm = _load(model, ok)
    assert llm.get_lora_adapters()[0]["scale"] == 1.0
    llm.close()
    rewrite_gguf(ok, exps, add={"blk.1.ffn_up_exps.weight.lora_a": (np.zeros((4, 64), np.float32), None),
                                "blk.1.ffn_up_exps.weight.lora_b": (np.zeros((32, 4), np.float32), None)})
    with pytest.raises(LoraError, match="'blk.1.ffn_up_exps.weight'.*mixture-of-experts expert tensors"):
        _load(model, exps)


def test_two_adapters_add_up(files, reference):
    """The same adapter loaded twice at 0.5 each is the adapter at 1 (the deltas sum per matmul),
    and ``set_lora_adapters`` leaves out-of-list adapters at 0 (llama-server ``construct_lora_list``)."""
    model, adapter = files
    llm = Llama(model_path=str(model), lora_adapters=[(str(adapter), 0.5), (str(adapter), 0.5)], n_ctx=N_CTX,
                n_batch=N_BATCH, logits_all=True, verbose=False, device="cpu")
    try:
        assert nmse(_scores(llm), reference[1.0]) <= 1e-5
        llm.set_lora_adapters([{"id": 1, "scale": 1.0}])
        assert [a["scale"] for a in llm.get_lora_adapters()] == [0.0, 1.0]
        assert nmse(_scores(llm), reference[1.0]) <= 1e-5
        with pytest.raises(CooktopError, match="id 2 is invalid"):
            llm.set_lora_adapters([{"id": 2, "scale": 1.0}])
        with pytest.raises(CooktopError, match="finite"):
            llm.set_lora_adapters([{"id": 0, "scale": float("nan")}])
        with pytest.raises(CooktopError, match="list"):
            llm.set_lora_adapters({"id": 0})  # type: ignore[arg-type]
    finally:
        llm.close()


def test_a_new_scale_does_not_reuse_the_cached_prompt(files):
    """The cached prompt's K/V were computed at the old scale: the next completion reads it again
    (as llama-server clears a slot whose LoRA changed), so it is the one a fresh model gives."""
    model, adapter = files
    kw = dict(n_ctx=N_CTX, verbose=False, device="cpu")
    fresh = Llama(model_path=str(model), lora_path=str(adapter), lora_scale=0.0, **kw)
    want = fresh.create_completion(PROMPT, max_tokens=6, temperature=0)["choices"][0]["text"]
    fresh.close()
    llm = Llama(model_path=str(model), lora_path=str(adapter), **kw)
    try:
        first = llm.create_completion(PROMPT, max_tokens=6, temperature=0)
        llm.set_lora_adapters([])
        again = llm.create_completion(PROMPT, max_tokens=6, temperature=0)
        assert again["choices"][0]["text"] == want != first["choices"][0]["text"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        third = llm.create_completion(PROMPT, max_tokens=6, temperature=0)  # same scales: the prefix is reused
        assert third["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        llm.close()


def _load(model, adapter):
    return Llama(model_path=str(model), lora_path=str(adapter), n_ctx=N_CTX, verbose=False, device="cpu")


def test_bad_adapters_are_refused_by_name(files, tmp_path):
    model, adapter = files
    with pytest.raises(UnsupportedModelError, match="is an adapter .* pass this file as the LoRA adapter"):
        Llama(model_path=str(adapter), verbose=False, device="cpu")
    with pytest.raises(LoraError, match="not a LoRA adapter.*general.type 'adapter'"):
        _load(model, model)
    other = synth_lora.write_adapter(tmp_path / "qwen.gguf", model, arch="qwen2") and tmp_path / "qwen.gguf"
    with pytest.raises(LoraError, match="arch mismatch.*'qwen2'"):
        _load(model, other)
    wrong = tmp_path / "shape.gguf"
    rewrite_gguf(adapter, wrong, replace={"blk.0.attn_q.weight.lora_a": (np.zeros((4, 32), np.float32), None)})
    with pytest.raises(LoraError, match="'blk.0.attn_q.weight' has incorrect shape"):
        _load(model, wrong)
    ranks = tmp_path / "ranks.gguf"
    rewrite_gguf(adapter, ranks, replace={"blk.0.attn_q.weight.lora_a": (np.zeros((3, 64), np.float32), None)})
    with pytest.raises(LoraError, match="different ranks"):
        _load(model, ranks)
    missing = tmp_path / "missing.gguf"
    rewrite_gguf(adapter, missing, add={"blk.7.attn_q.weight.lora_a": (np.zeros((4, 64), np.float32), None),
                                        "blk.7.attn_q.weight.lora_b": (np.zeros((64, 4), np.float32), None)})
    with pytest.raises(LoraError, match="'blk.7.attn_q.weight' does not exist in base model"):
        _load(model, missing)
    embd = tmp_path / "embd.gguf"  # the token embedding's pair is flipped (A [n_vocab, rank]): not this way
    rewrite_gguf(adapter, embd, replace={"token_embd.weight.lora_a": (np.zeros((4, 300), np.float32), None)})
    with pytest.raises(LoraError, match="'token_embd.weight' has incorrect shape.*want \\[300, rank\\]"):
        _load(model, embd)
    tied, tied_lora = tmp_path / "tied.gguf", tmp_path / "tied-lora.gguf"
    synth.write(tied, synth.Shape(64, 1, 4, 2, 96, 300, 256, tied=True), "F32", seed=3)
    synth_lora.write_adapter(tied_lora, tied, token_embd=True)
    with pytest.raises(LoraError, match="output head is the token embedding \\(tied\\)"):
        _load(tied, tied_lora)
    half = tmp_path / "half.gguf"
    rewrite_gguf(adapter, half, add={"blk.0.ffn_norm.weight": (np.ones(64, np.float32), None),
                                     "blk.1.attn_norm.weight.lora_a": (np.zeros((4, 64), np.float32), None)})
    with pytest.raises(LoraError, match="'blk.1.attn_norm.weight' is missing one component"):
        _load(model, half)
    alora = tmp_path / "alora.gguf"
    rewrite_gguf(adapter, alora, extra_kv=[("adapter.alora.invocation_tokens", [1, 2], GGUFValueType.ARRAY)])
    with pytest.raises(LoraError, match="aLoRA"):
        _load(model, alora)
    with pytest.raises(CooktopError, match="finite number"):
        Llama(model_path=str(model), lora_path=str(adapter), lora_scale=float("inf"), verbose=False, device="cpu")


def test_parse_lora_flags():
    assert parse_lora(("a.gguf,b.gguf", "c.gguf"), ("d.gguf:0.5,e.gguf:-1",), False) == [
        ("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 1.0), ("d.gguf", 0.5), ("e.gguf", -1.0)]
    assert parse_lora(("a.gguf",), ("d.gguf:0.5",), True) == [("a.gguf", 0.0), ("d.gguf", 0.0)]
    with pytest.raises(CooktopError, match="FNAME:SCALE"):
        parse_lora((), ("d.gguf",), False)
    with pytest.raises(CooktopError, match="not a number"):
        parse_lora((), ("d.gguf:x",), False)


def test_chat_serve_and_perplexity_take_the_lora_flags():
    import cooktop.cli.chat  # noqa: F401  (register the commands)
    import cooktop.cli.perplexity  # noqa: F401
    import cooktop.cli.run  # noqa: F401
    import cooktop.cli.serve  # noqa: F401
    from cooktop.cli.group import cli
    for name in ("run", "chat", "serve", "perplexity"):
        opts = {o for p in cli.commands[name].params for o in p.opts}
        assert {"--lora", "--lora-scaled", "--lora-init-without-apply"} <= opts, name


def test_cli_run_takes_lora_flags(files):
    """``cooktop run`` with --lora, both --lora-scaled spellings and --lora-init-without-apply (in process)."""
    from click.testing import CliRunner

    import cooktop.cli.run  # noqa: F401  (registers the command)
    from cooktop.cli.group import cli
    model, adapter = files

    def run(*flags: str) -> str:
        res = CliRunner().invoke(cli, ["run", "-m", str(model), "-p", "hello", "-n", "6", "--temp", "0", "-c", "64",
                                       "--device", "cpu", *flags], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.stdout

    base, full = run(), run("--lora", str(adapter))
    assert full != base
    assert run("--lora-scaled", f"{adapter}:1") == full
    assert run("--lora-scaled", str(adapter), "1.0") == full  # llama.cpp's older two-value spelling
    assert run("--lora", str(adapter), "--lora-init-without-apply") == base
    res = CliRunner().invoke(cli, ["run", "-m", str(model), "-p", "hi", "--lora", str(model), "--device", "cpu"])
    assert res.exit_code != 0 and "not a LoRA adapter" in (res.output + str(res.exception))
