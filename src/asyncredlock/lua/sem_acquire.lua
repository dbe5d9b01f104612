-- Take one slot of a counting semaphore on one master: the preferred slot if it is
-- free, else the next free one after it (cyclically). Each slot is a lock key of its
-- own, so a holder granted slot i by a quorum holds it as Redlock holds a lock, and
-- at most ``limit`` holders (one per slot) are valid at once. A fair semaphore's
-- waiters queue here (id -> arrival score): with f slots free, only the first f of
-- the queue may take one, then leave it; the others are queued (or their entry
-- refreshed) and refused. An unfair attempt keeps that queue too: while q waiters
-- are queued, it may take a slot only when more than q are free (the first q free
-- ones are theirs), as an unfair attempt at a fair lock waits for its queue.
-- KEYS[1..n] the semaphore's slot keys, KEYS[n + 1] this attempt's undo marker,
-- KEYS[n + 2] the queue, KEYS[n + 3] its expiries (id -> server time in ms when the
-- entry lapses)
-- ARGV[1] the attempt's random value, ARGV[2] ttl in milliseconds, ARGV[3] the
-- preferred slot (1-based); fair: ARGV[4] the waiter's id, ARGV[5] its arrival score
-- (the same on every master), ARGV[6] its entry's time to live in ms
-- Returns {1, slot} (1-based) when granted, {0, pttl} when every slot is taken (pttl:
-- the soonest a slot's key expires, in ms; -1 if none will; a fair waiter is queued
-- all the same), {0, pttl, 1, 3} when a slot is free but earlier waiters are queued
-- for it, {-1} when the attempt was already undone here (it arrived late).
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() (queue.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local fair = #ARGV >= 6
local n = #KEYS - 3
local queue, expiries = KEYS[n + 2], KEYS[n + 3]
if redis.call('EXISTS', KEYS[n + 1]) == 1 then
  return {-1}
end
-- the soonest a taken slot's key expires (ms; -1: none will), and how many are free
local function taken()
  local soonest, free = -1, 0
  for slot = 1, n do
    local pttl = redis.call('PTTL', KEYS[slot])
    if pttl == -2 then
      free = free + 1
    elseif pttl >= 0 and (soonest < 0 or pttl < soonest) then
      soonest = pttl
    end
  end
  return soonest, free
end
if fair then
  local waiter = ARGV[4]
  local now = now_ms()
  purge(queue, expiries, nil, now)
  redis.call('ZADD', queue, 'NX', ARGV[5], waiter)
  redis.call('ZADD', expiries, now + tonumber(ARGV[6]), waiter)
  local latest = redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', queue, latest)
  redis.call('PEXPIREAT', expiries, latest)
  local soonest, free = taken()
  if free == 0 then
    return {0, soonest}  -- every slot held: refused as held, whoever is queued
  end
  if redis.call('ZRANK', queue, waiter) >= free then
    return {0, soonest, 1, 3}
  end
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', expiries, waiter)
elseif redis.call('EXISTS', queue) == 1 then
  purge(queue, expiries, nil, now_ms())
  local soonest, free = taken()
  if free == 0 then
    return {0, soonest}
  end
  if redis.call('ZRANGE', queue, free - 1, free - 1)[1] then
    return {0, soonest, 1, 3}  -- as many waiters queued as slots free: theirs
  end
end
local first = tonumber(ARGV[3])
for step = 0, n - 1 do
  local slot = (first - 1 + step) % n + 1
  if redis.call('SET', KEYS[slot], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, slot}
  end
end
return {0, (taken())}
