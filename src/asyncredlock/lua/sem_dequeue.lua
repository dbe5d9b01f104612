-- Take a fair semaphore's waiter out of its queue on one master (it acquired, gave up
-- or was cancelled), with the entries that lapsed. With f slots free, the first f
-- entries may take one (see sem_acquire.lua): when the waiter was one of them, the
-- entry now f-th may take a slot it was refused until now, so the leaving is
-- announced on the first slot's channel (the message is 'left:' and the waiter's id,
-- the same on every master), as a release is. With no slot free, or the waiter
-- further back, the others' chances are unchanged: nothing is announced.
-- KEYS[1] the queue, KEYS[2] its expiries, KEYS[3..] the semaphore's slot keys
-- ARGV[1] the waiter's id, ARGV[2] the first slot's channel (waiters listen on every
-- slot's channel)
-- Returns 1 when its entry was removed, else 0.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() (queue.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local queue, expiries, waiter = KEYS[1], KEYS[2], ARGV[1]
purge(queue, expiries, nil, now_ms())
local rank = redis.call('ZRANK', queue, waiter)
redis.call('ZREM', expiries, waiter)
if not rank then
  return 0
end
redis.call('ZREM', queue, waiter)
local n = #KEYS - 2
if rank >= n then
  return 1  -- as many entries ahead as there are slots: it was never let in
end
local free = 0
for slot = 3, #KEYS do
  if redis.call('EXISTS', KEYS[slot]) == 0 then
    free = free + 1
  end
end
-- announced if there is an entry now f-th (it moved up into the first f)
if rank < free and redis.call('ZRANGE', queue, free - 1, free - 1)[1] then
  -- pcall: an announcement refused (an ACL without the channel) is no failure
  redis.pcall('PUBLISH', ARGV[2], 'left:' .. waiter)
end
return 1
