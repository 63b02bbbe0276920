"""Tools in a request: checking ``tools`` / ``tool_choice``, the grammar that forces a call, the generic prompt.

``tool_choice`` (OpenAI): ``none`` (answer in text, calls not parsed), ``auto``
(the default: the model decides), ``required`` (at least one call) or
``{"type": "function", "function": {"name": ...}}`` (that call). ``required``
and a named function are enforced with a grammar in the template's own call
syntax (an llguidance Lark grammar whose arguments are ``%json`` of the tool's
``parameters`` schema), as llama.cpp builds one per format in
``common/chat.cpp``. The ``generic`` format (a template with no call syntax of
its own) describes the tools in a system message and always constrains the
answer to its JSON shape (llama.cpp's ``common_chat_params_init_generic``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .tool_calls import ToolCallError


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """The ``function`` objects of OpenAI ``tools`` (each with ``name`` and ``parameters``).

    Raises:
        ToolCallError: not a list of ``{"type": "function", "function": {"name": str, ...}}``,
            a name used twice, or ``parameters`` that is not a JSON-schema object.
    """
    if not isinstance(tools, list):
        raise ToolCallError(f"tools must be a list, got {type(tools).__name__}")
    out, seen = [], set()
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(
                t.get("function"), dict):
            raise ToolCallError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not name or len(name) > 128:
            raise ToolCallError(f"tools[{i}].function.name must be a non-empty string")
        if name in seen:
            raise ToolCallError(f"tools[{i}].function.name {name!r} is used twice")
        seen.add(name)
        params = f.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolCallError(f"tools[{i}].function.parameters must be a JSON schema object, "
                                f"got {type(params).__name__}")
        if "type" in params and not isinstance(params["type"], (str, list)):
            raise ToolCallError(f"tools[{i}].function.parameters.type must be a string or a list of strings")
        out.append({**f, "parameters": params})
    return out


def check_tool_choice(tool_choice: Any, functions: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(``none`` | ``auto`` | ``required``, the forced function's name or None).

    Raises:
        ToolCallError: an unknown value, or a function name that is not among the tools.
    """
    if tool_choice is None:
        return ("auto" if functions else "none"), None
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ToolCallError(f"tool_choice must be 'none', 'auto', 'required' or a function, got {tool_choice!r}")
        if tool_choice == "required" and not functions:
            raise ToolCallError("tool_choice 'required' needs tools")
        return tool_choice, None
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool_choice.get("name")
        if not isinstance(name, str):
            raise ToolCallError("tool_choice must be {'type': 'function', 'function': {'name': ...}}")
        if name not in {f["name"] for f in functions}:
            raise ToolCallError(f"tool_choice names the function {name!r}, which is not among the tools "
                                f"({', '.join(f['name'] for f in functions) or 'none given'})")
        return "required", name
    raise ToolCallError(f"tool_choice must be a string or an object, got {type(tool_choice).__name__}")


