"""HTTP serving: `create_app(model, tokenizer)` (FastAPI) and `serve(...)` (uvicorn); see app.py."""
from .app import ApiError, Limits, create_app  # noqa: F401
