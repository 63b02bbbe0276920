"""Gemma 4's chat format: its thought channel and ``<|tool_call>`` calls parsed from literal answers
(whole and streamed), its value syntax converted as llama.cpp's ``gemma4_to_json`` does, the detection
of the format from a template, the call grammar, and ``chat_template_kwargs`` (``enable_thinking``)
reaching the template through ``Llama.create_chat_completion``.

The expected parses are the facts of llama.cpp tests/test-chat.cpp (Gemma 4 cases); the template here
is a small one written for these tests with the markers llama.cpp's detection keys on, not Google's.
"""

from __future__ import annotations

import json

import pytest
from conftest import with_chat_template

from cooktop.text.gemma4_calls import gemma4_tool_responses, value_json
from cooktop.text.tool_calls import MessageStream, detect_format, parse
from cooktop.text.tool_grammar import call_grammar, check_tools

Q = '<|"|>'
THOUGHT = "<|channel>thought\nI'm\nthinking<channel|>Hello, world!\nWhat's up?"


def _streamed(text: str, **kw) -> tuple[str, str, list[tuple[str, str]]]:
    """(content, reasoning, [(name, arguments)]) joined from the deltas of ``text`` fed one character at a time."""
    s = MessageStream("gemma4", **kw)
    deltas = [d for ch in text for d in s.feed(ch)] + s.feed("", final=True)
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:
                assert c["id"].startswith("call_") and c["type"] == "function" and c["index"] not in names
                names[c["index"]] = c["function"]["name"]
            args[c["index"]] = args.get(c["index"], "") + c["function"].get("arguments", "")
    return ("".join(d.get("content", "") for d in deltas), "".join(d.get("reasoning_content", "") for d in deltas),
            [(names[i], args[i]) for i in sorted(names)])


@pytest.mark.parametrize("text,content,reasoning,calls", [
    ("Hello, world!", "Hello, world!", "", []),
    (THOUGHT, "Hello, world!\nWhat's up?", "I'm\nthinking", []),
    ("<|channel>thought<channel|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", "", []),
    # empty channels, a trailing empty thought and stray closes are dropped (llama.cpp's edge cases)
    ("<|channel>thought\n<channel|>Hello, world!\nWhat's up?<channel|>", "Hello, world!\nWhat's up?", "", []),
    ("<|channel>thought\n<channel|>Hi<|channel>thought\n<channel|><channel|>", "Hi", "", []),
    ("<|channel><|channel>thought\n<channel|>Hello", "Hello", "", []),
    ("<|turn>model\nHello", "Hello", "", []),
    (f"<|tool_call>call:get_time{{city:{Q}London{Q}}}<tool_call|>", "", "", [("get_time", '{"city":"London"}')]),
    ("<|tool_call>call:empty_args{}<tool_call|>", "", "", [("empty_args", "{}")]),
    (f"Hello, world!\nWhat's up?<|tool_call>call:get_time{{city:{Q}Paris{Q}}}<tool_call|>",
     "Hello, world!\nWhat's up?", "", [("get_time", '{"city":"Paris"}')]),
    (f"<|channel>thought\nI'm\nthinking<channel|><|tool_call>call:get_time{{city:{Q}Paris{Q}}}<tool_call|>",
     "", "I'm\nthinking", [("get_time", '{"city":"Paris"}')]),
    (f"<|tool_call>call:get_time{{city:{Q}London{Q}}}<tool_call|><|tool_call>call:get_weather{{city:{Q}Paris{Q},"
     f"days:3}}<tool_call|>", "", "",
     [("get_time", '{"city":"London"}'), ("get_weather", '{"city":"Paris","days":3}')]),
    (f"<|tool_call>call:set_config{{config:{{theme:{Q}dark{Q},count:3,tags:[{Q}a{Q},[],{{}}],on:true,off:false,"
     f"none:null,x:-7,y:3.14,z:1.5e10}}}}<tool_call|>", "", "",
     [("set_config", '{"config":{"theme":"dark","count":3,"tags":["a",[],{}],"on":true,"off":false,"none":null,'
                     '"x":-7,"y":3.14,"z":1.5e10}}')]),
    # a string is taken literally: quotes, backslashes, newlines, braces and markup are JSON-escaped
    (f'<|tool_call>call:f{{s:{Q}say "hi" \\ {{a:1}}, <b>\n\tend{Q}}}<tool_call|>', "", "",
     [("f", '{"s":"say \\"hi\\" \\\\ {a:1}, <b>\\n\\tend"}')]),
    # whitespace after '{', ',' and ':' and before '}' as llama.cpp's grammar allows it
    (f"<|tool_call>call:f{{ a: 1,\n b: [ 2, {Q}x{Q} ] }}<tool_call|>", "", "", [("f", '{"a":1,"b":[2,"x"]}')]),
])
def test_parse_whole_and_streamed_agree(text, content, reasoning, calls):
    p = parse(text, "gemma4")
    assert (p.content, p.reasoning, [(c.name, c.arguments) for c in p.calls]) == (content, reasoning, calls)
    assert all(c.complete for c in p.calls)
    for _, args in calls:
        json.loads(args)
    assert _streamed(text) == (content, reasoning, calls)


