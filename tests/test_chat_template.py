"""Chat templates: transformers' renderings of real templates, llama.cpp's named formats, the sandbox."""

from __future__ import annotations

import datetime
import json
import os
import pathlib

import pytest

from cooktop.errors import ChatTemplateError, CooktopError
from cooktop.text.chat_template import (
    CHAT_FORMATS,
    ChatTemplate,
    chat_format_names,
    resolve_template,
    strip_added_specials,
)

# Same location rule as tests/conftest.py; only used to enumerate cases at
# collection time. Every test still requests the ``shared`` fixture, which skips
# (or fails under COOKTOP_REQUIRE=shared) when the data is absent.
_SHARED = pathlib.Path(os.environ.get("COOKTOP_SHARED", pathlib.Path(__file__).resolve().parents[2] / "shared"))
_EXPECTED = _SHARED / "templates" / "expected.json"


def _clock() -> datetime.datetime:
    """The renderer's clock of expected.json (its README): 2024-07-26 12:00."""
    return datetime.datetime(2024, 7, 26, 12, 0)


def _cases() -> list:
    try:
        cases = json.loads(_EXPECTED.read_text(encoding="utf-8"))["cases"]
    except OSError:
        return [pytest.param(None, id="no-template-data")]
    return [pytest.param(c, id=f"{c['template'].removesuffix('.jinja')}-{c['conversation']}-"
                               f"{'gen' if c['add_generation_prompt'] else 'nogen'}") for c in cases]


def _template(shared, case) -> ChatTemplate:
    source = (shared / "templates" / case["template"]).read_text(encoding="utf-8")
    return ChatTemplate(source, case["bos_token"], case["eos_token"], name=case["template"], clock=_clock)


# --------------------------------------------------------------------------------------
# expected.json: transformers' renderings, byte for byte
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", _cases())
def test_expected_rendering(shared, case):
    if case is None:
        pytest.skip("no templates/expected.json")
    tmpl = _template(shared, case)
    kwargs = {"add_generation_prompt": case["add_generation_prompt"], "date_string": case["date_string"]}
    if "error" in case:
        with pytest.raises(ChatTemplateError) as err:
            tmpl.render(case["messages"], **kwargs)
        msg = str(err.value)
        assert msg.startswith(f"{case['template']} refused the conversation: ")
        assert len(msg) > len(f"{case['template']} refused the conversation: ") + 5
    else:
        assert tmpl.render(case["messages"], **kwargs) == case["expected"]


def test_expected_covers_every_template(shared):
    """All 88 cases, every template in the folder, and the error cases are Gemma 2's system refusals."""
    data = json.loads(_EXPECTED.read_text(encoding="utf-8"))
    cases = data["cases"]
    assert data["renderer"] == "transformers.render_jinja_template"
    assert len(cases) == 88
    assert {c["template"] for c in cases} == {p.name for p in (shared / "templates").glob("*.jinja")}
    errors = [(c["template"], c["conversation"]) for c in cases if "error" in c]
    assert sorted(set(errors)) == [("google-gemma-2-2b-it.jinja", "multi_turn"),
                                   ("google-gemma-2-2b-it.jinja", "system_user")]


def test_gemma2_error_message_is_the_templates(shared):
    case = next(c for c in json.loads(_EXPECTED.read_text(encoding="utf-8"))["cases"] if "error" in c)
    with pytest.raises(ChatTemplateError) as err:
        _template(shared, case).render(case["messages"])
    assert str(err.value) == "google-gemma-2-2b-it.jinja refused the conversation: System role not supported"
    assert isinstance(err.value, CooktopError)


def test_model_template_stop_strings(shared):
    def stop(name):
        return ChatTemplate((shared / "templates" / name).read_text(encoding="utf-8"), "<s>", "</s>").stop

    assert stop("Qwen-Qwen2.5-7B-Instruct.jinja") == ("<|im_end|>", "</s>")
    assert stop("meta-llama-Llama-3.1-8B-Instruct.jinja") == ("<|eot_id|>", "<|eom_id|>", "</s>")
    assert stop("google-gemma-2-2b-it.jinja") == ("<end_of_turn>", "</s>")
    assert stop("microsoft-Phi-3.5-mini-instruct.jinja") == ("<|end|>", "</s>")
    # gpt-oss: <|end|> only closes a channel; the turn ends at <|return|> or <|call|>
    assert stop("openai-gpt-oss-120b.jinja") == ("<|return|>", "<|call|>", "</s>")
    assert stop("mistralai-Mistral-Nemo-Instruct-2407.jinja") == ("</s>",)


