"""Run by tests/test_vocab_llama_cpp.py in a child process: llama.cpp's answers (through
llama-cpp-python) for a list of jobs on vocabulary-only GGUFs. JSON in (stdin), JSON out (stdout).

Each job: {"path", "texts": [hex], "special": bool, "info": bool, "detok": [[ids, remove_special,
unparse_special]]}; each answer: {"tok": [[ids]], "pieces", "pieces_sp": [hex], "eog": [ids], "bos",
"eos", "add_bos", "add_eos", "detok": [hex]} for what the job asked. A child process, because
llama.cpp aborts the process on some inputs instead of raising.
"""

import ctypes
import json
import sys

import llama_cpp


def run(job: dict) -> dict:
    llm = llama_cpp.Llama(model_path=job["path"], vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out: dict = {}
    if job.get("texts") is not None:
        out["tok"] = [llm.tokenize(bytes.fromhex(t), add_bos=False, special=job.get("special", False))
                      for t in job["texts"]]
    buf = ctypes.create_string_buffer(1 << 16)
    if job.get("info"):
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        pieces, pieces_sp = [], []
        for i in range(n):
            k = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, False)
            pieces.append(buf.raw[:k].hex())
            k = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
            pieces_sp.append(buf.raw[:k].hex())
        out.update(pieces=pieces, pieces_sp=pieces_sp,
                   eog=[i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
                   bos=llama_cpp.llama_vocab_bos(vocab), eos=llama_cpp.llama_vocab_eos(vocab),
                   add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
                   add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vocab)))
    if job.get("detok") is not None:
        res = []
        for ids, remove_special, unparse_special in job["detok"]:
            arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
            k = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, len(buf), remove_special, unparse_special)
            res.append(buf.raw[:k].hex())
        out["detok"] = res
    return out


if __name__ == "__main__":
    json.dump([run(job) for job in json.load(sys.stdin)], sys.stdout)
