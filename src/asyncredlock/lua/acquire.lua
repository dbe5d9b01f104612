-- Take the lock on one master.
-- KEYS[1] lock key, KEYS[2] this attempt's undo marker
-- ARGV[1] the attempt's random value, ARGV[2] ttl in milliseconds
-- Returns {1} when granted, {0, pttl} when another holder has it,
-- {-1} when the attempt was already undone here (its SET arrived late).
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-1}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
return {0, redis.call('PTTL', KEYS[1])}
