-- Delete a lock's keys whoever holds them (operators' force-release), announcing it as
-- release.lua does: to the first waiter of the queue when that is a writer (on its
-- client's inbox channel, named in its id 'w:<client>:<random>'), else to everyone on
-- the lock's channel.
-- KEYS[1] lock key, KEYS[2] the readers of its read-write lock, KEYS[3] its queue,
-- KEYS[4] the queue's expiries; ARGV[1] the lock's channel
-- Returns 1 when a writer's key or reader entries were deleted, else 0.
if redis.replicate_commands then
  redis.replicate_commands()
end
local value = redis.call('GET', KEYS[1])
local deleted = redis.call('DEL', KEYS[1], KEYS[2])
if deleted == 0 then
  return 0
end
local channel, message = ARGV[1], value or 'readers'
if redis.call('EXISTS', KEYS[4]) == 1 then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
    redis.call('ZREM', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
  end
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  local client = first and string.match(first, '^w:(%w+):')
  if client then
    channel, message = 'asyncredlock:inbox:' .. client, first .. ' left:forced'
  end
end
redis.call('PUBLISH', channel, message)
return 1
