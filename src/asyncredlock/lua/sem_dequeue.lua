-- Take a fair semaphore's waiter out of its queue on one master (it acquired, gave up
-- or was cancelled), with the entries that lapsed.
-- KEYS[1] the queue, KEYS[2] its expiries; ARGV[1] the waiter's id
-- Returns 1 when its entry was removed, else 0.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() (queue.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
purge(KEYS[1], KEYS[2], nil, now_ms())
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
