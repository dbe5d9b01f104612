-- Read a lock's state on one master.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] readers, KEYS[4] queue, KEYS[5] the
-- queue's expiries, KEYS[6] the queued waiters' hand-over terms
-- Returns {value or false, pttl, fence counter or false, readers, queue}: readers as
-- value, ms left, value, ms left, ...; the queue as waiter id, ms left, ... in arrival
-- order. Entries that lapsed (not yet pruned) are left out, and so is the holder's
-- (granted while queued or handed the key, it stays listed until its release: the
-- terms' '=holder' field, see queue.lua): the queue holds the waiters only.
-- Prepended by _scripts.py: now_ms() (clock.lua).
local now = now_ms()
local readers = {}
local entries = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #entries, 2 do
  readers[#readers + 1] = entries[i]
  readers[#readers + 1] = tonumber(entries[i + 1]) - now
end
local queue = {}
local holder = redis.call('HGET', KEYS[6], '=holder')
for _, waiter in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  local lapses = redis.call('ZSCORE', KEYS[5], waiter)
  if waiter ~= holder and lapses and tonumber(lapses) > now then
    queue[#queue + 1] = waiter
    queue[#queue + 1] = tonumber(lapses) - now
  end
end
return {
  redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
  readers, queue
}
