-- Delete a lock's keys whoever holds them (operators' force-release), announcing it.
-- KEYS[1] lock key, KEYS[2] the readers of its read-write lock; ARGV[1] the channel
-- waiters listen on
-- Returns 1 when a writer's key or reader entries were deleted, else 0.
local value = redis.call('GET', KEYS[1])
local deleted = redis.call('DEL', KEYS[1], KEYS[2])
if deleted == 0 then
  return 0
end
redis.call('PUBLISH', ARGV[1], value or 'readers')
return 1
