-- Extend a reader's entry on one master, if it is still there and has not lapsed.
-- KEYS[1] the readers (value -> server time in ms when the entry lapses)
-- ARGV[1] the reader's value, ARGV[2] ttl in ms
-- Returns 1 when extended, else 0 (a lapsed entry is removed, never revived: a writer
-- may have been granted since).
-- Prepended by _scripts.py: now_ms() (clock.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local now = now_ms()
local lapses = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lapses then
  return 0
end
if tonumber(lapses) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local latest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
redis.call('PEXPIREAT', KEYS[1], latest)
return 1
