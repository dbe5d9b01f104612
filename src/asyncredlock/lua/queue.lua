-- The waiters' queue of a lock, shared by the scripts that keep or announce it
-- (prepended by _scripts.py, after clock.lua): the queue (waiter id -> arrival
-- score), its expiries (waiter id -> server time in ms when the entry lapses), the
-- hand-over terms.
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
