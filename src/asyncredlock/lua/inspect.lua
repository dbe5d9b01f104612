-- Read a lock's state on one master.
-- KEYS[1] lock key, KEYS[2] fence counter key
-- Returns {value or false, pttl, fence counter or false}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
