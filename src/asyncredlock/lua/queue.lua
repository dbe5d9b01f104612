-- The waiters' queue of a lock, shared by the scripts that keep or announce it
-- (prepended by _scripts.py, after clock.lua): the queue (waiter id -> arrival
-- score), its expiries (waiter id -> server time in ms when the entry lapses), the
-- hand-over terms (and the holder, see HOLDER).
-- The field of the hand-over terms that names the waiter holding the key (granted or
-- handed it, it stays listed until its release): no waiter id starts with '='.
local HOLDER = '=holder'
-- Take ``waiter`` out of the queue (and, when that key is given, its terms; the
-- holder noted, if that was it).
local function unlist(queue, expiries, terms, waiter)
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', expiries, waiter)
  if terms then
    redis.call('HDEL', terms, waiter)
    if redis.call('HGET', terms, HOLDER) == waiter then
      redis.call('HDEL', terms, HOLDER)
    end
  end
end
-- Drop the entries that lapsed by ``now`` (and their terms, when that key is given).
local function purge(queue, expiries, terms, now)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', expiries, '-inf', now)) do
    unlist(queue, expiries, terms, gone)
  end
end
-- The inbox channel of a writer's client, named in its id 'w:<client>:<random>'; nil
-- for a reader (or no waiter).
local function inbox(waiter)
  local client = waiter and string.match(waiter, '^w:(%w+):')
  return client and ('asyncredlock:inbox:' .. client)
end
-- Note ``waiter`` as the holder; the terms expire with the queue's latest entry.
local function note_holder(terms, expiries, waiter)
  local latest = redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')[2]
  if latest then
    redis.call('HSET', terms, HOLDER, waiter)
    redis.call('PEXPIREAT', terms, latest)
  end
end
-- Whether a waiter earlier than ``waiter`` is queued, other than the holder.
local function waiting_ahead(queue, terms, waiter)
  local rank = redis.call('ZRANK', queue, waiter)
  if not rank or rank == 0 then
    return false
  end
  return rank > 1 or redis.call('ZRANGE', queue, 0, 0)[1] ~= redis.call('HGET', terms, HOLDER)
end
