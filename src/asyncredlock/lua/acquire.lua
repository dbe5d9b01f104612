-- Take the lock on one master: all of its resources, or none; with fencing, also
-- count each resource's fence up. A lock on one resource also minds its queue of
-- waiters: while anyone is queued, an attempt without a waiter's id is refused (it
-- comes back with one, at the end of the line); a waiter that brings its id is queued
-- when refused (or its entry refreshed) and, the lock free, granted only if no
-- earlier waiter is queued. A granted waiter stays listed (its release, or the end of
-- its acquire(), takes it out): should the attempt fail on the other masters, its undo
-- hands the key back to the earliest waiter, the same on every master.
-- KEYS, four per resource: lock key, this attempt's undo marker, fence counter, the
-- readers of its read-write lock (value -> server time in ms when the entry lapses);
-- for one resource, then optionally KEYS[5] the queue (waiter id -> arrival score),
-- KEYS[6] the queue's expiries (waiter id -> server time in ms when its entry lapses)
-- and KEYS[7] the hand-over terms of queued waiters (waiter id -> 'value px block
-- attempt', see release.lua)
-- ARGV[1] the attempt's random value, ARGV[2] ttl in milliseconds,
-- ARGV[3] how far to count the fences up (first phase of a fenced acquisition: the
-- size of the token block), '0' not to touch them; optional, with the queue keys:
-- ARGV[4] the waiter's id (the same for all the attempts of one acquire()), ARGV[5]
-- its arrival score (the same on every master, so that they agree on the order),
-- ARGV[6] its queue entry's time to live in ms; optional, to be handed the lock by a
-- release while queued: ARGV[7] the value it would hold the key with, ARGV[8] for how
-- long in ms (the key's first PX; its lease extends it)
-- Returns {1} when granted ({1, counter per resource} with fencing), {0, pttl, 0}
-- when another holder has one of the resources ({0, pttl, 1, 1, ahead} for a waiter
-- with its id, queued: ahead is 1 when an earlier waiter than it is queued, other
-- than the holder), {0, ms, queued, 2} when readers hold one (ms until the last
-- entry lapses), {0, -1, queued, 3} when the lock is free but an earlier waiter is
-- queued, {-1} when the attempt was already undone here (its SET arrived late),
-- {0, pttl, 0, 4, count, ahead} when the key was already handed to this waiter (see
-- release.lua; left alone; count is its fence counter, '0' without fencing; ahead as
-- above). queued is 1 when the waiter's entry is in the queue.
-- Redis 3.2-4.x: replicate effects, so the TIME below may precede writes. Must come
-- before the first write; a no-op from Redis 5 (the default) and 7 (the only mode).
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() and inbox() (queue.lua),
-- fence_count() (fence.lua), handed_already() (handed.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local waiter = ARGV[4]
local n = math.floor(#KEYS / 4)
local queue, expiries, terms
if #KEYS == 7 then
  queue, expiries, terms = KEYS[5], KEYS[6], KEYS[7]
end
local handover = ARGV[7]
local now
local function clock()
  now = now or now_ms()
  return now
end
-- Queue the waiter (or refresh its entry, and its hand-over terms with this
-- attempt's value); the keys expire with the latest entry.
local function enqueue()
  redis.call('ZADD', queue, 'NX', ARGV[5], waiter)
  redis.call('ZADD', expiries, clock() + tonumber(ARGV[6]), waiter)
  local latest = redis.call('ZRANGE', expiries, -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', queue, latest)
  redis.call('PEXPIREAT', expiries, latest)
  if handover then
    redis.call('HSET', terms, waiter, handover .. ' ' .. ARGV[8] .. ' ' .. ARGV[3] .. ' ' .. ARGV[1])
    redis.call('PEXPIREAT', terms, latest)
  end
end
-- Set the keys (with fencing, count the fences up)
local function grant()
  for i = 0, n - 1 do
    redis.call('SET', KEYS[4 * i + 1], ARGV[1], 'PX', ARGV[2])
  end
  if ARGV[3] == '0' then
    return {1}
  end
  local counts = {1}
  for i = 0, n - 1 do
    counts[i + 2] = fence_count(KEYS[4 * i + 3], ARGV[3])
  end
  return counts
end
-- Take it at once when none of these exist: a lock key, the attempt's undo marker,
-- readers, the queue (the common case, in one call)
if n == 1 then
  if queue then
    if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[4], queue, expiries) == 0 then
      if waiter then
        enqueue()  -- listed, as on the masters that refuse it
        note_holder(terms, expiries, waiter)
      end
      return grant()
    end
  elseif redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[4]) == 0 then
    return grant()
  end
end
for i = 0, n - 1 do
  if redis.call('EXISTS', KEYS[4 * i + 2]) == 1 then
    return {-1}
  end
end
local queued = 0
if queue and redis.call('EXISTS', expiries) == 1 then
  -- entries of waiters that stopped asking (gone, or killed)
  purge(queue, expiries, terms, clock())
end
if handover and redis.call('GET', KEYS[1]) == handover then
  return handed_already(KEYS[1], KEYS[3], ARGV[3], queue and waiting_ahead(queue, terms, waiter))
end
for i = 0, n - 1 do
  if redis.call('EXISTS', KEYS[4 * i + 1]) == 1 then
    local pttl = redis.call('PTTL', KEYS[4 * i + 1])
    if waiter then
      enqueue()
      local ahead = waiting_ahead(queue, terms, waiter) and 1 or 0
      return {0, pttl, 1, 1, ahead}
    end
    return {0, pttl, 0}
  end
end
for i = 0, n - 1 do
  local readers = KEYS[4 * i + 4]
  if redis.call('EXISTS', readers) == 1 then
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', clock())
    local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]
    if last then
      if waiter then
        enqueue()
        queued = 1
      end
      return {0, tonumber(last) - clock(), queued, 2}
    end
  end
end
if queue then
  if waiter then
    enqueue()
    if redis.call('ZRANK', queue, waiter) > 0 then
      return {0, -1, 1, 3}
    end
    note_holder(terms, expiries, waiter)
  elseif redis.call('EXISTS', queue) == 1 then
    return {0, -1, 0, 3}
  end
end
return grant()
