-- Delete a lock key whoever holds it (operators' force-release).
-- KEYS[1] lock key. Returns 1 when a key was deleted, else 0.
return redis.call('DEL', KEYS[1])
