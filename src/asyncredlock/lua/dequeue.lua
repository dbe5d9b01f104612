-- Take a waiter out of a lock's queue on one master (it acquired, gave up or was
-- cancelled), with the entries that lapsed. If the lock is free and the waiter was
-- first in line, or a writer whose leaving lets the readers right after it go,
-- announce it: to the new first waiter when that is a writer (on its client's inbox
-- channel, named in its id 'w:<client>:<random>'; the message is the id, then
-- ' left:' and the leaving waiter's id), else to
-- everyone on the lock's channel (the message is 'left:' and the waiter's id: readers
-- first in line, and waiters that did not queue).
-- A key handed to the waiter (see release.lua) that it is not going to use is deleted
-- first, and the next waiter announced. Giving a handed key back only (ARGV[4] '1':
-- it goes on waiting, listed in its place, no longer noted as the holder), the first
-- waiter is announced unless that is the waiter itself (the message names it with
-- ' gave:').
-- KEYS[1] the queue, KEYS[2] the queue's expiries, KEYS[3] the lock key (the
-- writer's), KEYS[4] the queued waiters' hand-over terms
-- ARGV[1] the waiter's id, ARGV[2] the channel waiters listen on, ARGV[3] the value
-- the key was handed to it with, to delete ('': leave the key alone), ARGV[4] '1' to
-- give that key back and stay listed, '0' to leave the queue
-- Returns 1 when its entry was removed (given back: the key), else 0.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() and inbox() (queue.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
purge(KEYS[1], KEYS[2], KEYS[4], now_ms())
-- Tell the first waiter the lock is free, with why (its inbox when it is a writer;
-- else everyone on the lock's channel).
local function announce(first, why)
  local writer = inbox(first)
  -- pcall: an announcement refused (an ACL without the channel) is no failure
  if writer then
    redis.pcall('PUBLISH', writer, first .. ' ' .. why)
  else
    redis.pcall('PUBLISH', ARGV[2], why)
  end
end
local handed = ARGV[3] ~= '' and redis.call('GET', KEYS[3]) == ARGV[3]
if handed then
  redis.call('DEL', KEYS[3])
end
if ARGV[4] == '1' then
  if not handed then
    return 0
  end
  -- no longer the holder here: a waiter again (inspect.lua, waiting_ahead() and
  -- force_release count it as one)
  if redis.call('HGET', KEYS[4], HOLDER) == ARGV[1] then
    redis.call('HDEL', KEYS[4], HOLDER)
  end
  local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if first and first ~= ARGV[1] then
    announce(first, 'gave:' .. ARGV[1])
  end
  return 1
end
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
local removed = rank and 1 or 0
unlist(KEYS[1], KEYS[2], KEYS[4], ARGV[1])
if handed then
  rank = 0  -- it was first in line when handed the key (its entry may have lapsed)
end
if not rank or redis.call('EXISTS', KEYS[3]) == 1 then
  -- not queued here, or the lock is held: its release will announce the next one
  return removed
end
local announced = rank == 0
if rank > 0 and string.sub(ARGV[1], 1, 2) ~= 'r:' then
  -- A writer left from behind the head: the readers right after it may go now,
  -- unless another writer is queued before it.
  local blocked = false
  for _, earlier in ipairs(redis.call('ZRANGE', KEYS[1], 0, rank - 1)) do
    if string.sub(earlier, 1, 2) ~= 'r:' then
      blocked = true
      break
    end
  end
  local after = redis.call('ZRANGE', KEYS[1], rank, rank)[1]
  announced = not blocked and after ~= nil and string.sub(after, 1, 2) == 'r:'
end
if announced then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if first then
    announce(first, 'left:' .. ARGV[1])
  else
    redis.pcall('PUBLISH', ARGV[2], 'left:' .. ARGV[1])
  end
end
return removed
