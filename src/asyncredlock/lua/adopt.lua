-- A waiter that took the lock by an attempt adopts, on one master, the key a release
-- handed it there (see release.lua): the key goes from the hand-over value to the
-- lease's value, so that the lease holds every master that granted or handed it.
-- KEYS[1] the lock key, KEYS[2] its fence counter
-- ARGV[1] the value the key was handed to the waiter with, ARGV[2] the lease's value,
-- ARGV[3] the lease's TTL in ms, ARGV[4] the lease's token ('' without fencing)
-- Returns {1} when the key holds the lease's value (adopted now, or its attempt was
-- granted here), else {0} and nothing is written. Adopting raises the counter to the
-- token if it is below (as a commit's write-back): nobody counted here while the key
-- was handed to the waiter, and a counter never goes down.
-- le(a, b) comes from decimal.lua, prepended by _scripts.py.

local current = redis.call('GET', KEYS[1])
if current == ARGV[2] then
  return {1}
end
if current ~= ARGV[1] then
  return {0}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[4] ~= '' then
  local counter = redis.call('GET', KEYS[2])
  if not counter or not le(ARGV[4], counter) then
    redis.call('SET', KEYS[2], ARGV[4])
  end
end
return {1}
