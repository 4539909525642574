"""Request bodies in the OpenAI shapes (a client library for that API works unchanged), validated by
pydantic so that a wrong type is a 422 naming the field rather than an error deep inside the model.
Unknown fields are ignored, as OpenAI does; `top_k` and `repetition_penalty` are extensions."""
from __future__ import annotations

import json

from typing import Literal, Union

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr


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
    n: StrictInt = Field(default=1, ge=1, le=1)  # one choice per request (n > 1 is not supported)

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
