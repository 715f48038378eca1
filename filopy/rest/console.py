"""The web console (docs/operations.md): static files of the package that read this API."""

from __future__ import annotations

import pathlib

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

CONSOLE_DIR = pathlib.Path(__file__).resolve().parent / "console"

router = APIRouter()


@router.get("/", include_in_schema=False)
async def console_page() -> FileResponse:
    return FileResponse(CONSOLE_DIR / "index.html")


def mount_console(app: FastAPI) -> None:
    """The console's files under /console and its page at /. (A mount is the app's own: an
    included router would drop it.)"""
    app.mount("/console", StaticFiles(directory=CONSOLE_DIR), name="console")
    app.include_router(router)
