"""FiloPy's REST API: `create_app(client, settings)` builds the FastAPI app (docs/rest.md)."""

from filopy.rest.app import create_app

__all__ = ["create_app"]
