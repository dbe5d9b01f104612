"""Master URLs as errors may show them: without a password."""

from __future__ import annotations

__all__ = ["redacted"]


def redacted(url: str) -> str:
    """``url`` without its password, query or fragment, for a message about a URL
    that may not parse: the user part ends at the last ``@`` (as in `urllib.parse`),
    its password at the first ``:`` after ``//``; ``?`` and ``#`` end the rest (a
    Sentinel URL's query may hold the sentinels' password)."""
    head, at, tail = url.rpartition("@")
    if at:
        start = head.find("//")
        prefix, userinfo = (head[: start + 2], head[start + 2 :]) if start >= 0 else ("", head)
        user = userinfo.partition(":")[0]
        for end in "/?#":  # an "@" in the path or query: nothing before it is shown
            user = user.partition(end)[0]
        url = f"{prefix}{user}@{tail}" if user else f"{prefix}{tail}"
    return url.partition("?")[0].partition("#")[0]
