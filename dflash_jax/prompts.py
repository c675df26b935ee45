"""Prompt formats shared by the benchmark prompt sets and the embedded model's corpus.

The benchmark formats are the DFlash paper's (``MATH_SUFFIX``, ``HUMANEVAL_FORMAT``; mbpp and
mt-bench prompts are used as they are); the chat
format is the embedded model's (``<|user|>`` / ``<|assistant|>`` turns, ``<|endoftext|>`` after
each answer). Targets with their own chat template use theirs (``encode_prompt``), with Qwen3's
thinking switch off unless asked for (the DFlash reference's benchmark setting).
"""

from __future__ import annotations

import re

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_FORMAT = ("Write a solution to the following problem and make sure that it passes the "
                    "tests:\n```python\n{prompt}\n```")

EOT, MASK, USER, ASSISTANT = "<|endoftext|>", "<|mask|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [EOT, MASK, USER, ASSISTANT]
PLAIN_FORMAT = "User: {prompt}\nAssistant:"  # for a tokenizer without a chat template

# Jinja template equal to :func:`render_chat` (what AutoTokenizer.apply_chat_template uses).
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ '<|user|>\\n' + m['content'] + '\\n' }}"
    "{% else %}{{ '<|assistant|>\\n' + m['content'] + '<|endoftext|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


def math_prompt(question: str) -> str:
    return question.strip() + MATH_SUFFIX


def humaneval_prompt(code_prompt: str) -> str:
    return HUMANEVAL_FORMAT.format(prompt=code_prompt.strip("\n"))


def render_chat(turns, add_generation_prompt: bool = True) -> str:
    """The embedded model's chat format as text (same as its tokenizer's chat template)."""
    out = []
    for t in turns:
        if t["role"] == "user":
            out.append(f"{USER}\n{t['content']}\n")
        else:
            out.append(f"{ASSISTANT}\n{t['content']}{EOT}\n")
    if add_generation_prompt:
        out.append(f"{ASSISTANT}\n")
    return "".join(out)


_CALC = re.compile(r"<<[^>]*>>")


def gsm8k_solution(answer: str) -> str:
    """A GSM8K reference answer as a step-by-step solution ending in ``\\boxed{}``:
    calculator annotations removed, ``#### N`` turned into the boxed final answer."""
    body, _, final = answer.rpartition("####")
    if not _:
        body, final = answer, ""
    body = _CALC.sub("", body).strip()
    final = final.strip()
    return f"{body}\nThe final answer is \\boxed{{{final}}}." if final else body


def has_thinking_switch(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads ``enable_thinking`` (Qwen3's thinking switch)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates
        template = " ".join(str(t) for t in template.values())
    return bool(template) and "enable_thinking" in template


def encode_prompt(prompt, tokenizer, *, enable_thinking: bool = False) -> list[int]:
    """Token ids of one prompt: chat template when the tokenizer has one, else a plain format.

    ``enable_thinking`` is passed to the chat template (Qwen3's thinking switch). The default,
    False, is the DFlash reference's benchmark setting (its drafters were not trained on
    thinking traces): a Qwen3 template then ends the prompt with an empty ``<think>`` block
    after the assistant header. Templates without the switch ignore it (jinja leaves unknown
    variables unused), so their prompts are the same either way.
    """
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return prompt
    if tokenizer is None:
        raise ValueError("text prompts need a tokenizer in the target directory; "
                         "or give prompts as {\"prompt_ids\": [...]}")
    turns = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True,
                                            enable_thinking=bool(enable_thinking))
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    text = "\n".join(PLAIN_FORMAT.format(prompt=t["content"]) if t["role"] == "user" else str(t["content"])
                     for t in turns)
    return tokenizer.encode(text)