def test_extra_variables_reach_the_template(shared):
    source = (shared / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text(encoding="utf-8")
    tmpl = ChatTemplate(source, "<s>", "</s>", clock=_clock)
    msgs = [{"role": "user", "content": "Hi"}]
    assert "Today Date: 01 Jan 2025\n" in tmpl.render(msgs, date_string="01 Jan 2025")
    assert tmpl.render(msgs, bos_token="<|begin_of_text|>").startswith("<|begin_of_text|><|start_header_id|>")


# --------------------------------------------------------------------------------------
# Named formats
# --------------------------------------------------------------------------------------

# The conversation of llama.cpp tests/test-chat-template.cpp (main_automated_tests).
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]

# Expected outputs of llama.cpp tests/test-chat-template.cpp for the template it
# detects as each format (llm_chat_apply_template, add_generation_prompt=true).
LLAMA_CPP_EXPECTED = {
    "chatml": "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
              "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
              "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question"
              "<|im_end|>\n<|im_start|>assistant\n",
    "llama2": "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an "
              "assistant   </s>[INST] Another question [/INST]",
    "llama2-sys-bos": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] "
                      "Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]",
    "llama2-sys-strip": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] "
                        "Who are you [/INST]I am an assistant</s>[INST] Another question [/INST]",
    "monarch": "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\n"
               "Who are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n"
               "<s>assistant\n",
    "gemma": "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there"
             "<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant"
             "<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
    "orion": "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\n"
             "Assistant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>",
    "openchat": "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct "
                "Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct "
                "Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question"
                "<|end_of_turn|>GPT4 Correct Assistant:",
    "deepseek": "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n"
                "### Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n"
                "### Instruction:\nAnother question\n### Response:\n",
    "vicuna": "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\n"
              "ASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    "vicuna-orca": "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\n"
                   "ASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                 "<|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you"
                 "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|>"
                 "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                 "<|CHATBOT_TOKEN|>",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>"
              "user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there"
              "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>"
              "assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>"
              "\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "phi3": "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
            "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question"
            "<|end|>\n<|assistant|>\n",
    "chatglm3": "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n "
                "Who are you<|assistant|>\n    I am an assistant   <|user|>\n Another question<|assistant|>",
    "chatglm4": "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\n"
                "Who are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>\n",
    "deepseek2": "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<\uff5cend\u2581of\u2581sentence"
                 "\uff5c>User: Who are you\n\nAssistant:    I am an assistant   <\uff5cend\u2581of\u2581sentence\uff5c>"
                 "User: Another question\n\nAssistant:",
    "granite": "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>"
               "user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there"
               "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>"
               "assistant<|end_of_role|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>"
               "Another question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
    "mistral-v1": " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    "
                  "I am an assistant   </s> [INST] Another question [/INST]",
    "mistral-v3": "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an "
                  "assistant</s>[INST] Another question[/INST]",
    "mistral-v3-tekken": "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I "
                         "am an assistant   </s>[INST]Another question[/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] "
                  "Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]",
    "megrez": "<|role_start|>system<|role_end|>You are a helpful assistant<|turn_end|><|role_start|>user<|role_end|>"
              "Hello<|turn_end|><|role_start|>assistant<|role_end|>Hi there<|turn_end|><|role_start|>user<|role_end|>"
              "Who are you<|turn_end|><|role_start|>assistant<|role_end|>   I am an assistant   <|turn_end|>"
              "<|role_start|>user<|role_end|>Another question<|turn_end|><|role_start|>assistant<|role_end|>",
    "phi4": "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello"
            "<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you"
            "<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>"
            "Another question<|im_end|><|im_start|>assistant<|im_sep|>",
}