def test_reasoning_formats_and_tools_off():
    none = parse(THOUGHT, "gemma4", reasoning_format="none")
    assert (none.content, none.reasoning) == (THOUGHT, "")
    legacy = parse(THOUGHT, "gemma4", reasoning_format="deepseek-legacy")
    assert (legacy.content, legacy.reasoning) == (THOUGHT, "I'm\nthinking")
    assert _streamed(THOUGHT, reasoning_format="none") == (THOUGHT, "", [])
    call = f"<|tool_call>call:f{{a:{Q}b{Q}}}<tool_call|>"
    off = parse("ok " + call, "gemma4", tools=False)  # tool_choice none: the call is text
    assert (off.content, off.calls) == ("ok " + call, [])


@pytest.mark.parametrize("text", [
    "<|tool_call>call:f{a:1 b}<tool_call|> after",  # no ',' between members
    "<|tool_call>call:f{a:1.}<tool_call|>",
    "<|tool_call>call:f{a:yes}<tool_call|>",
    "<|tool_call>call:f{a:01}<tool_call|>",
    "<|tool_call>call:f[1]<tool_call|>",
    "<|tool_call>nocall<tool_call|>",
    "<|tool_call>call:{a:1}<tool_call|>",
])
def test_malformed_calls_stay_content(text):
    p = parse(text, "gemma4")
    assert (p.content, p.reasoning, p.calls) == (text, "", [])
    _streamed(text)  # streaming the same text does not raise


def test_json_keys_are_bare_keys_with_their_quotes():
    """llama.cpp's dict key is any text up to ':' ([^:}]+), so JSON's quoted keys keep their quotes."""
    p = parse('<|tool_call>call:f{"a": 1}<tool_call|>', "gemma4")
    assert [(c.name, c.arguments) for c in p.calls] == [("f", '{"\\"a\\"":1}')]


def test_cut_answers_keep_the_call_and_its_closed_json():
    text = f"<|channel>thought\nplan<channel|><|tool_call>call:f{{a:[1,{Q}x y"
    p = parse(text, "gemma4")
    assert [(c.name, c.arguments, c.complete) for c in p.calls] == [("f", '{"a":[1,"x y"]}', False)]
    assert p.reasoning == "plan" and p.content == ""
    assert _streamed(text) == ("", "plan", [("f", '{"a":[1,"x y"]}')])
    part = parse(text, "gemma4", partial=True)  # while streaming: gemma4_to_json's partial nodes
    assert part.calls[0].arguments == '{"a":[1,"x y'
    assert parse(f"x<|tool_call>call:f{{a:{Q}q<|", "gemma4", partial=True).calls[0].arguments == '{"a":"q'
    assert parse("<|channel>thou", "gemma4", partial=True).content == ""  # held back
    assert parse("<|channel>thought\nunfinished", "gemma4").reasoning == "unfinished"
    assert parse("see <|tool_call>call:ge", "gemma4").content == "see <|tool_call>call:ge"


