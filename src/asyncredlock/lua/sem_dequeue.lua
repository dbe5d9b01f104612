-- Take a fair semaphore's waiter out of its queue on one master (it acquired, gave up
-- or was cancelled), with the entries that lapsed. With f slots free, the first f
-- entries may take one (see sem_acquire.lua): when the waiter was one of them, the
-- entry now f-th may take a slot it was refused until now, or, with fewer than f
-- entries left, an unfair attempt may, so the leaving is announced on the first
-- slot's channel (the message is 'left:' and the waiter's id, the same on every
-- master), as a release is. With no slot free, or the waiter further back, the
-- others' chances are unchanged: nothing is announced. A waiter
-- that ends without a lease and is not listed may have been let in by its last
-- attempt, which took a slot here (leaving the queue) and gave it back since (its
-- give-back goes before this on the connection, and announces nothing): it counts
-- as first in line.
-- KEYS[1] the queue, KEYS[2] its expiries, KEYS[3..] the semaphore's slot keys
-- ARGV[1] the waiter's id, ARGV[2] the first slot's channel (waiters listen on every
-- slot's channel), ARGV[3] '1' when it ends without a lease after an attempt (absent
-- or '0' otherwise)
-- Returns 1 when its entry was removed, else 0.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() (queue.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local queue, expiries, waiter = KEYS[1], KEYS[2], ARGV[1]
purge(queue, expiries, nil, now_ms())
local rank = redis.call('ZRANK', queue, waiter)
redis.call('ZREM', expiries, waiter)
local listed = rank and 1 or 0
if rank then
  redis.call('ZREM', queue, waiter)
elseif ARGV[3] == '1' then
  rank = 0
else
  return 0
end
local n = #KEYS - 2
if rank >= n then
  return listed  -- as many entries ahead as there are slots: it was never let in
end
local free = 0
for slot = 3, #KEYS do
  if redis.call('EXISTS', KEYS[slot]) == 0 then
    free = free + 1
  end
end
-- announced: an entry moved up into the first f, or an unfair waiter may take one
if rank < free then
  -- pcall: an announcement refused (an ACL without the channel) is no failure
  redis.pcall('PUBLISH', ARGV[2], 'left:' .. waiter)
end
return listed