# Formats llama.cpp's test does not exercise: the text its llm_chat_apply_template
# (src/llama-chat.cpp) writes for CONVERSATION, read off that code.
LLAMA_CPP_CODE_EXPECTED = {
    "llama2-sys": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are "
                  "you [/INST]   I am an assistant   </s>[INST] Another question [/INST]",
    "mistral-v7-tekken": "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>"
                         "[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]",
    "zephyr": "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\n"
              "Hi there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   "
              "<|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n",
    "falcon3": "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there\n<|user|>\n"
               "Who are you\n<|assistant|>\n   I am an assistant   \n<|user|>\nAnother question\n<|assistant|>\n",
    "deepseek3": "You are a helpful assistant\n\n<\uff5cUser\uff5c>Hello<\uff5cAssistant\uff5c>Hi there"
                 "<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>Who are you<\uff5cAssistant\uff5c>   I am "
                 "an assistant   <\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>Another question"
                 "<\uff5cAssistant\uff5c>",
    "llama4": "<|header_start|>system<|header_end|>\n\nYou are a helpful assistant<|eot|><|header_start|>user"
              "<|header_end|>\n\nHello<|eot|><|header_start|>assistant<|header_end|>\n\nHi there<|eot|>"
              "<|header_start|>user<|header_end|>\n\nWho are you<|eot|><|header_start|>assistant<|header_end|>\n\n"
              "I am an assistant<|eot|><|header_start|>user<|header_end|>\n\nAnother question<|eot|>"
              "<|header_start|>assistant<|header_end|>\n\n",
    "exaone3": "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there[|endofturn|]\n"
               "[|user|]Who are you\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]Another question\n"
               "[|assistant|]",
}


@pytest.mark.parametrize("name", sorted({**LLAMA_CPP_EXPECTED, **LLAMA_CPP_CODE_EXPECTED}))
def test_named_format_matches_llama_cpp(name):
    expected = {**LLAMA_CPP_EXPECTED, **LLAMA_CPP_CODE_EXPECTED}[name]
    tmpl = ChatTemplate.from_format(name, "<s>", "</s>")
    assert tmpl.render(CONVERSATION) == expected
    assert tmpl.chat_format == name
    assert CHAT_FORMATS[name].reference == "llama.cpp src/llama-chat.cpp"


def test_every_llama_cpp_format_has_a_reference_rendering():
    llama_cpp = {n for n, f in CHAT_FORMATS.items() if f.reference.startswith("llama.cpp")}
    assert llama_cpp == set(LLAMA_CPP_EXPECTED) | set(LLAMA_CPP_CODE_EXPECTED)


TWO_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def test_llama_cpp_python_only_formats():
    """qwen and alpaca: the text of llama-cpp-python's format_qwen / format_alpaca."""
    qwen = ChatTemplate.from_format("qwen")
    assert qwen.render(TWO_TURNS) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
        "<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    # no system message: Qwen's default one
    assert qwen.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert qwen.stop == ("<|im_end|>", "<|endoftext|>")
    alpaca = ChatTemplate.from_format("alpaca")
    assert alpaca.render(TWO_TURNS, add_generation_prompt=False) == (
        "Be brief.\n\n### Instruction: Hi\n\n### Response: Hello!</s>### Instruction: Bye\n\n")
    assert alpaca.render(TWO_TURNS) == (
        "Be brief.\n\n### Instruction: Hi\n\n### Response: Hello!</s>### Instruction: Bye\n\n### Response:")


