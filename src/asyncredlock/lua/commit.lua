-- Second phase of a fenced acquisition: commit its tokens on one master.
-- KEYS, two per resource: lock key, fence counter
-- ARGV[1] the holder's value; ARGV[2..] per resource, the token t: the largest
-- counter the first phase returned for it
-- Succeeds (returns 1) only if this master still holds every resource for the value
-- and each counter is <= its t; the counters are then raised to their t, so any
-- later first phase here counts past them. Returns 0 when a resource is not held for
-- the value here, -1 when a counter is already past its t; nothing is written then.
-- le(a, b) comes from decimal.lua, prepended by _scripts.py.

local n = #KEYS / 2
for i = 0, n - 1 do
  if redis.call('GET', KEYS[2 * i + 1]) ~= ARGV[1] then
    return 0
  end
end
for i = 0, n - 1 do
  local counter = redis.call('GET', KEYS[2 * i + 2])
  if counter and not le(counter, ARGV[i + 2]) then
    return -1
  end
end
for i = 0, n - 1 do
  redis.call('SET', KEYS[2 * i + 2], ARGV[i + 2])
end
return 1
