"""The words `SQLFence` refuses as a table or column name.

`SQLFence` writes names unquoted, so that each database applies its own rules to them
(PostgreSQL and Oracle fold unquoted names to one case, MySQL quotes with backticks):
quoting them would change which table a mixed-case name means in PostgreSQL, every name
in Oracle, and make the statements invalid in MySQL. A reserved word written unquoted
makes the statement fail when it runs or, for ``current_date`` say, silently mean
something else, so such names are refused before any statement is built.

The words: SQLite's keywords (``sqlite3_keyword_name()``, SQLite 3.40) that fail as the
table, key, fence or a value column of the statements, and PostgreSQL's reserved and
type-or-function-name keywords (``pg_get_keywords()``, PostgreSQL 15: exactly the ones
that fail there), with ``system_user``, reserved since PostgreSQL 16.
"""

from __future__ import annotations

__all__ = ["RESERVED_WORDS"]

_WORDS = """
    add all alter analyse analyze and any array as asc asymmetric authorization
    autoincrement between binary both case cast check collate collation column commit
    concurrently constraint create cross current_catalog current_date current_role
    current_schema current_time current_timestamp current_user default deferrable delete
    desc distinct do drop else end escape except exists false fetch for foreign freeze from
    full grant group having ilike in index initially inner insert intersect into is isnull
    join lateral leading left like limit localtime localtimestamp natural not nothing
    notnull null offset on only or order outer overlaps placing primary raise references
    returning right select session_user set similar some symmetric system_user table
    tablesample then to trailing transaction true union unique update user using values
    variadic verbose when where window with
"""

RESERVED_WORDS = frozenset(_WORDS.split())