def test_llama_cpp_python_aliases():
    """llama-cpp-python's names give its text where its formatter is sound (no stray spaces)."""
    msgs = [{"role": "user", "content": "Instruction"}, {"role": "assistant", "content": "Model answer"},
            {"role": "user", "content": "Follow-up instruction"}]
    # llama-cpp-python tests/test_llama_chat_format.py::test_mistral_instruct (its reference less the BOS)
    assert ChatTemplate.from_format("mistral-instruct").render(msgs) == (
        "[INST] Instruction [/INST]Model answer</s>[INST] Follow-up instruction [/INST]")
    # format_llama3
    assert ChatTemplate.from_format("llama-3").render(msgs[:1]) == (
        "<|start_header_id|>user<|end_header_id|>\n\nInstruction<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    # format_chatml with a system message, format_gemma without one
    assert ChatTemplate.from_format("chatml").render(TWO_TURNS[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert ChatTemplate.from_format("gemma").render(msgs[:1]) == (
        "<start_of_turn>user\nInstruction<end_of_turn>\n<start_of_turn>model\n")
    assert ChatTemplate.from_format("llama-2").chat_format == "llama2-sys-bos"
    assert ChatTemplate.from_format("phi-3").chat_format == "phi3"
    assert ChatTemplate.from_format("llama-2").name == "chat format 'llama-2 = llama2-sys-bos'"


def test_named_format_stop_strings():
    assert ChatTemplate.from_format("chatml", "<s>", "</s>").stop == ("<|im_end|>", "</s>")
    assert ChatTemplate.from_format("llama3", "<|begin_of_text|>", "<|eot_id|>").stop == ("<|eot_id|>",)
    assert ChatTemplate.from_format("gemma").stop == ("<end_of_turn>",)
    assert ChatTemplate.from_format("phi3", "", "<|endoftext|>").stop == ("<|end|>", "<|endoftext|>")


def test_named_format_generation_prompt_and_content_parts():
    chatml = ChatTemplate.from_format("chatml")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": None}]
    # text parts joined by a newline, None as empty (llama.cpp's legacy formatter)
    assert chatml.render(msgs, add_generation_prompt=False) == (
        "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\['content'\] must be a string"):
        chatml.render([{"role": "user", "content": 42}])
    # an image part is refused, never silently dropped (llama-server without a vision model)
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\['content'\] has a 'image_url' part: this model "
                                                r"reads text only"):
        chatml.render([{"role": "user", "content": [{"type": "text", "text": "x"},
                                                    {"type": "image_url", "image_url": {"url": "data:,"}}]}])


def test_format_trim_is_llama_cpps():
    """llama.cpp trims ASCII whitespace only; a no-break space stays."""
    out = ChatTemplate.from_format("llama3").render([{"role": "user", "content": "\t x\u00a0\n"}],
                                                    add_generation_prompt=False)
    assert out == "<|start_header_id|>user<|end_header_id|>\n\nx\u00a0<|eot_id|>"


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(ChatTemplateError) as err:
        ChatTemplate.from_format("llama-9")
    msg = str(err.value)
    assert msg.startswith("unknown chat format 'llama-9'; known formats: alpaca, chatglm3, chatglm4, chatml,")
    assert "llama-2=llama2-sys-bos" in msg and "mistral-instruct=llama2" in msg
    for name in CHAT_FORMATS:
        assert name in msg
    with pytest.raises(ChatTemplateError, match="unknown chat format 'llama-9'"):
        resolve_template("{{ x }}", chat_format="llama-9")
    with pytest.raises(ChatTemplateError, match="unknown chat format 'llama-9'"):
        resolve_template(None, chat_template="llama-9")


def test_chat_format_names():
    names = chat_format_names()
    assert names == sorted(names)
    for name in ("chatml", "llama-2", "llama2", "llama-3", "llama3", "mistral-instruct", "gemma", "phi-3", "phi3",
                 "zephyr", "vicuna", "alpaca", "qwen", "openchat"):
        assert name in names


# --------------------------------------------------------------------------------------
# resolve_template
# --------------------------------------------------------------------------------------


def test_fallback_is_chatml_with_a_notice():
    for missing in (None, ""):
        choice = resolve_template(missing, bos_token="<s>", eos_token="</s>")
        assert choice.template.chat_format == "chatml"
        assert choice.notice == (
            "the model has no chat template (tokenizer.chat_template); using 'chatml', as llama.cpp does "
            "(llama-cpp-python would use 'llama-2'); choose another with chat_format= or --chat-template")
        # llama.cpp common/chat.cpp CHATML_TEMPLATE_SRC
        assert choice.template.render([{"role": "user", "content": "Hi"}]) == (
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_model_template_wins_without_options():
    choice = resolve_template("{{ bos_token }}{{ messages[0].content }}", bos_token="<s>", eos_token="</s>")
    assert choice.notice is None and choice.tool_use is None
    assert choice.template.name == "the model's chat template (tokenizer.chat_template)"
    assert choice.template.render([{"role": "user", "content": "x"}]) == "<s>x"
    assert choice.template.chat_format is None
    assert choice.for_request([{"type": "function"}]) is choice.template


def test_tool_use_template():
    # alone: used for everything, with a notice
    choice = resolve_template(None, tool_use_template="T{{ messages | length }}")
    assert choice.template.render([{"role": "user", "content": "x"}]) == "T1"
    assert choice.notice == "the model has no default chat template; using its tool_use template, as llama.cpp does"
    # beside the default one: for requests with tools only (llama.cpp)
    choice = resolve_template("D", tool_use_template="T")
    assert choice.notice is None
    assert choice.for_request(None).render([]) == "D"
    assert choice.for_request([]).render([]) == "D"
    assert choice.for_request([{"type": "function", "function": {"name": "f"}}]).render([]) == "T"
    assert choice.tool_use.name == "the model's tool-use chat template (tokenizer.chat_template.tool_use)"
    # an explicit choice replaces both
    assert resolve_template("D", tool_use_template="T", chat_format="chatml").tool_use is None


def test_options_override_the_model_template(tmp_path):
    model = "MODEL"
    assert resolve_template(model, chat_format="gemma").template.chat_format == "gemma"
    assert resolve_template(model, chat_template="llama3").template.chat_format == "llama3"
    choice = resolve_template(model, chat_template="{{ 'OVR ' + messages[0].content }}")
    assert choice.template.render([{"role": "user", "content": "x"}]) == "OVR x"
    assert choice.template.name == "--chat-template" and choice.notice is None
    path = tmp_path / "t.jinja"
    path.write_text("FILE {{ messages[0]['content'] }}", encoding="utf-8")
    choice = resolve_template(model, chat_template_file=path)
    assert choice.template.render([{"role": "user", "content": "x"}]) == "FILE x"
    assert choice.template.name == f"chat template file {path}"


def test_resolver_errors(tmp_path):
    with pytest.raises(ChatTemplateError, match="give only one of chat_format, chat_template, chat_template_file"):
        resolve_template(None, chat_format="chatml", chat_template="chatml")
    with pytest.raises(ChatTemplateError, match="cannot read chat template file .*missing.jinja"):
        resolve_template(None, chat_template_file=tmp_path / "missing.jinja")
    (tmp_path / "empty.jinja").write_text("  \n", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="chat template file .*empty.jinja is empty"):
        resolve_template(None, chat_template_file=tmp_path / "empty.jinja")
    with pytest.raises(ChatTemplateError, match="--chat-template is empty"):
        resolve_template(None, chat_template=" ")


# --------------------------------------------------------------------------------------
# Errors, sandbox, environment
# --------------------------------------------------------------------------------------


def test_compile_error_names_template_and_line():
    with pytest.raises(ChatTemplateError) as err:
        ChatTemplate("line one\n{% for m in messages %}{{ m.content }}", name="my template")
    assert str(err.value) == ("my template does not compile (template line 2): Unexpected end of template. Jinja "
                              "was looking for the following tags: 'endfor' or 'else'. The innermost block that "
                              "needs to be closed is 'for'.")
    with pytest.raises(ChatTemplateError) as err:
        ChatTemplate("{{ messages | nosuchfilter }}", name="my template")
    assert str(err.value) == "my template does not compile (template line 1): No filter named 'nosuchfilter'."


def test_raise_exception_and_undefined():
    tmpl = ChatTemplate("{% if messages[0].role == 'system' %}\n{{ raise_exception('no system: ' + "
                        "messages[0].content) }}{% endif %}{{ messages[0].meta.deep }}", name="T")
    with pytest.raises(ChatTemplateError) as err:
        tmpl.render([{"role": "system", "content": "x"}])
    assert str(err.value) == "T refused the conversation: no system: x"
    with pytest.raises(ChatTemplateError) as err:
        tmpl.render([{"role": "user", "content": "x"}])
    assert str(err.value) == "T failed (template line 2): 'dict object' has no attribute 'meta'"


def test_type_error_in_template_is_a_template_error():
    tmpl = ChatTemplate("{{ 'a' + messages[0].count }}", name="T")
    with pytest.raises(ChatTemplateError, match=r"^T failed \(template line 1\): TypeError: "):
        tmpl.render([{"role": "user", "content": "x", "count": 3}])


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__['os'] }}",
    "{{ cycler.__init__.__globals__.os.popen('echo pwned').read() }}",
    "{% set x = messages.append({'role': 'evil'}) %}{{ messages | length }}",
    "{% set x = messages[0].update({'content': 'evil'}) %}{{ messages[0].content }}",
])
def test_sandbox_blocks_escapes(source):
    msgs = [{"role": "user", "content": "hi"}]
    tmpl = ChatTemplate(source, name="evil template")
    with pytest.raises(ChatTemplateError) as err:
        tmpl.render(msgs)
    msg = str(err.value)
    assert msg.startswith("evil template failed (template line 1): blocked by the sandbox: access to attribute ")
    assert msg.endswith(" is unsafe.")
    assert msgs == [{"role": "user", "content": "hi"}]


