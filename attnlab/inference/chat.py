"""Chat prompts: render a list of {"role", "content"} messages with the model's chat template.

Chat models are trained on one exact layout (SmolLM2 uses ChatML: `<|im_start|>user\\n...<|im_end|>`);
the template that writes it ships with the model (GGUF metadata `tokenizer.chat_template`, or
`chat_template` in tokenizer_config.json) as a Jinja2 program, which we run in Jinja2's sandbox since
it comes from a file.
"""
from __future__ import annotations

from typing import Sequence


def apply_chat_template(tokenizer, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(f"{getattr(tokenizer, 'name', '') or 'this tokenizer'} has no chat template; "
                         "use a plain prompt instead of --chat")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {m!r}")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    specials = getattr(tokenizer, "special_tokens", {})
    return env.from_string(template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                            bos_token=specials.get("bos_token", ""),
                                            eos_token=specials.get("eos_token", ""))
