-- Delete a lock key whoever holds it (operators' force-release), announcing it.
-- KEYS[1] lock key; ARGV[1] the channel waiters listen on
-- Returns 1 when a key was deleted, else 0.
local value = redis.call('GET', KEYS[1])
if not value then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], value)
return 1