def test_tojson_keeps_non_ascii_and_html():
    tmpl = ChatTemplate("{{ messages[0] | tojson }}|{{ tools | tojson(indent=2) }}|"
                        "{{ messages[0].content | tojson(ensure_ascii=True) }}")
    msg = {"role": "user", "content": "Grüße, 世界! 😀 <b>&amp;</b> 'q'"}
    out = tmpl.render([msg], tools=[{"a": ["é"]}])
    assert out == ('{"role": "user", "content": "Grüße, 世界! 😀 <b>&amp;</b> \'q\'"}|'
                   '[\n  {\n    "a": [\n      "é"\n    ]\n  }\n]|'
                   '"Gr\\u00fc\\u00dfe, \\u4e16\\u754c! \\ud83d\\ude00 <b>&amp;</b> \'q\'"')


def test_strftime_now_reads_the_clock():
    tmpl = ChatTemplate("{{ strftime_now('%Y-%m-%d %H:%M') }} {{ strftime_now('%d %b %Y') }}", clock=_clock)
    assert tmpl.render([]) == "2024-07-26 12:00 26 Jul 2024"
    before = datetime.datetime.now().strftime("%Y-%m-%d")
    out = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([])  # default clock: now
    assert out in {before, datetime.datetime.now().strftime("%Y-%m-%d")}


