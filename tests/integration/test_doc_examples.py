"""Every Python example of README.md and docs/*.md runs as written.

Each fenced ``python`` block is extracted from its page at test time and run, with
top-level ``await`` allowed, against real embedded servers: the placeholder masters
(``redis://h1:6379`` ...) are rewritten to the servers' URLs, and the names a
fragment takes from its surroundings (``redlock``, ``masters``, ``do_the_work``...)
are given. The only other rewrite is ``asyncio.run(main())`` -> ``await main()``
(the test already runs in an event loop). Examples that need a service other than
the masters (PostgreSQL, an OTLP collector, a Prometheus port) are only compiled.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import math
import re
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from asyncredlock import AsyncRedlock, Lease
from asyncredlock.testing import ServerGroup

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
HOST = re.compile(r"redis://(h[1-5]|data)(:6379)?(?=[\"/])")


def blocks() -> list[Any]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for i, match in enumerate(BLOCK.finditer(text)):
            code = textwrap.dedent(match.group(2))
            line = text[: match.start()].count("\n") + 1
            name = f"{page.relative_to(ROOT)}:{line}"
            found.append(pytest.param(name, code, id=f"{page.name}-{i}-L{line}"))
    return found


#: Blocks only compiled: they need a service besides the masters, or are an
#: interpreter session (``>>>``, checked separately below).
COMPILE_ONLY = (
    "asyncpg",  # PostgreSQL
    "psycopg",  # PostgreSQL
    "OTLPSpanExporter",  # an OTLP collector
    "start_http_server",  # a Prometheus port
    ">>> ",
    "while True:",  # run_singleton's scheduler runs forever (run in its own test)
    "    ttl=10.0,\n    timeout=10.0,",  # configuration.md: the signature, not code
    "ssl_ca_certs=/etc/redis/ca.pem",  # files of a real deployment
    "my_cluster_client",  # a Redis Cluster and a valkey client
    "redlock_b",  # guarantees.md: narrates a 15 s pause of client A
    "ServerCluster(3) as a",  # three clusters of 3 nodes: too slow here
)


class Stubs:
    """The names the fragments take from their surroundings."""

    def __init__(self, servers: ServerGroup) -> None:
        self.calls: list[str] = []
        self.urls = servers.urls

    def namespace(self, redlock: AsyncRedlock) -> dict[str, Any]:
        calls = self.calls

        def recorder(name: str) -> Any:
            async def stub(*args: Any, **kwargs: Any) -> Any:
                calls.append(name)
                if name == "load_order":
                    return {"id": args[0], "status": "new"}
                return None

            return stub

        from redis.asyncio import Redis

        data_client = Redis.from_url(self.urls[0] + "/1")  # not a lock key's db
        return {
            "__name__": "__doc_example__",
            "asyncio": asyncio,
            "math": math,
            "redlock": redlock,
            "redlock_a": redlock,
            "masters": self.urls,
            "MASTERS": self.urls,
            "AsyncRedlock": AsyncRedlock,
            "Lease": Lease,
            "log": logging.getLogger("doc-example"),
            "data_client": data_client,
            "amount": 10,
            "my_redis_client": Redis.from_url(self.urls[0]),
            **{
                name: recorder(name)
                for name in (
                    "do_the_work",
                    "do_the_job",
                    "long_running_job",
                    "load_order",
                    "transfer",
                    "compute_status",
                    "enqueue_due_jobs",
                    "save",
                    "work",
                )
            },
            "run_job": recorder("run_job"),
            "schedule": recorder("schedule"),
        }


def rewrite(code: str, urls: list[str]) -> str:
    hosts = {f"h{i + 1}": url for i, url in enumerate(urls)}
    hosts["data"] = urls[0] + "/1"
    code = HOST.sub(lambda m: hosts[m.group(1)], code)
    return code.replace("asyncio.run(main())", "await main()")


async def run(code: str, namespace: dict[str, Any]) -> None:
    compiled = compile(code, "<doc example>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)
    if asyncio.iscoroutine(result):
        await result


def page_blocks() -> list[Any]:
    by_page: dict[str, list[tuple[str, str]]] = {}
    for param in blocks():
        where, code = param.values
        by_page.setdefault(where.split(":")[0], []).append((where, code))
    return [pytest.param(page, found, id=page) for page, found in by_page.items()]


@pytest.mark.parametrize(("page", "found"), page_blocks())
async def test_python_examples_run(
    page: str,
    found: list[tuple[str, str]],
    servers: ServerGroup,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The blocks of one page run in order in one namespace, as a reader would
    run them; every block that fails is reported with its line and error."""
    monkeypatch.chdir(tmp_path)  # the examples write files (shop.db, ca.pem)
    stubs = Stubs(servers)
    failures: list[str] = []
    before = set(asyncio.all_tasks())
    async with AsyncRedlock(servers.urls) as redlock:
        namespace = stubs.namespace(redlock)
        namespace.update(
            server=servers[0],
            other_urls=servers.urls[1:],
            ServerGroup=ServerGroup,
            servers=servers,
            anyio=anyio,
            SentinelProcess=__import__("asyncredlock.testing").testing.SentinelProcess,
        )
        try:
            for where, code in found:
                if any(marker in code for marker in COMPILE_ONLY[6:7]):
                    continue
                try:
                    compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                except SyntaxError as exc:
                    if ">>> " not in code:
                        failures.append(f"{where}: does not compile: {exc}")
                    continue
                if any(marker in code for marker in COMPILE_ONLY):
                    continue
                defined = set(namespace)
                try:
                    with anyio.fail_after(20):
                        await run(rewrite(code, servers.urls), namespace)
                        for name in sorted(set(namespace) - defined):
                            test = namespace[name]
                            if name.startswith("test_") and asyncio.iscoroutinefunction(test):
                                params = list(__import__("inspect").signature(test).parameters)
                                if params == ["servers"] and "        ...\n" not in code:
                                    servers.flushall()
                                    await test(servers)
                except Exception as exc:
                    failures.append(f"{where}: {type(exc).__name__}: {exc!r}")
                namespace["redlock"] = redlock  # a block that made and closed its own
                for name in ("lease", "a", "b"):  # a fragment that leaves a lease held
                    left = namespace.pop(name, None)
                    if isinstance(left, Lease) and left.held:
                        await left.release()
                fresh = stubs.namespace(redlock)
                for name in ("run_job", "do_the_job", "do_the_work"):
                    namespace[name] = fresh[name]
                await fresh["data_client"].aclose()
                await fresh["my_redis_client"].aclose()
        finally:
            for task in asyncio.all_tasks() - before - {asyncio.current_task()}:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await namespace["data_client"].aclose()
            await namespace["my_redis_client"].aclose()
            for value in list(namespace.values()):  # a block's own client (docs/fencing.md's)
                if isinstance(value, Redis):
                    await value.aclose()
    assert not failures, "\n".join(failures)


