"""Tool-call and reasoning parsing (cooktop.text.tool_calls / reasoning) on known answer texts, whole and streamed."""

from __future__ import annotations

import json

import pytest

from cooktop.text.tool_calls import MessageStream, ToolCallError, detect_format, parse
from cooktop.text.tool_grammar import check_tool_choice, check_tools, template_messages

CASES = [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [("get_weather", {"city": "Paris"})]),
    ("llama3", '<|python_tag|>brave_search.call(query="cooktop")', "", [("brave_search", {"query": "cooktop"})]),
    ("llama3", 'Paris is sunny {not json}', "Paris is sunny {not json}", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123XYZ"}]', "",
     [("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Tokyo"}', "", [("get_weather", {"city": "Tokyo"})]),
    ("gpt-oss", '<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant<|channel|>commentary '
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}', "",
     [("get_weather", {"city": "Paris"})]),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "",
     [("get_weather", {"city": "Paris"})]),
    ("generic", '{"response": "Hello there"}', "Hello there", []),
]


@pytest.mark.parametrize("fmt,text,content,calls", CASES)
def test_parse_whole_and_streamed_agree(fmt, text, content, calls):
    p = parse(text, fmt)
    assert p.content == content
    assert [(c.name, json.loads(c.arguments)) for c in p.calls] == calls
    # streamed one character at a time: the deltas join to exactly the whole parse
    s = MessageStream(fmt)
    deltas = [d for ch in text for d in s.feed(ch)] + s.feed("", final=True)
    joined = "".join(d.get("content", "") for d in deltas)
    assert joined == content
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:
                assert c["id"] and c["type"] == "function" and c["index"] not in names
                names[c["index"]] = c["function"]["name"]
            args[c["index"]] = args.get(c["index"], "") + c["function"].get("arguments", "")
    assert [(names[i], json.loads(args[i])) for i in sorted(names)] == calls


def test_gpt_oss_analysis_is_reasoning():
    p = parse("<|channel|>analysis<|message|>think hard<|end|><|start|>assistant<|channel|>final<|message|>42",
              "gpt-oss")
    assert (p.reasoning, p.content, p.calls) == ("think hard", "42", [])


def test_think_split_modes_and_held_markers():
    text = "<think>\nsum it up\n</think>\n\nThe answer is 4."
    p = parse(text, "hermes", tools=False)
    assert (p.reasoning, p.content) == ("sum it up", "The answer is 4.")
    assert parse(text, "hermes", tools=False, reasoning_format="none").content == text
    legacy = parse(text, "hermes", tools=False, reasoning_format="deepseek-legacy")
    assert legacy.reasoning == "sum it up" and legacy.content.startswith("<think>")
    opened = parse("a plan</think>done", "generic", tools=False, thinking_open=True)
    assert (opened.reasoning, opened.content) == ("a plan", "done")
    # a prefix of a marker is held back while streaming, and released when it is not one
    s = MessageStream("hermes")
    assert s.feed("<tool_") == []
    assert s.feed("box>") == [{"content": "<tool_box>"}]


def test_tool_checks():
    fns = check_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert check_tool_choice(None, fns) == ("auto", None)
    assert check_tool_choice({"type": "function", "function": {"name": "f"}}, fns) == ("required", "f")
    for bad in ({"type": "function", "function": {"name": "g"}}, "sometimes", 3):
        with pytest.raises(ToolCallError):
            check_tool_choice(bad, fns)
    for bad in ("x", [{"type": "function"}], [{"type": "function", "function": {"name": "f", "parameters": "s"}}]):
        with pytest.raises(ToolCallError):
            check_tools(bad)
    msgs = template_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}], "hermes")
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


@pytest.mark.parametrize("name,fmt", [("Qwen-Qwen3-0.6B", "hermes"), ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
                                      ("HuggingFaceTB-SmolLM3-3B", "generic"),
                                      ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
                                      ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
                                      ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
                                      ("openai-gpt-oss-120b", "gpt-oss"), ("google-gemma-2-2b-it", "generic")])
def test_detect_format_of_shared_templates(shared, name, fmt):
    assert detect_format((shared / "templates" / f"{name}.jinja").read_text()) == fmt


def test_markers_that_are_control_tokens_are_preserved_and_forced_by_id(shared, monkeypatch):
    """A marker that is one control token in the vocabulary is printed in the answer (llama.cpp's
    preserved_tokens) and a forcing grammar asks for the token itself, not its spelling. Llama 3's
    vocabulary (this one predates <|python_tag|>) with its <|start_header_id|> standing in as a marker."""
    from cooktop.api import Llama
    from cooktop.api.chat_plan import _preserved, _special_id
    from cooktop.text import tool_calls
    from cooktop.text.tool_grammar import call_grammar
    llm = Llama(str(shared / "vocab" / "ggml-vocab-llama-bpe.gguf"), vocab_only=True, verbose=False)
    monkeypatch.setitem(tool_calls.MARKERS, "llama3", ("<|start_header_id|>", "<|python_tag|>"))
    (tag,) = llm.tokenize(b"<|start_header_id|>", add_bos=False, special=True)
    assert _preserved(llm, "llama3") == frozenset([tag])
    assert llm._tokenizer.token_to_piece(tag) == b"" and llm._tokenizer.token_to_piece(
        tag, special=True) == b"<|start_header_id|>"
    assert _special_id(llm, "[TOOL_CALLS]") is None and _special_id(llm, "<|start_header_id|>") == tag
    fns = check_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    kind, src = call_grammar("gpt-oss", fns, special_id=lambda s: _special_id(llm, s))
    assert kind == "lark" and '"<|channel|>"' in src  # no such special token in Llama 3: literal text
    _, src = call_grammar("mistral", fns, special_id=lambda s: 7 if s == "[TOOL_CALLS]" else None)
    assert src.startswith('start: <[7]> "["')


