-- Take one slot of a counting semaphore on one master: the preferred slot if it is
-- free, else the next free one after it (cyclically). Each slot is a lock key of its
-- own, so a holder granted slot i by a quorum holds it as Redlock holds a lock, and
-- at most ``limit`` holders (one per slot) are valid at once.
-- KEYS[1..n] the semaphore's slot keys, KEYS[n + 1] this attempt's undo marker
-- ARGV[1] the attempt's random value, ARGV[2] ttl in milliseconds, ARGV[3] the
-- preferred slot (1-based)
-- Returns {1, slot} (1-based) when granted, {0, pttl} when every slot is taken (pttl:
-- the soonest a slot's key expires, in ms; -1 if none will), {-1} when the attempt
-- was already undone here (it arrived late).
local n = #KEYS - 1
if redis.call('EXISTS', KEYS[n + 1]) == 1 then
  return {-1}
end
local first = tonumber(ARGV[3])
local soonest = -1
for step = 0, n - 1 do
  local slot = (first - 1 + step) % n + 1
  if redis.call('SET', KEYS[slot], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, slot}
  end
  local pttl = redis.call('PTTL', KEYS[slot])
  if pttl >= 0 and (soonest < 0 or pttl < soonest) then
    soonest = pttl
  end
end
return {0, soonest}
