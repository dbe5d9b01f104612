"""Small web apps served by the contrib tests (also in uvicorn worker processes)."""