def test_value_syntax():
    assert value_json(f"{Q}a\u00e9\x01{Q}", 0) == ('"a\u00e9\\u0001"', 13)
    assert value_json("-0.5e-3,", 0) == ("-0.5e-3", 7)
    assert value_json("12", 0) == ("12", None)  # the number may go on
    assert value_json("{k:", 0) == ('{"k":', None)
    assert value_json("01", 0) == ("0", 1)  # JSON numbers: what follows is the caller's error
    with pytest.raises(ValueError):
        value_json("yes", 0)


def test_detection_from_a_template():
    mini = "{%- for c in m.tool_calls -%}{{- '<|tool_call>call:' + c.function.name + '{' -}}{%- endfor -%}"
    assert detect_format(mini) == "gemma4"
    assert detect_format("{{- '<|channel>thought\\n<channel|>' -}}") == "generic"  # the call marker is the key
    assert detect_format("{{ '<|channel|>analysis' }}") == "gpt-oss"


def test_older_template_messages_carry_tool_responses():
    calls = [{"id": "c0", "type": "function", "function": {"name": "get_time", "arguments": {"city": "Paris"}}}]
    msgs = [{"role": "user", "content": "time?"},
            {"role": "assistant", "content": "", "tool_calls": calls, "reasoning_content": "look it up"},
            {"role": "tool", "tool_call_id": "c0", "content": '{"t": "12:00"}'},
            {"role": "assistant", "content": "It is noon."}, {"role": "user", "content": "thanks"}]
    assert gemma4_tool_responses(msgs) == [
        msgs[0], {"role": "assistant", "tool_calls": calls, "reasoning_content": "look it up",
                  "tool_responses": [{"name": "get_time", "response": {"t": "12:00"}}], "content": "It is noon."},
        msgs[4]]


def test_call_grammar_accepts_gemma4_calls_only(shared):
    from cooktop.api import Llama
    from cooktop.engine.grammar import Grammar, GrammarTokenizer
    fns = check_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                       {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}])
    llm = Llama(model_path=str(shared / "vocab" / "ggml-vocab-qwen2.gguf"), vocab_only=True, verbose=False)
    gtok = GrammarTokenizer(llm._tokenizer)

    def accepts(text: str, **kw) -> bool:
        g = Grammar(gtok, *call_grammar("gemma4", fns, **kw))
        toks = llm._tokenizer.tokenize(text.encode(), add_bos=False, special=False)
        return g.matcher.try_consume_tokens(toks) == len(toks) and g.matcher.is_accepting()

    nested = (f"<|tool_call>call:get_weather{{city:{Q}Paris <b>{Q},days:3,o:{{a:[1,-2.5e3,true,null,{Q}q{Q}]}}}}"
              "<tool_call|>")
    assert accepts(nested) and accepts("<|tool_call>call:get_weather{}<tool_call|>")
    assert not accepts('<|tool_call>call:get_weather{"city": "Paris"}<tool_call|>')
    assert not accepts("<|tool_call>call:other{}<tool_call|>")
    two = "<|tool_call>call:t{}<tool_call|><|tool_call>call:t{}<tool_call|>"
    assert not accepts(two) and accepts(two, parallel=True)
    assert not accepts("<|tool_call>call:t{}<tool_call|>", name="get_weather")
    thought = "<|channel>thought\nfirst <b> then t<channel|><|tool_call>call:t{}<tool_call|>"
    assert accepts(thought, thought=True) and not accepts(thought)  # thinking on: a thought may come first
    assert accepts("<|tool_call>call:t{}<tool_call|>", thought=True)
    assert not accepts("<|channel>thought\nx<channel|>y<channel|><|tool_call>call:t{}<tool_call|>", thought=True)
    assert not accepts("<|tool_call>call:t{}<tool_call|><|channel>thought\nx<channel|>", thought=True)
    # a tool with properties: its keys in order, required ones always, values of the property's type
    fns = check_tools([{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo"]}, "days": {"type": "integer"}, "o": {}},
        "required": ["days"]}}}])
    for text, ok in ((f"{{city:{Q}Paris{Q},days:3}}", True), ("{days:3}", True), (f"{{days:-2,o:[{Q}x{Q}]}}", True),
                     ("{}", False), (f"{{city:{Q}Rome{Q},days:3}}", False), ("{days:3.5}", False),
                     (f"{{days:3,city:{Q}Paris{Q}}}", False)):
        assert accepts(f"<|tool_call>call:w{text}<tool_call|>") is ok, text


