"""HTTP serving: `create_app(model, tokenizer)` (FastAPI) and `run_server(app, host=, port=)` (uvicorn with a
graceful drain on SIGTERM); see app.py."""
from .app import ApiError, Limits, create_app  # noqa: F401
from .drain import run_server  # noqa: F401