#: llguidance's JSON layout options: no free whitespace, ``": "`` / ``", "`` as the templates write JSON
STRICT_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever an object schema leaves it out.

    llama.cpp's schema-to-grammar converter defaults ``additionalProperties`` to false
    (grammars/README.md): otherwise a model may invent keys without end.
    """
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k in ("items", "anyOf", "oneOf", "allOf", "prefixItems", "not") else v
           for k, v in schema.items()}
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(schema.get(key), dict):
            out[key] = {k: closed(v) for k, v in schema[key].items()}
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` closed (:func:`closed`) with llguidance's ``x-guidance`` layout options (a model
    cannot pad JSON with whitespace)."""
    return {**closed(schema), "x-guidance": {**STRICT_JSON, **(schema.get("x-guidance") or {})}}


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def call_grammar(fmt: str, functions: list[dict[str, Any]], *, name: str | None = None, parallel: bool = False,
                 special_id: Callable[[str], int | None] = lambda s: None, thought: bool = False,
                 ) -> tuple[str, Any]:
    """(grammar kind, source) forcing one call (several with ``parallel``) in ``fmt``'s syntax.

    Args:
        fmt: a format of :mod:`cooktop.text.tool_calls`.
        functions: from :func:`check_tools`; name: only that function.
        special_id: the id of a marker that is one special token in the vocabulary (then the
            grammar asks for that token, not its spelling), else None.
        thought: Gemma 4: a ``<|channel>thought ... <channel|>`` channel may come before the call
            (llama.cpp's grammar allows it always; here only when the template was asked to think,
            since otherwise its prompt has closed an empty channel already).
    Returns:
        ``("lark", text)`` or, for ``generic``, ``("json_schema", schema)``.
    """
    fns = [f for f in functions if name is None or f["name"] == name]
    if fmt == "generic":
        return "json_schema", generic_schema(fns, parallel=parallel, allow_response=False)

    def lit(text: str) -> str:
        tid = special_id(text)
        return f"<[{tid}]>" if tid is not None else _q(text)

    rules, alts = [], []
    for i, f in enumerate(fns):
        if fmt != "gemma4":  # Gemma 4's arguments are its own syntax, not JSON
            rules.append(f"args_{i}: %json {json.dumps(strict_schema(f['parameters']), ensure_ascii=False)}")
        n = f["name"]
        head = '{"name": ' + json.dumps(n, ensure_ascii=False) + ", "
        if fmt == "hermes":
            pre, post = "\n" + head + '"arguments": ', "}\n"
            body = f'{lit("<tool_call>")} {_q(pre)} args_{i} {_q(post)} {lit("</tool_call>")}'
        elif fmt == "llama3":
            pre = head + '"parameters": '
            body = f'{_q(pre)} args_{i} "}}"'
        elif fmt == "mistral":
            pre, mid, post = head + '"arguments": ', ', "id": "', '"}'
            body = f'{_q(pre)} args_{i} {_q(mid)} CALL_ID {_q(post)}'
        elif fmt == "qwen3-coder":
            rules.extend(_xml_param_rules(i, f["parameters"]))
            body = (f'{lit("<tool_call>")} {_q(chr(10) + "<function=" + n + ">" + chr(10))} params_{i} '
                    f'{_q("</function>" + chr(10))} {lit("</tool_call>")}')
        elif fmt == "gemma4":
            rules.extend(_gemma4_arg_rules(i, f["parameters"], lit))
            body = f'{lit("<|tool_call>")} {_q("call:" + n)} g4_args_{i} {lit("<tool_call|>")}'
        elif fmt == "gpt-oss":
            body = (f'{lit("<|channel|>")} {_q("commentary to=functions." + n + " ")} {lit("<|constrain|>")} '
                    f'"json" {lit("<|message|>")} args_{i} {lit("<|call|>")}')
        else:
            raise ToolCallError(f"no call grammar for the tool-call format {fmt!r}")
        rules.append(f"call_{i}: {body}")
        alts.append(f"call_{i}")
    rules.append("call: " + " | ".join(alts))
    if fmt == "gemma4":
        rules.extend(_gemma4_value_rules(lit))
    if fmt == "mistral":
        rules.append("CALL_ID: /[a-zA-Z0-9]{9}/")
        more = ' (", " call)*' if parallel else ""
        start = f'start: {lit("[TOOL_CALLS]")} "[" call{more} "]"'
    elif fmt in ("hermes", "qwen3-coder") and parallel:
        start = 'start: call ("\\n" call)*'
    elif fmt == "gemma4":
        start = "start: " + ("g4_thought? " if thought else "") + ("call+" if parallel else "call")
    elif fmt == "llama3" and parallel:
        start = 'start: call ("; " call)*'
    else:
        start = "start: call"
    return "lark", "\n".join([start, *rules]) + "\n"


