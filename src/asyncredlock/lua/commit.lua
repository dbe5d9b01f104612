-- Second phase of a fenced acquisition: commit token t on one master.
-- KEYS[1] lock key, KEYS[2] fence counter
-- ARGV[1] the holder's value, ARGV[2] t, the largest counter the first phase returned
-- Succeeds (returns 1) only if this master still holds the lock for the value and
-- its counter is <= t; the counter is then raised to t, so any later first phase
-- here counts past it. Returns 0 when the lock is not held for the value here,
-- -1 when the counter is already past t.
-- le(a, b) comes from decimal.lua, prepended by _scripts.py.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local counter = redis.call('GET', KEYS[2])
local t = ARGV[2]
if counter and not le(counter, t) then
  return -1
end
redis.call('SET', KEYS[2], t)
return 1