# A small Gemma-4-like template written for these tests: thinking switched by enable_thinking (the
# <|think|> system turn, an empty thought channel in the generation prompt when off), calls in the
# '<|tool_call>call:' syntax, no generation prompt after a tool result (the turn is left closed).
MINI = (
    "{{- bos_token -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}{{- '<|turn>system\\n<|think|>\\n<turn|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}{{- '<|turn>tool\\n' + m.content + '<turn|>\\n' -}}"
    "{%- else -%}{{- '<|turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' + (m.content or '') -}}"
    "{%- for c in m.tool_calls or [] -%}{{- '<|tool_call>call:' + c.function.name + '{}<tool_call|>' -}}"
    "{%- endfor -%}{{- '<turn|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and messages[-1].role != 'tool' -%}{{- '<|turn>model\\n' -}}"
    "{%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}"
    "{%- endif -%}")
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def g4llm(stories, tmp_path_factory):
    from cooktop.api import Llama
    path = with_chat_template(stories, tmp_path_factory.mktemp("g4") / "g4.gguf", MINI)
    llm = Llama(str(path), n_ctx=512, verbose=False, device="cpu")
    yield llm
    llm.close()


def test_enable_thinking_reaches_the_template(g4llm):
    from cooktop.api.chat_plan import plan_chat
    assert g4llm.apply_chat_template(ASK, enable_thinking=True) == (
        "<s><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n")
    assert g4llm.apply_chat_template(ASK) == "<s><|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    assert "<turn|>" in g4llm.chat_template_choice().for_request(None).stop

    def prompt(**kw) -> str:
        plan = plan_chat(g4llm, ASK, tools=None, tool_choice=None, grammar=None, parallel_tool_calls=None,
                         reasoning_format=None, **{"chat_template_kwargs": None, "reasoning_budget": None, **kw})
        assert plan.fmt == "gemma4"
        return g4llm._chat_render(plan.messages, plan.tools, **plan.template_kwargs)[0]

    assert prompt(chat_template_kwargs={"enable_thinking": True}).endswith("<|think|>\n<turn|>\n<|turn>user\nhi"
                                                                          "<turn|>\n<|turn>model\n")
    assert prompt(chat_template_kwargs={"enable_thinking": True}, reasoning_budget=0).endswith(
        "<|turn>model\n")  # the caller's kwargs win over the budget's default
    assert prompt(reasoning_budget=0).endswith("<|turn>model\n<|channel>thought\n<channel|>")
    # a conversation whose template leaves the turn closed (after a tool result) gets the model turn opened
    convo = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "done"}]
    text = g4llm._chat_render(convo, None)[0]
    assert text.endswith("<|tool_call>call:f{}<tool_call|><turn|>\n<|turn>tool\ndone<turn|>\n<|turn>model\n")


def test_chat_completion_splits_the_thought_channel(g4llm):
    g = 'root ::= "<|channel>thought\\n" [a-z]{3,12} "<channel|>" [a-z]{2,8}'
    kw = dict(temperature=0, max_tokens=60, grammar=g, chat_template_kwargs={"enable_thinking": True})
    r = g4llm.create_chat_completion(ASK, **kw)
    msg = r["choices"][0]["message"]
    assert msg["reasoning_content"].isalpha()
    assert msg["content"].isalpha() and "<" not in msg["content"]
    chunks = list(g4llm.create_chat_completion(ASK, stream=True, **kw))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    raw = g4llm.create_chat_completion(ASK, reasoning_format="none", **kw)["choices"][0]["message"]
    assert raw["content"] == f"<|channel>thought\n{msg['reasoning_content']}<channel|>{msg['content']}"
    assert "reasoning_content" not in raw


