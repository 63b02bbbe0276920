"""``--spec-type draft-mtp``: the multi-token-prediction block of a qwen35 file drafts for the trunk.

One tiny synthesized qwen35 (``tools/synth.py``, ``n_nextn = 1``: blocks 0-2 linear attention, 3 full
attention, block 4 the MTP block; F32). llama-cpp-python 0.3.36's library exports no
``llama_set_embeddings_nextn`` / ``llama_get_embeddings_nextn`` (nor an MTP context type), so the block's
logits are checked against an independent numpy reference written here from the file's weights (nmse <=
1e-5, F32); the target's hidden rows kept for it against the embeddings path. Then: output with
``draft-mtp`` equals the output without it (greedy, seeded sampling) on numpy and OpenCL, through a
batch driver and ``cooktop serve -np 2`` (the slots), through ``Llama(draft_model=LlamaMTPDecoding(...))``,
on qwen35moe; a predictive variant whose MTP block is exact has every greedy draft accepted (which a
pairing off by one position would not); the counts ``cooktop run`` prints; what ``info`` / ``plan``
count; the errors for a file without an MTP block and an architecture without one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from batchutil import run_in_driver
from conftest import SHARED, rewrite_gguf, skip_or_fail

from cooktop.backends.base import nmse
from cooktop.engine import generate as G
from cooktop.engine.sampling import SamplingParams
from cooktop.engine.spec_config import SpecOptions
from cooktop.errors import CooktopError
from cooktop.format.gguf import open_gguf
from cooktop.tools import synth

SHAPE = dataclasses.replace(synth.SHAPES["qwen3.5-0.8b"], n_embd=64, n_layer=4, n_head=4, n_head_kv=2,
                            head_dim=16, n_ff=96, n_vocab=300, n_ctx_train=256, ssm_d_state=8, ssm_n_group=2,
                            ssm_dt_rank=4, n_rot=8, rope_sections=(2, 1, 1, 0), tied=False, n_nextn=1)
SCALES = {"attn_q": 0.2, "attn_k": 0.2}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(3, 300, 24)]
GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=0.9, seed=7)


def _predictive(src, dst):
    """``src`` made a bigram model whose MTP block is exact: every block's output projections (and the
    MTP block's) are zero, so the trunk's logits after ``x_p`` are ``output(rms(embed(x_p)))``, and
    ``eh_proj = [I | 0]`` makes the MTP block's logits for ``(h_p, x_{p+1})`` those after ``x_{p+1}``:
    the target's own next prediction. Its greedy drafts are all accepted, if paired right."""
    s, E, il = SHAPE, SHAPE.n_embd, SHAPE.n_layer

    def zeros(*shape):
        return np.zeros(shape, np.float32), None
    rep = {f"blk.{il}.nextn.eh_proj.weight": (np.eye(E, 2 * E, dtype=np.float32), None)}
    for i in range(il + 1):
        rep[f"blk.{i}.ffn_down.weight"] = zeros(E, s.n_ff)
        if i < il and (i + 1) % s.full_attention_interval:
            rep[f"blk.{i}.ssm_out.weight"] = zeros(E, s.ssm_dt_rank * s.ssm_d_state)
        else:
            rep[f"blk.{i}.attn_output.weight"] = zeros(E, s.n_head * s.head_dim)
    return rewrite_gguf(str(src), str(dst), replace=rep)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(a file with an MTP block, the same without one, the predictive variant: :func:`_predictive`)."""
    d = tmp_path_factory.mktemp("mtp")
    with_mtp, without = d / "qwen35-mtp.gguf", d / "qwen35-plain.gguf"
    synth.write(with_mtp, SHAPE, "F32", seed=3, scales=SCALES)
    synth.write(without, dataclasses.replace(SHAPE, n_nextn=0), "F32", seed=3, scales=SCALES)
    return with_mtp, without, _predictive(with_mtp, d / "qwen35-mtp-exact.gguf")


def _load(path, family: str = "cpu"):
    if family != "cpu":
        from cooktop.backends import registry
        res = registry.probe(family)
        if not res.available or not res.devices:
            skip_or_fail(family, f"{res.reason}; to enable: {res.hint}")
    return G.load(str(path), n_ctx=96, n_batch=32, device=family, n_gpu_layers=-1)


# -- an independent numpy MTP block (llama.cpp src/models/qwen35.cpp graph_mtp) ----------------------

def _weights(path) -> dict[str, np.ndarray]:
    from gguf import GGUFReader
    return {t.name: np.asarray(t.data, dtype=np.float64) for t in GGUFReader(str(path)).tensors}


def _rms(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_neox(t, pos, n_rot, base):
    half = n_rot // 2
    ang = pos[:, None] * base ** (-np.arange(half) * 2.0 / n_rot)  # [n, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = t[..., :half], t[..., half:n_rot]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos, t[..., n_rot:]], -1)


def reference_mtp(W, h, toks):
    """Logits float64 [n, n_vocab] and h_mtp [n, n_embd] of the pairs (h[i], toks[i]) at positions 0..n-1
    (``nextn.shared_head_norm`` / ``shared_head_head`` when the file has them, else the trunk's head)."""
    s, il = SHAPE, SHAPE.n_layer
    g = lambda k: W[f"blk.{il}.{k}.weight"]  # noqa: E731
    n, D, H, Hk = len(toks), s.head_dim, s.n_head, s.n_head_kv
    e = W["token_embd.weight"][toks]
    x = np.concatenate([_rms(e, g("nextn.enorm")), _rms(h, g("nextn.hnorm"))], -1) @ g("nextn.eh_proj").T
    xn = _rms(x, g("attn_norm"))
    qf = (xn @ g("attn_q").T).reshape(n, H, 2 * D)
    q, gate = qf[..., :D], qf[..., D:]
    k = (xn @ g("attn_k").T).reshape(n, Hk, D)
    v = (xn @ g("attn_v").T).reshape(n, Hk, D)
    pos = np.arange(n, dtype=np.float64)
    q = _rope_neox(_rms(q, g("attn_q_norm")), pos, s.n_rot, s.rope_freq_base)
    k = _rope_neox(_rms(k, g("attn_k_norm")), pos, s.n_rot, s.rope_freq_base)
    att = np.zeros((n, H, D))
    mask = np.tril(np.ones((n, n), dtype=bool))
    for hh in range(H):
        kv = hh // (H // Hk)
        sc = np.where(mask, q[:, hh] @ k[:, kv].T / np.sqrt(D), -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        att[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
    att = att.reshape(n, H * D) / (1.0 + np.exp(-gate.reshape(n, H * D)))
    x = x + att @ g("attn_output").T
    xn = _rms(x, g("post_attention_norm"))
    gt, up = xn @ g("ffn_gate").T, xn @ g("ffn_up").T
    x = x + (gt / (1.0 + np.exp(-gt)) * up) @ g("ffn_down").T
    hm = _rms(x, W.get(f"blk.{il}.nextn.shared_head_norm.weight", W["output_norm.weight"]))
    return hm @ W.get(f"blk.{il}.nextn.shared_head_head.weight", W["output.weight"]).T, hm


@pytest.mark.parametrize("head", ["shared", "own"])
def test_mtp_logits_match_a_numpy_reference(files, head, tmp_path):
    """``shared``: the block uses the target's output_norm and LM head; ``own``: the file has
    ``nextn.shared_head_norm`` and ``nextn.shared_head_head`` (and ``nextn.embed_tokens``)."""
    from cooktop.model.mtp import MTPModel
    path = files[0]
    if head == "own":
        rng, il, E = np.random.default_rng(5), SHAPE.n_layer, SHAPE.n_embd
        add = {f"blk.{il}.nextn.shared_head_norm.weight": ((1 + 0.1 * rng.standard_normal(E)).astype(np.float32), None),
               f"blk.{il}.nextn.shared_head_head.weight": (
                   (0.05 * rng.standard_normal((SHAPE.n_vocab, E))).astype(np.float32), None),
               f"blk.{il}.nextn.embed_tokens.weight": (
                   (0.05 * rng.standard_normal((SHAPE.n_vocab, E))).astype(np.float32), None)}
        path = rewrite_gguf(str(files[0]), str(tmp_path / "own-head.gguf"), add=add)
    eng = _load(path)
    try:
        mtp = MTPModel(eng.model)
        eng.model.record_hidden = True
        eng.seq.eval(PROMPT)
        h = eng.seq.cache.hidden.get(0, 0, len(PROMPT)).copy()
        emb = eng.new_sequence().hidden_states(PROMPT)  # the embeddings path: the same normed rows
        assert nmse(h, emb) <= 1e-10
        # the pairs (h_{p-1}, x_p) at MTP position p, h_{-1} = 0: the drafter's layout
        hin = np.concatenate([np.zeros((1, SHAPE.n_embd), np.float32), h[:-1]])
        cache = mtp.new_cache()
        got = mtp.forward_h(PROMPT, hin, 0, cache, logits_all=True)
        W = _weights(path)
        if head == "own":  # the block looks its tokens up in nextn.embed_tokens
            W["token_embd.weight"] = W[f"blk.{SHAPE.n_layer}.nextn.embed_tokens.weight"]
        want, hm = reference_mtp(W, hin.astype(np.float64), np.array(PROMPT))
        err = nmse(got, want)
        print(f"MTP logits ({head} head) nmse vs numpy reference: {err:.3e}")
        assert err <= 1e-5
        assert nmse(cache.hidden.get(0, 0, len(PROMPT)), hm) <= 1e-5
        # one pair at a time after a cached prefix: the same last row
        cache2 = mtp.new_cache()
        mtp.forward_h(PROMPT[:-1], hin[:-1], 0, cache2)
        last = mtp.forward_h(PROMPT[-1:], hin[-1:], len(PROMPT) - 1, cache2)
        assert nmse(last, want[-1:]) <= 1e-5
        mtp.close()
    finally:
        eng.close()


@pytest.mark.parametrize("family", ["cpu", "opencl"])
def test_draft_mtp_output_is_the_non_speculative_one(files, family):
    eng = _load(files[0], family)
    try:
        spec, mtp = SpecOptions(spec_type=("draft-mtp",), draft_max=3).build(eng, family, -1)
        try:
            for params in (GREEDY, SAMPLED):
                plain = eng.generate(PROMPT, 20, params, seq=eng.new_sequence()).drain()
                got = eng.generate(PROMPT, 20, params, seq=eng.new_sequence(), draft=spec).drain()
                assert got.tokens == plain.tokens
                t = got.timings
                assert t.n_drafted and 0 <= t.n_accepted <= t.n_drafted
            # a regenerated answer on the same sequence (prefix reuse): the MTP cache follows
            seq = eng.new_sequence()
            eng.generate(PROMPT, 8, GREEDY, seq=seq, draft=spec).drain()
            again = eng.generate(PROMPT + [5, 6], 12, GREEDY, seq=seq, draft=spec).drain()
            assert again.tokens == eng.generate(PROMPT + [5, 6], 12, GREEDY, seq=eng.new_sequence()).drain().tokens
        finally:
            mtp.close()
    finally:
        eng.close()
    eng = _load(files[2], family)  # an exact MTP block: every greedy draft token is the target's
    try:
        spec, mtp = SpecOptions(spec_type=("draft-mtp",), draft_max=3).build(eng, family, -1)
        plain = eng.generate(PROMPT, 20, GREEDY, seq=eng.new_sequence()).drain()
        got = eng.generate(PROMPT, 20, GREEDY, seq=eng.new_sequence(), draft=spec).drain()
        assert got.tokens == plain.tokens
        assert got.timings.n_accepted == got.timings.n_drafted >= 10
        mtp.close()
    finally:
        eng.close()


def test_draft_mtp_in_a_batch_driver_and_through_llama(files):
    """Three slots draft for themselves (forks) in one BatchDriver: each text is its plain one; and
    ``Llama(draft_model=LlamaMTPDecoding(...))`` completes as without it."""
    from cooktop import Llama
    from cooktop.api.llama_speculative import LlamaMTPDecoding
    eng = _load(files[0])
    try:
        spec, mtp = SpecOptions(spec_type=("draft-mtp",), draft_max=2).build(eng, "cpu", -1)
        prompts = [PROMPT, PROMPT[5:], PROMPT[:9]]
        alone = [eng.generate(p, 12, GREEDY, seq=eng.new_sequence()).drain().tokens for p in prompts]

        def job(i: int):
            mine = spec.fork()

            def run(seq):
                r = eng.generate(prompts[i], 12, GREEDY, seq=seq, draft=mine).drain()
                return r.tokens, r.timings.n_drafted
            return run

        got, _ = run_in_driver(eng, [job(i) for i in range(3)])
        assert [g[0] for g in got] == alone and all(g[1] > 0 for g in got)
        mtp.close()
    finally:
        eng.close()
    plain = Llama(str(files[0]), n_ctx=96, verbose=False)
    llm = Llama(str(files[0]), n_ctx=96, verbose=False, draft_model=LlamaMTPDecoding(num_pred_tokens=2))
    try:
        a = plain.create_completion(PROMPT, max_tokens=10, temperature=0)["choices"][0]["text"]
        b = llm.create_completion(PROMPT, max_tokens=10, temperature=0)["choices"][0]["text"]
        assert a == b
        assert llm._engine.seq.tokens == plain._engine.seq.tokens
    finally:
        plain.close()
        llm.close()


def test_run_prints_the_mtp_acceptance(files):
    from click.testing import CliRunner

    import cooktop.cli.run  # noqa: F401 (registers the command)
    from cooktop.cli.group import cli

    def run(*extra: str):
        return CliRunner().invoke(cli, ["run", "-m", str(files[2]), "-p", "a b c d e f", "-n", "16", "--temp", "0",
                                        "--device", "cpu", "-c", "96", "--no-warmup", *extra])
    plain, spec = run(), run("--spec-type", "draft-mtp", "--draft-max", "3")
    assert plain.exit_code == 0 and spec.exit_code == 0, spec.output
    assert spec.stdout == plain.stdout
    lines = dict(ln.split(" = ", 1) for ln in spec.stderr.splitlines() if ln.startswith("cooktop: n_"))
    n_drafted, n_accept = int(lines["cooktop: n_drafted"]), int(lines["cooktop: n_accept "])
    print(f"draft-mtp on the synthetic model: {n_accept} of {n_drafted} drafted tokens accepted")
    assert 0 < n_accept == n_drafted  # the exact MTP block (files[2]): all its greedy drafts accepted
    assert "cooktop: accept    = " in spec.stderr and "n_drafted" not in plain.stderr


def test_draft_mtp_is_refused_without_an_mtp_block(files):
    eng = _load(files[1])
    try:
        with pytest.raises(CooktopError, match=r"has no multi-token-prediction block \(qwen35.nextn_predict_layers"
                                               r" = 0\)"):
            SpecOptions(spec_type=("draft-mtp",)).build(eng, "cpu", -1)
    finally:
        eng.close()
    path = SHARED / "models" / "stories260K.gguf"
    if not path.exists():
        skip_or_fail("shared", f"{path} missing")
    eng = G.load(str(path), n_ctx=64, device="cpu")
    try:
        with pytest.raises(CooktopError, match="the llama architecture has no multi-token-prediction block"):
            SpecOptions(spec_type=("draft-mtp",)).build(eng, "cpu", -1)
    finally:
        eng.close()
    with pytest.raises(CooktopError, match="drafts only as Llama"):
        from cooktop.api.llama_speculative import LlamaMTPDecoding
        LlamaMTPDecoding()(np.array([1, 2]))


def test_info_and_plan_count_the_mtp_block(files):
    from cooktop.cli.info import model_info
    from cooktop.cli.plan import plan_report
    gf = open_gguf(str(files[0]))
    il = SHAPE.n_layer
    want = sum(t.n_bytes for n, t in gf.tensors.items() if n.startswith(f"blk.{il}."))
    kv = 64 * 2 * SHAPE.n_head_kv * SHAPE.head_dim * 2  # n_ctx 64, K and V rows of f16
    m = model_info(str(files[0]), 64)["mtp"]
    assert m == {"n_layer_nextn": 1, "block": il, "weight_bytes": want, "kv_bytes": kv, "draft": True}
    assert model_info(str(files[1]), 64)["mtp"] is None
    rep = plan_report(str(files[0]), 64, 32, "cpu", -1, None)
    assert rep["mtp"] == {"device": "cpu", "block": il, "weight_bytes": want, "kv_bytes_per_sequence": kv}


def test_serve_slots_draft_with_the_mtp_block(files, server_deps):
    """``cooktop serve -np 2 --spec-type draft-mtp``: each slot drafts with its own MTP cache; the answers
    are those without it, and the exact block's drafts are all accepted."""
    import concurrent.futures

    import httpx
    from serverutil import RunningServer

    from cooktop.server.app import ServerConfig

    def ask(base: str, p: str) -> dict:
        r = httpx.post(base + "/v1/completions", json={"prompt": p, "max_tokens": 12, "temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    prompts = ["a b c d e f", "x y z", "hello there"]
    answers, timings = [], []
    for spec in (None, SpecOptions(spec_type=("draft-mtp",), draft_max=3)):
        s = RunningServer(ServerConfig(str(files[2]), llama_kwargs=dict(n_ctx=96, device="cpu"), n_parallel=2,
                                       speculative=spec))
        try:
            with concurrent.futures.ThreadPoolExecutor(3) as ex:
                got = list(ex.map(lambda p, base=s.base: ask(base, p), prompts))
            answers.append([g["choices"][0]["text"] for g in got])
            timings.append([g["timings"] for g in got])
        finally:
            s.stop()
    assert answers[0] == answers[1]
    assert all(0 < t["draft_n_accepted"] == t["draft_n"] for t in timings[1])


def test_qwen35moe_mtp_block_drafts_with_the_same_output(tmp_path):
    """qwen35moe (the experts and the shared expert in the MTP block too), Q8_0 (``eh_proj`` split in byte
    halves of its rows): greedy output with ``draft-mtp`` equals the output without it."""
    moe = dataclasses.replace(SHAPE, arch="qwen35moe", n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64)
    path = tmp_path / "qwen35moe-mtp.gguf"
    synth.write(path, moe, "Q8_0", seed=3, scales=SCALES)
    assert f"blk.{SHAPE.n_layer}.ffn_gate_exps.weight" in open_gguf(str(path)).tensors
    eng = _load(path)
    try:
        spec, mtp = SpecOptions(spec_type=("draft-mtp",), draft_max=3).build(eng, "cpu", -1)
        plain = eng.generate(PROMPT, 12, GREEDY, seq=eng.new_sequence()).drain()
        got = eng.generate(PROMPT, 12, GREEDY, seq=eng.new_sequence(), draft=spec).drain()
        assert got.tokens == plain.tokens and got.timings.n_drafted > 0
        mtp.close()
    finally:
        eng.close()
