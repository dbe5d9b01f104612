"""The benchmarks' harness, shared by the scripts in ``benchmarks/``.

- `lockbench.harness`: servers and proxies, statistics, the environment stamp, publishing.
- `lockbench.settings`: what every library gets (TTL, wait, connections per master).
- `lockbench.adapters`: one module per library under test, each a session (its
  clients for one case) giving a handle per worker, and the registry ``PEERS``.
- `lockbench.rtt`: the round trips a run is measured against (proxy PING, quorum round).
- `lockbench.targets`: the limits of ``benchmarks/targets.toml``, checked when read.
- `lockbench.workloads`: what ``peers.py`` and ``profile_throughput.py`` both run: the
  guards, a library's session per case, failure counting, scenario c's timed run.
- `lockbench.peers_records`: the types of ``peers.json``, down to each library's result.
- `lockbench.peers_report`: the peers benchmark's report, from its JSON.
- `lockbench.fanout_report`: the types of ``fanout.json``, and its report.
- `lockbench.profile_report`: the types of ``profile_throughput.json``, and its report.
- `lockbench.transport_report`: the types of ``transport.json``, and its report.
- `lockbench.rwlock_report`: the types of ``rwlock.json``, and its report.
- `lockbench.scale_report`: the types of ``scale.json``, and its report.

The scripts run as ``python benchmarks/<name>.py``: the script's directory is on
``sys.path``, which is how they import this package. No script imports another.
"""
