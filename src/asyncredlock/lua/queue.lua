-- The waiters' queue of a lock, shared by the scripts that keep or announce it
-- (prepended by _scripts.py): the queue (waiter id -> arrival score), its expiries
-- (waiter id -> server time in ms when the entry lapses), the hand-over terms.
-- The server's time in ms.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
-- Drop the entries that lapsed by ``now`` (and their terms, when that key is given).
local function purge(queue, expiries, terms, now)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', expiries, '-inf', now)) do
    redis.call('ZREM', queue, gone)
    redis.call('ZREM', expiries, gone)
    if terms then
      redis.call('HDEL', terms, gone)
    end
  end
end
-- The inbox channel of a writer's client, named in its id 'w:<client>:<random>'; nil
-- for a reader (or no waiter).
local function inbox(waiter)
  local client = waiter and string.match(waiter, '^w:(%w+):')
  return client and ('asyncredlock:inbox:' .. client)
end
