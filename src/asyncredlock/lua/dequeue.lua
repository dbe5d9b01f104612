-- Take a waiter out of a fair lock's queue on one master (it acquired, gave up or was
-- cancelled), with the entries that lapsed. If the waiter was first in line, or a
-- writer whose leaving lets the readers right after it go, announce it: the next
-- waiters may go now.
-- KEYS[1] the queue, KEYS[2] the queue's expiries
-- ARGV[1] the waiter's id, ARGV[2] the channel waiters listen on
-- Returns 1 when its entry was removed, else 0.
if redis.replicate_commands then
  redis.replicate_commands()
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('ZREM', KEYS[1], gone)
  redis.call('ZREM', KEYS[2], gone)
end
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local announce = rank == 0
if rank and rank > 0 and string.sub(ARGV[1], 1, 2) ~= 'r:' then
  -- A writer left from behind the head: the readers right after it may go now,
  -- unless another writer is queued before it.
  local blocked = false
  for _, earlier in ipairs(redis.call('ZRANGE', KEYS[1], 0, rank - 1)) do
    if string.sub(earlier, 1, 2) ~= 'r:' then
      blocked = true
      break
    end
  end
  local after = redis.call('ZRANGE', KEYS[1], rank, rank)[1]
  announce = not blocked and after ~= nil and string.sub(after, 1, 2) == 'r:'
end
if announce then
  redis.call('PUBLISH', ARGV[2], ARGV[1])
end
return removed