def test_engine_prints_preserved_control_tokens(stories):
    from cooktop.api import Llama
    from cooktop.engine.sampling import SamplingParams
    llm = Llama(str(stories), n_ctx=64, verbose=False)
    params = SamplingParams(temperature=0.0, logit_bias=((1, 100.0),))  # always <s>, a control token
    prompt = llm.tokenize(b"Once", add_bos=True)
    plain = llm._engine.generate(prompt, 2, params).drain()
    kept = llm._engine.generate(prompt, 2, params, preserved=frozenset({1})).drain()
    assert plain.tokens == kept.tokens == [1, 1] and plain.text == "" and kept.text == "<s><s>"
    llm.close()


def test_tool_schemas_are_closed_as_llama_cpp_does():
    from cooktop.text.tool_grammar import closed
    s = closed({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}},
                                                 "c": {"type": "array", "items": {"type": "object"}}},
                "additionalProperties": True})
    assert s["additionalProperties"] is True  # given: kept
    assert s["properties"]["a"]["additionalProperties"] is False
    assert s["properties"]["c"]["items"]["additionalProperties"] is False


QWEN3_CODER = ('Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
               '<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n'
               '<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>')


@pytest.mark.parametrize("text,content,calls", [
    (QWEN3_CODER, "Let me check.", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})]),
    ('<tool_call>\n<function=f>\n<parameter=q>\nline one\nline <b>two</b>\n</parameter>\n<parameter=o>\n'
     '{"k": [1, 2]}\n</parameter>\n</function>\n</tool_call>', "",
     [("f", {"q": "line one\nline <b>two</b>", "o": {"k": [1, 2]}})]),
    ("no call here <b>bold</b>", "no call here <b>bold</b>", []),
])
def test_qwen3_coder_xml_calls(text, content, calls):
    """Qwen3.5's (Qwen3-Coder's) XML calls: whole and streamed alike; values that read as JSON are JSON,
    other text (several lines, with markup) a string."""
    test_parse_whole_and_streamed_agree("qwen3-coder", text, content, calls)


def test_qwen3_coder_detection_and_grammar(shared):
    """A template with ``<tool_call>``, ``<function=`` and ``<parameter=`` (Qwen3.5's) is qwen3-coder, a
    plain ``<tool_call>`` one hermes; the call grammar accepts a call in that layout and refuses JSON."""
    from cooktop.api import Llama
    from cooktop.engine.grammar import Grammar, GrammarTokenizer
    from cooktop.text.tool_grammar import call_grammar
    assert detect_format("{{ '<tool_call>\\n<function=' + name + '>\\n<parameter=' }}") == "qwen3-coder"
    assert detect_format("{{ '<tool_call>\\n' + tool | tojson }}") == "hermes"
    fns = check_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}])
    llm = Llama(model_path=str(shared / "vocab" / "ggml-vocab-qwen2.gguf"), vocab_only=True, verbose=False)
    gtok = GrammarTokenizer(llm._tokenizer)

    def accepts(text: str) -> bool:
        g = Grammar(gtok, *call_grammar("qwen3-coder", fns))
        toks = llm._tokenizer.tokenize(text.encode(), add_bos=False, special=False)
        return g.matcher.try_consume_tokens(toks) == len(toks) and g.matcher.is_accepting()

    assert accepts("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
    assert accepts("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
                   "</tool_call>")
    assert not accepts('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert not accepts("<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n"
                       "</function>\n</tool_call>")


def test_qwen3_coder_cut_answers_and_odd_values_stay_consistent():
    """A call cut inside its block (max_tokens, an unclosed parameter) is kept, with the parameters read,
    in the whole parse as in the stream (the stream's arguments end as the final ones, valid JSON); a
    value of 1e999 (no JSON number) stays text; a repeated ``<function=`` is linear, not a hang."""
    import time
    cut = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
    for text, args in ((cut, {"a": 1, "b": 2}), (cut + "<parameter=c>\nunfinished", {"a": 1, "b": 2}),
                       ("<tool_call>\n<function=f>\n<parameter=x>\n1e999\n</parameter>\n</function>\n</tool_call>",
                        {"x": "1e999"})):
        p = parse(text, "qwen3-coder")
        assert [(c.name, json.loads(c.arguments)) for c in p.calls] == [("f", args)] and p.content == ""
        s = MessageStream("qwen3-coder")
        deltas = [d for ch in text for d in s.feed(ch)] + s.feed("", final=True)
        assert not any("content" in d for d in deltas)
        streamed = "".join(c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls", []))
        assert json.loads(streamed) == args
    assert parse("<tool_call>\n<function= >\n</function>\n</tool_call>", "qwen3-coder").calls == []
    t = time.perf_counter()
    parse("<tool_call>" + "<function=" * 20000, "qwen3-coder", partial=True)
    assert time.perf_counter() - t < 1.0