def test_interpreter_sessions_print_what_the_docs_show() -> None:
    """The ``>>>`` blocks (usage.md: ``acl_rules``) print what the page shows."""
    import doctest

    sessions = [code for _, code in (p.values for p in blocks()) if ">>> " in code]
    assert sessions
    for code in sessions:
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        test = doctest.DocTestParser().get_doctest(code, {}, "docs", "docs", 0)
        result = runner.run(test)
        assert result.failed == 0
        assert result.attempted > 0


def test_no_example_passes_a_dependency_as_a_default() -> None:
    """The examples take a FastAPI dependency as ``Annotated[T, Depends(...)]``, never
    as a parameter's default (``lease: Lease = Depends(...)``), which ruff's B008
    flags in the reader's project: a reader copies the first form a page shows."""
    found = []
    for param in blocks():
        where, code = param.values
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                for default in [*arguments.defaults, *arguments.kw_defaults]:
                    if isinstance(default, ast.Call) and ast.unparse(default.func) == "Depends":
                        found.append(f"{where}: {node.name}() {ast.unparse(default)}")
    assert not found, found


#: Signatures written out in the prose of the pages, and the callable each shows:
#: (page, the text up to the opening parenthesis, the callable).
SIGNATURES = [
    ("docs/configuration.md", "`redlock.lock(name, *", AsyncRedlock.lock),
    ("docs/usage.md", "`redlock.semaphore(name, limit", AsyncRedlock.semaphore),
    ("docs/singleton.md", "`run_singleton(name, job", AsyncRedlock.run_singleton),
    ("docs/rwlock.md", "`rwlock(name,", AsyncRedlock.rwlock),
]


def written_parameters(page: str, opening: str) -> dict[str, str | None]:
    """The parameters (name -> default as written, None without one) of the first
    signature on ``page`` that starts with ``opening``."""
    text = " ".join((ROOT / page).read_text().split())
    start = text.index("(", text.index(opening)) + 1
    inside = text[start : text.index(")", start)]
    params: dict[str, str | None] = {}
    for part in inside.split(","):
        part = part.strip()
        if part in ("*", "/", ""):
            continue
        name, _, default = part.partition("=")
        params[name.strip()] = default.strip() or None
    return params


@pytest.mark.parametrize(("page", "opening", "function"), SIGNATURES)
def test_signatures_in_the_prose_match_the_code(page: str, opening: str, function: Any) -> None:
    """A signature a page writes out names every parameter, with its default."""
    import inspect

    actual = {
        name: None if p.default is p.empty else repr(p.default)
        for name, p in inspect.signature(function).parameters.items()
        if name != "self"
    }
    assert written_parameters(page, opening) == actual


def test_the_constructor_block_lists_every_setting_with_its_default() -> None:
    """configuration.md's ``AsyncRedlock(...)`` block: every keyword of
    ``__init__`` (but the deprecated ``max_connections``), with its default."""
    import inspect
    import time

    text = (ROOT / "docs/configuration.md").read_text()
    block = text[text.index("```python\nAsyncRedlock(\n") :].split("```")[1]
    written = dict(re.findall(r"^\s+(\w+)=(.+),$", block, re.M))
    env = {"math": math, "time": time}
    actual = {
        name: p.default
        for name, p in inspect.signature(AsyncRedlock.__init__).parameters.items()
        if p.kind is p.KEYWORD_ONLY and name != "max_connections"
    }
    assert {name: eval(value, env) for name, value in written.items()} == actual