def _gemma4_arg_rules(i: int, schema: dict[str, Any], lit: Callable[[str], str]) -> list[str]:
    """Rule ``g4_args_i``: the dict of a Gemma 4 call to a tool with parameters ``schema``: its properties
    in their order as ``key:value`` (required ones always, the others optional), comma-separated; a
    string, integer, number, boolean or string-enum property's value of that type, another's any Gemma 4
    value. No properties: any dict (``g4_dict``). llama.cpp's Gemma 4 grammar takes any dict."""
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return [f"g4_args_{i}: g4_dict"]
    required = set(schema.get("required") or ())
    quote = lit('<|"|>')
    rules = []
    for k, (key, sub) in enumerate(props.items()):
        sub = sub if isinstance(sub, dict) else {}
        enum = sub.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            value = "(" + " | ".join(f"{quote} {_q(v)} {quote}" for v in enum) + ")"
        else:
            kind = sub.get("type")
            value = {"string": "g4_string", "integer": "G4_INT", "number": "G4_NUMBER",
                     "boolean": '("true" | "false")'}.get(kind if isinstance(kind, str) else "", "g4_value")
        rules.append(f"g4_m_{i}_{k}: {_q(key + ':')} {value}")
    n = len(props)
    for k, key in enumerate(props):  # first_k: nothing written yet; rest_k: a member written before
        opt = key not in required
        nxt_first, nxt_rest = (f"g4_first_{i}_{k + 1}", f"g4_rest_{i}_{k + 1}") if k + 1 < n else ('""', '""')
        rules.append(f"g4_first_{i}_{k}: g4_m_{i}_{k} {nxt_rest}" + (f" | {nxt_first}" if opt else ""))
        rules.append(f'g4_rest_{i}_{k}: ' + (f'("," g4_m_{i}_{k})? {nxt_rest}' if opt
                                            else f'"," g4_m_{i}_{k} {nxt_rest}'))
    rules.append(f'g4_args_{i}: "{{" g4_first_{i}_0 "}}"')
    return rules


def _gemma4_value_rules(lit: Callable[[str], str]) -> list[str]:
    """Rules of Gemma 4's value syntax, ``g4_dict`` and what it holds: ``<|"|>text<|"|>`` strings,
    JSON numbers and literals, ``[v,...]`` arrays, ``{key:v,...}`` dicts with identifier keys (llama.cpp
    common/parsers/gemma4.cpp; the values do not follow the tool's schema there either, only the
    top-level keys here are the tool's parameter names). A string's text is one lexeme: with ``<|"|>``
    a special token any text, else text without ``<|"|>`` in it."""
    quote, open_, close = lit('<|"|>'), lit("<|channel>"), lit("<channel|>")
    if close.startswith("<["):  # the channel's close a special token: any text before it
        thought = [f'g4_thought: {open_} "thought" G4_THOUGHT_TEXT {close}', r"G4_THOUGHT_TEXT: /(.|\n)*/"]
    else:  # one lexeme, close included (as the strings below)
        thought = ["g4_thought: G4_THOUGHT",
                   "G4_THOUGHT: /" + _lark_escape("<|channel>thought") + _without("<channel|>")
                   + _lark_escape("<channel|>") + "/"]
    if quote.startswith("<["):  # a special token: the text between is any text
        string = [f"g4_string: {quote} G4_TEXT {quote}", r"G4_TEXT: /(.|\n)*/"]
    else:  # one lexeme, quotes included (a longest match would otherwise run into the closing quote)
        string = ["g4_string: G4_STRING",
                  r'G4_STRING: /<\|"\|>([^<]|<[^|]|<\|[^"]|<\|"[^|]|<\|"\|[^>])*<\|"\|>/']
    return [
        'g4_dict: "{" (g4_kv ("," g4_kv)*)? "}"',
        'g4_kv: G4_KEY ":" g4_value',
        'g4_array: "[" (g4_value ("," g4_value)*)? "]"',
        'g4_value: g4_string | g4_dict | g4_array | G4_NUMBER | "true" | "false" | "null"',
        r"G4_KEY: /[A-Za-z_][A-Za-z0-9_.\-]*/",
        # digits bounded as llama.cpp's json-schema-to-grammar bounds them (integral-part, decimal-part)
        r"G4_NUMBER: /-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?/",
        r"G4_INT: /-?(0|[1-9][0-9]{0,15})/",
        *string,
        *thought,
    ]


def _lark_escape(text: str) -> str:
    """``text`` as a literal inside a Lark ``/regex/``."""
    return "".join("\\" + c if c in "\\/|()[]{}.*+?^$-" else c for c in text)


def _without(marker: str) -> str:
    """A regex (Lark) of any text in which ``marker`` does not occur, and that ends with no proper prefix of it
    (so that ``marker`` can follow): each position is a character other than the marker's next one."""
    alts = []
    for k in range(len(marker)):
        c = marker[k]
        cls = "\\" + c if c in "\\]^-[" else c
        alts.append(_lark_escape(marker[:k]) + "[^" + cls + "]")
    return "(" + "|".join(alts) + ")*"


