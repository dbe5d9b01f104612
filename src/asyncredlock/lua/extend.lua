-- Reset the lock's expiry on one master if it still holds the holder's value.
-- KEYS[1] lock key; ARGV[1] the holder's value, ARGV[2] ttl in ms
-- Returns 1 when extended, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
