"""The benchmarks' harness, shared by the scripts in ``benchmarks/``.

- `lockbench.harness`: servers and proxies, statistics, the environment stamp, publishing.
- `lockbench.settings`: what every library gets (TTL, wait, connections per master).
- `lockbench.adapters`: one module per library under test, each a session (its
  clients for one case) giving a handle per worker, and the registry ``PEERS``.
- `lockbench.rtt`: the round trips a run is measured against (proxy PING, quorum round).
- `lockbench.targets`: the limits of ``benchmarks/targets.toml``, checked when read.
- `lockbench.peers_report`: the peers benchmark's report, from its JSON.

The scripts run as ``python benchmarks/<name>.py``: the script's directory is on
``sys.path``, which is how they import this package.
"""
