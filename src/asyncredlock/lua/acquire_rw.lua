-- Take a fair lock on one master: only the earliest waiter in its queue may take it.
-- KEYS[1] lock key, KEYS[2] this attempt's undo marker, KEYS[3] fence counter,
-- KEYS[4] the queue (waiter id -> arrival score), KEYS[5] the queue's expiries
-- (waiter id -> server time in ms when its entry lapses)
-- ARGV[1] the attempt's random value, ARGV[2] ttl in ms, ARGV[3] how far to count the
-- fence up ('0': not at all), ARGV[4] the waiter's id (the same for all the attempts of
-- one acquire()), ARGV[5] its arrival score (the same on every master, so that they
-- agree on the order), ARGV[6] its entry's time to live in ms
-- Returns as acquire.lua, and {0, -3} when the lock is free but an earlier waiter is
-- queued: the waiter is queued (or its entry refreshed) unless it was granted. Both
-- queue keys expire with their latest entry.
if redis.replicate_commands then
  redis.replicate_commands()
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-1}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Entries of waiters that stopped asking (dead, or gave up unheard) lapse.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
  redis.call('ZREM', KEYS[4], gone)
  redis.call('ZREM', KEYS[5], gone)
end
redis.call('ZADD', KEYS[4], 'NX', ARGV[5], ARGV[4])
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[6]), ARGV[4])
-- The queue lives as long as its latest entry: should nobody come back to prune
-- the entries of dead waiters, the keys go by themselves.
local latest = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')[2]
redis.call('PEXPIREAT', KEYS[4], latest)
redis.call('PEXPIREAT', KEYS[5], latest)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end
if redis.call('ZRANGE', KEYS[4], 0, 0)[1] ~= ARGV[4] then
  return {0, -3}
end
redis.call('ZREM', KEYS[4], ARGV[4])
redis.call('ZREM', KEYS[5], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[3] == '0' then
  return {1}
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('SET', KEYS[3], time[1] .. string.format('%06d', tonumber(time[2])))
end
return {1, redis.call('INCRBY', KEYS[3], ARGV[3])}
