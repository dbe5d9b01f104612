-- Take the lock on one master: all of its resources, or none; with fencing, also
-- count each resource's fence up.
-- KEYS, four per resource: lock key, this attempt's undo marker, fence counter, the
-- readers of its read-write lock (value -> server time in ms when the entry lapses)
-- ARGV[1] the attempt's random value, ARGV[2] ttl in milliseconds,
-- ARGV[3] how far to count the fences up (first phase of a fenced acquisition: the
-- size of the token block), '0' not to touch them
-- Returns {1} when granted ({1, counter per resource} with fencing), {0, pttl} when
-- another holder has one of the resources, {0, ms, 0, 2} when readers hold one (ms
-- until the last entry lapses), {-1} when the attempt was already undone here (its
-- SET arrived late).
-- Redis 3.2-4.x: replicate effects, so the TIME below may precede writes. Must come
-- before the first write; a no-op from Redis 5 (the default) and 7 (the only mode).
if redis.replicate_commands then
  redis.replicate_commands()
end
local n = #KEYS / 4
for i = 0, n - 1 do
  if redis.call('EXISTS', KEYS[4 * i + 2]) == 1 then
    return {-1}
  end
end
for i = 0, n - 1 do
  if redis.call('EXISTS', KEYS[4 * i + 1]) == 1 then
    return {0, redis.call('PTTL', KEYS[4 * i + 1])}
  end
end
for i = 0, n - 1 do
  local readers = KEYS[4 * i + 4]
  if redis.call('EXISTS', readers) == 1 then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
    local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]
    if last then
      return {0, tonumber(last) - now, 0, 2}
    end
  end
end
for i = 0, n - 1 do
  redis.call('SET', KEYS[4 * i + 1], ARGV[1], 'PX', ARGV[2])
end
if ARGV[3] == '0' then
  return {1}
end
local counts = {1}
for i = 0, n - 1 do
  local fence = KEYS[4 * i + 3]
  if redis.call('EXISTS', fence) == 0 then
    -- A missing counter (new resource, or a master that lost its data) starts from
    -- the server's clock in microseconds, far above any count kept before.
    local now = redis.call('TIME')
    redis.call('SET', fence, now[1] .. string.format('%06d', tonumber(now[2])))
  end
  -- INCRBY's reply passes through a Lua number: exact below 2^53 (microseconds
  -- until the year 2255, less 64 per acquisition).
  counts[i + 2] = redis.call('INCRBY', fence, ARGV[3])
end
return counts