def _xml_param_rules(i: int, schema: dict[str, Any]) -> list[str]:
    """Rules ``params_i`` of a Qwen3-Coder call: each property of ``schema`` in its order as
    ``<parameter=KEY>\nVALUE\n</parameter>\n`` (required ones always, the others optional); a string
    property's value is text without ``<`` (one lexeme with its closing tag: a lexer's longest match
    would otherwise take the newline before it), another's ``%json`` of its schema (llama.cpp's grammar for
    this format asks for the same layout, common/chat.cpp)."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    rules, seq = [], []
    for k, (key, sub) in enumerate(props.items()):
        sub = sub if isinstance(sub, dict) else {}
        close = _q(chr(10) + "</parameter>" + chr(10))
        value = ("XML_TEXT_CLOSE" if sub.get("type") == "string"  # one lexeme: the text runs to the first '<'
                 else f"%json {json.dumps(strict_schema(sub), ensure_ascii=False)} {close}")
        rules.append(f"param_{i}_{k}: {_q('<parameter=' + key + '>' + chr(10))} {value}")
        seq.append(f"param_{i}_{k}" + ("" if key in required else "?"))
    rules.append(f"params_{i}: " + (" ".join(seq) if seq else '""'))
    if i == 0:
        rules.append(r"XML_TEXT_CLOSE: /[^<]*\n<\/parameter>\n/")
    return rules


def generic_schema(functions: list[dict[str, Any]], *, parallel: bool, allow_response: bool) -> dict[str, Any]:
    """The JSON schema of llama.cpp's generic format: ``tool_call`` / ``tool_calls`` / ``response``."""
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for f in functions]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    shape: dict[str, Any] = ({"type": "object", "properties": {"tool_calls": {"type": "array", "items": call,
                                                                              "minItems": 1}},
                              "required": ["tool_calls"], "additionalProperties": False} if parallel else
                             {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"],
                              "additionalProperties": False})
    if not allow_response:
        return strict_schema(shape)
    response = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                "additionalProperties": False}
    return {"x-guidance": STRICT_JSON, "anyOf": [shape, response]}


def generic_system_text(functions: list[dict[str, Any]], schema: dict[str, Any]) -> str:
    """The system text of the generic format (what the answer must look like, the tools)."""
    return ("Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply "
            "to the user's request. The tools you may call:\n"
            + "\n".join(json.dumps({"name": f["name"], "description": f.get("description", ""),
                                    "parameters": f["parameters"]}, ensure_ascii=False) for f in functions)
            + "\nThe answer must follow this JSON schema:\n" + json.dumps(schema, ensure_ascii=False))


def template_messages(messages: list[dict[str, Any]], fmt: str, system_text: str | None = None,
                      ) -> list[dict[str, Any]]:
    """Messages as the templates read them: tool-call arguments as objects, not JSON text, and
    an assistant's null content beside its calls as ``""``.

    llama.cpp passes ``arguments`` parsed (``func_args_not_string``), since the templates
    write them with ``tojson``. The ``generic`` format turns an assistant's calls into its
    JSON answer, and ``system_text`` (its tool description) joins or becomes the system message.

    Raises:
        ToolCallError: ``tool_calls`` that are not a list of ``{"function": {"name", "arguments"}}``,
            or arguments that are not JSON.
    """
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ToolCallError(f"messages[{i}].tool_calls must be a list")
            fixed = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise ToolCallError(f"messages[{i}].tool_calls[{j}] must have function.name")
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise ToolCallError(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON: "
                                            f"{args[:60]!r}") from None
                fixed.append({**c, "type": c.get("type", "function"), "function": {**fn, "arguments": args}})
            m = {**m, "tool_calls": fixed}
            if m.get("content") is None:  # llama.cpp requires_non_null_content: templates test `in content`
                m["content"] = ""
            if fmt == "generic":
                answer = ({"tool_call": {"name": fixed[0]["function"]["name"],
                                         "arguments": fixed[0]["function"]["arguments"]}} if len(fixed) == 1 else
                          {"tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                          for c in fixed]})
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                m["content"] = json.dumps(answer, ensure_ascii=False)
        out.append(m)
    if system_text:
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + system_text}
        else:
            out.insert(0, {"role": "system", "content": system_text})
    return out
