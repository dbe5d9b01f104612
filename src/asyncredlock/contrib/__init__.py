"""Helpers for the frameworks asyncredlock is used in, each importable on its own.

- `asyncredlock.contrib.fastapi`: a lifespan owning the ``AsyncRedlock``, a
  dependency holding a lock for a request, and the error-to-HTTP mapping
  (``pip install 'asyncredlock[fastapi]'``).
- `asyncredlock.contrib.aiohttp`: ``setup()`` (a cleanup context and an error
  middleware) and a handler decorator (``pip install 'asyncredlock[aiohttp]'``).

Importing one without its framework raises ``ImportError`` saying what to install.
"""
