-- Take the lock on one master; with fencing, also count the resource's fence up.
-- KEYS[1] lock key, KEYS[2] this attempt's undo marker, KEYS[3] fence counter
-- ARGV[1] the attempt's random value, ARGV[2] ttl in milliseconds,
-- ARGV[3] how far to count the fence up (first phase of a fenced acquisition: the
-- size of the token block), '0' not to touch it
-- Returns {1} when granted ({1, counter} with fencing), {0, pttl} when another
-- holder has it, {-1} when the attempt was already undone here (its SET arrived late).
-- Redis 3.2-4.x: replicate effects, so the TIME below may precede writes. Must come
-- before the first write; a no-op from Redis 5 (the default) and 7 (the only mode).
if redis.replicate_commands then
  redis.replicate_commands()
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-1}
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('PTTL', KEYS[1])}
end
if ARGV[3] == '0' then
  return {1}
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  -- A missing counter (new resource, or a master that lost its data) starts from
  -- the server's clock in microseconds, far above any count kept before.
  local now = redis.call('TIME')
  redis.call('SET', KEYS[3], now[1] .. string.format('%06d', tonumber(now[2])))
end
-- INCRBY's reply passes through a Lua number: exact below 2^53 (microseconds until
-- the year 2255, less 64 per acquisition).
return {1, redis.call('INCRBY', KEYS[3], ARGV[3])}
