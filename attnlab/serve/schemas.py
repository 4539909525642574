"""Request bodies in the OpenAI shapes (a client library for that API works unchanged), validated by
pydantic so that a wrong type is a 422 naming the field rather than an error deep inside the model.
Unknown fields are ignored, as OpenAI does; `top_k`, `repetition_penalty` and `ignore_eos` are
extensions. Stop strings are bounded as OpenAI bounds them (at most 4), and in length, since every
generated token is checked against them."""
from __future__ import annotations

import json

from typing import Literal, Union

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr, field_validator

MAX_STOPS = 4          # stop strings per request (OpenAI's limit)
MAX_STOP_CHARS = 256   # characters per stop string


class _Sampling(BaseModel):
    model: StrictStr | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=1)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    seed: StrictInt | None = None
    stop: Union[StrictStr, list[StrictStr], None] = None
    stream: StrictBool = False
    ignore_eos: StrictBool = False  # decode past EOS up to max_tokens (llama-server's and vLLM's field)
    n: StrictInt = Field(default=1, ge=1, le=1)  # one choice per request (n > 1 is not supported)

    @field_validator("stop")
    @classmethod
    def _bounded(cls, stop):
        many = [stop] if isinstance(stop, str) else stop or []
        if len(many) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings are accepted, got {len(many)}")
        for i, s in enumerate(many):
            if len(s) > MAX_STOP_CHARS:
                where = "stop" if isinstance(stop, str) else f"stop[{i}]"
                raise ValueError(f"{where} has {len(s)} characters; at most {MAX_STOP_CHARS} characters are accepted")
        return stop

    def stops(self) -> list[str]:
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop or []) if s]


class CompletionRequest(_Sampling):
    prompt: StrictStr = Field(min_length=1)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: StrictStr


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


class EmbeddingRequest(BaseModel):
    model: StrictStr | None = None
    input: Union[StrictStr, list[StrictStr]]
    encoding_format: Literal["float"] = "float"

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class ClassifyRequest(BaseModel):
    model: StrictStr | None = None
    input: Union[StrictStr, list[StrictStr]]

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


def sse(obj) -> str:
    """One server-sent event (the streaming wire format of the completion endpoints)."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
