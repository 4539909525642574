"""HTTP serving: `create_app(model, tokenizer)` (FastAPI) and `run_server(app, host=, port=)` (uvicorn with a
graceful drain on SIGTERM); see app.py."""
import importlib.util

_MISSING = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
if _MISSING:  # an optional extra: say which, rather than fail deep inside app.py
    raise ModuleNotFoundError(f"attnlab serve needs {' and '.join(_MISSING)}: pip install 'attnlab[serve]'",
                              name=_MISSING[0])
from .app import ApiError, Limits, create_app  # noqa: E402,F401
from .drain import run_server  # noqa: E402,F401
