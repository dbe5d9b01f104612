-- Reset the lock's expiry on one master if it still holds every resource for the
-- holder's value.
-- KEYS: the lock key of each resource; ARGV[1] the holder's value, ARGV[2] ttl in ms
-- Returns 1 when extended, else 0 (nothing is changed then).
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return 0
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return 1
