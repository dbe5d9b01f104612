"""The benchmarks' harness, shared by the scripts in ``benchmarks/``.

- `lockbench.settings`: what every library gets (TTL, wait, connections per master).
- `lockbench.adapters`: one module per library under test, each a session (its
  clients for one case) giving a handle per worker, and the registry ``PEERS``.

The scripts run as ``python benchmarks/<name>.py``: the script's directory is on
``sys.path``, which is how they import this package.
"""