def test_transformers_environment_features():
    # trim_blocks / lstrip_blocks, loopcontrols, {% generation %}, tools/documents/add_generation_prompt passed
    tmpl = ChatTemplate(
        "{% for m in messages %}\n"
        "    {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "    {% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "{% generation %}[{{ m.role }}]{% endgeneration %}\n"
        "{% endfor %}\n"
        "{{ tools[0].name }}/{{ documents[0].title }}/{{ add_generation_prompt }}/{{ content_parts }}")
    msgs = [{"role": "skip"}, {"role": "user"}, {"role": "assistant"}]
    assert tmpl.render(msgs, tools=[{"name": "t"}], documents=[{"title": "d"}], content_parts="x") == (
        "[user]t/d/True/x")
    # list contents reach a model template untouched (transformers passes them through)
    parts = ChatTemplate("{% for p in messages[0].content %}{{ p.type }}:{{ p.text }};{% endfor %}")
    assert parts.render([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                     {"type": "text", "text": "b"}]}]) == "text:a;text:b;"
    assert ChatTemplate("{{ tools is none }}{{ documents is none }}").render([]) == "TrueTrue"


def test_bad_inputs_are_template_errors():
    tmpl = ChatTemplate("{{ messages | length }}", name="T")
    with pytest.raises(ChatTemplateError, match="messages must be a list of .* got str"):
        tmpl.render("hello")
    with pytest.raises(ChatTemplateError, match=r"messages\[1\] must be a dict"):
        tmpl.render([{"role": "user", "content": "a"}, "b"])
    with pytest.raises(ChatTemplateError, match="tools must be a list of JSON-schema tool dicts, got dict"):
        tmpl.render([], tools={"name": "t"})
    with pytest.raises(ChatTemplateError, match=r"documents\[0\] must be a dict"):
        tmpl.render([], documents=["text"])
    with pytest.raises(ChatTemplateError, match="T must be text, got bytes"):
        ChatTemplate(b"{{ x }}", name="T")


def test_strip_added_specials():
    assert strip_added_specials("<s>[INST] hi [/INST]", "<s>", "</s>", add_bos=True) == "[INST] hi [/INST]"
    assert strip_added_specials("<s>[INST] hi [/INST]", "<s>", "</s>", add_bos=False) == "<s>[INST] hi [/INST]"
    assert strip_added_specials("<s>x</s>", "<s>", "</s>", add_bos=True, add_eos=True) == "x"
    assert strip_added_specials("x", "", None, add_bos=True, add_eos=True) == "x"
