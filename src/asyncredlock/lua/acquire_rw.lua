-- Take a lock that keeps a queue on one master: a read-write lock (reader or writer)
-- or a fair lock (a writer that always queues).
-- KEYS[1] lock key (the writer's), KEYS[2] this attempt's undo marker, KEYS[3] fence
-- counter, KEYS[4] readers (reader's value -> server time in ms when its entry
-- lapses), KEYS[5] the queue (waiter id -> arrival score), KEYS[6] the queue's
-- expiries (waiter id -> server time in ms when its entry lapses), KEYS[7] the queued
-- waiters' hand-over terms (waiter id -> 'value px block attempt', see release.lua)
-- ARGV[1] the attempt's random value, ARGV[2] ttl in ms, ARGV[3] how far to count the
-- fence up ('0': not at all; always '0' for a reader), ARGV[4] the waiter's id, the
-- same for all the attempts of one acquire() ('r:...' for a reader; any other id is a
-- writer's), ARGV[5] its arrival score (the same on every master, so that they agree
-- on the order), ARGV[6] its queue entry's time to live in ms, ARGV[7] 'r' reader or
-- 'w' writer, ARGV[8] '1' to queue (fair, or a writer out of patience), '0' to queue
-- only while a queue exists; optional, for a writer to be handed the lock by a release
-- while queued: ARGV[9] the value it would hold the key with, ARGV[10] for how long in
-- ms (the key's first PX; its lease extends it)
-- A writer is granted when no writer holds the key, no reader entry is left and, if
-- queued, it is first in the queue; a reader when no writer holds the key and, if
-- queued, no writer is queued before it. A granted reader leaves the queue; a
-- granted writer stays listed until its release (or the end of its acquire()) takes
-- it out, so that the undo of an attempt that failed elsewhere hands the key back to
-- the earliest writer, the same on every master.
-- Returns {1} when granted ({1, counter} with fencing), {0, ms left, queued, why}
-- when refused (why: 1 a writer holds the key, then ahead: 1 when an earlier waiter
-- than this one is queued, other than the holder, else 0; 2 readers hold it (ms
-- until the last entry lapses), 3 an earlier writer is queued (ms left -1)), {-1}
-- when the attempt was already undone here (it arrived late), {0, pttl, 0, 4, count,
-- ahead} when the key was already handed to this writer (left alone; count is its
-- fence counter, '0' without fencing; ahead as above). queued is 1 when the waiter's
-- entry is in the queue.
-- Both queue keys and the readers key expire with their latest entry.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() and inbox() (queue.lua),
-- fence_count() (fence.lua), handed_already() (handed.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {-1}
end
local now = now_ms()
local reader = ARGV[7] == 'r'
-- Entries of readers whose lease ran out, and of waiters that stopped asking.
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
purge(KEYS[5], KEYS[6], KEYS[7], now)
local handover = not reader and ARGV[9]
if handover and redis.call('GET', KEYS[1]) == handover then
  return handed_already(KEYS[1], KEYS[3], ARGV[3], waiting_ahead(KEYS[5], KEYS[7], ARGV[4]))
end
local queued = ARGV[8] == '1' or redis.call('EXISTS', KEYS[5]) == 1
local q = 0
if queued then
  q = 1
  redis.call('ZADD', KEYS[5], 'NX', ARGV[5], ARGV[4])
  redis.call('ZADD', KEYS[6], now + tonumber(ARGV[6]), ARGV[4])
  local latest = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', KEYS[5], latest)
  redis.call('PEXPIREAT', KEYS[6], latest)
  if handover then
    redis.call('HSET', KEYS[7], ARGV[4], handover .. ' ' .. ARGV[10] .. ' ' .. ARGV[3] .. ' ' .. ARGV[1])
    redis.call('PEXPIREAT', KEYS[7], latest)
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local ahead = q == 1 and waiting_ahead(KEYS[5], KEYS[7], ARGV[4]) and 1 or 0
  return {0, redis.call('PTTL', KEYS[1]), q, 1, ahead}
end
if not reader then
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
  if last then
    return {0, tonumber(last) - now, q, 2}
  end
end
if queued then
  local rank = redis.call('ZRANK', KEYS[5], ARGV[4])
  if rank > 0 then
    if not reader then
      return {0, -1, 1, 3}
    end
    for _, earlier in ipairs(redis.call('ZRANGE', KEYS[5], 0, rank - 1)) do
      if string.sub(earlier, 1, 2) ~= 'r:' then
        return {0, -1, 1, 3}
      end
    end
  end
  if reader then
    redis.call('ZREM', KEYS[5], ARGV[4])
    redis.call('ZREM', KEYS[6], ARGV[4])
  else
    note_holder(KEYS[7], KEYS[6], ARGV[4])
  end
end
if reader then
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), ARGV[1])
  local latest = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', KEYS[4], latest)
  return {1}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[3] == '0' then
  return {1}
end
return {1, fence_count(KEYS[3], ARGV[3])}