def test_required_tool_call_is_written_in_gemma4_syntax(g4llm):
    """tool_choice required: the grammar makes the tiny model write a call in Gemma 4's syntax, which
    comes back as an OpenAI tool call with JSON arguments, whole and streamed."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                                         "days": {"type": "integer"}}, "required": ["city"]}}}]
    kw = dict(tools=tools, tool_choice="required", temperature=0, max_tokens=90)  # ~55 byte-sized tokens
    ch = g4llm.create_chat_completion(ASK, **kw)["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    (call,) = ch["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and args["city"] in ("Paris", "Tokyo")
    assert set(args) <= {"city", "days"} and isinstance(args.get("days", 0), int)
    deltas = [c["choices"][0]["delta"] for c in g4llm.create_chat_completion(ASK, stream=True, **kw)]
    streamed = "".join(c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls") or [])
    assert streamed == call["function"]["arguments"]


def test_reasoning_budget_closes_the_thought_channel(g4llm):
    """reasoning_budget=N: after N thinking tokens ``<channel|>`` is forced (llama.cpp's thinking end tag)."""
    free = 'root ::= "<|channel>thought\\n" [a-z <|>]*'
    kw = dict(temperature=0, max_tokens=30, grammar=free, reasoning_budget=3,
              chat_template_kwargs={"enable_thinking": True})
    raw = g4llm.create_chat_completion(ASK, reasoning_format="none", **kw)["choices"][0]["message"]["content"]
    head, sep, answer = raw.partition("<channel|>")
    assert head.startswith("<|channel>thought\n") and sep and answer
    msg = g4llm.create_chat_completion(ASK, **kw)["choices"][0]["message"]
    assert msg["content"] == answer and msg.get("reasoning_content", "") == head[len("<|channel>thought"):].strip()
    n_open = len(g4llm.tokenize(b"<|channel>thought", add_bos=False))
    assert len(g4llm.tokenize(head.encode(), add_bos=False)) <= n_open + 3


def test_call_grammar_asks_for_special_tokens_by_id(tmp_path):
    """In a vocabulary where Gemma 4's markers are control tokens (its own), the grammar asks for those
    tokens by id and a string's or a thought's text runs up to the closing token."""
    from gguf import GGUFWriter, TokenType

    from cooktop.api import Llama
    from cooktop.api.chat_plan import _preserved, _special_id
    from cooktop.engine.grammar import Grammar, GrammarTokenizer
    from cooktop.tools import synth
    markers = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>", Q]
    tokens, scores, types = synth.vocab(300)
    first = 300 - len(markers)
    tokens[first:] = markers
    types[first:] = [int(TokenType.CONTROL)] * len(markers)
    w = GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    llm = Llama(str(tmp_path / "v.gguf"), vocab_only=True, verbose=False)
    ids = {m: first + k for k, m in enumerate(markers)}
    assert {m: _special_id(llm, m) for m in markers} == ids and _preserved(llm, "gemma4") == frozenset(ids.values())
    fns = check_tools([{"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}])
    _, src = call_grammar("gemma4", fns, special_id=lambda s: _special_id(llm, s), thought=True)
    assert f"call_0: <[{ids['<|tool_call>']}]> \"call:w\" g4_args_0 <[{ids['<tool_call|>']}]>" in src
    tk = llm._tokenizer
    byte_id = {}
    for i in range(tk.n_vocab):
        piece = tk.token_to_piece(i)
        if len(piece) == 1:
            byte_id.setdefault(piece, i)

    def accepts(parts: list[str]) -> bool:  # markers by id, other text byte by byte
        toks: list[int] = []
        for p in parts:
            toks += [ids[p]] if p in ids else [byte_id[bytes([b])] for b in p.encode()]
        g = Grammar(GrammarTokenizer(tk), "lark", src)
        return g.matcher.try_consume_tokens(toks) == len(toks) and g.matcher.is_accepting()

    call = ["<|tool_call>", "call:w{city:", Q, "Pa <|ris\n", Q, "}", "<tool_call|>"]
    assert accepts(call) and accepts(["<|channel>", "thought\nhm <x>", "<channel|>", *call])
    assert not accepts(["<|tool_call>", "call:w{city:", "<|\"|>Paris<|\"|>}", "<tool_call|>"])  # quotes as text
