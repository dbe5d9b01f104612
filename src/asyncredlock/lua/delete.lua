-- Delete a lock's keys whoever holds them (operators' force-release), announcing it as
-- release.lua does: the holder, when it was listed in the queue (granted while queued,
-- or handed the key: noted in the terms), leaves it first; then the first waiter is
-- told when that is a writer (on its client's inbox channel, named in its id
-- 'w:<client>:<random>'), else everyone on the lock's channel.
-- KEYS[1] lock key, KEYS[2] the readers of its read-write lock, KEYS[3] its queue,
-- KEYS[4] the queue's expiries, KEYS[5] the queued waiters' hand-over terms;
-- ARGV[1] the lock's channel
-- Returns what was deleted: 0 nothing, 1 the lock key (a writer's), 2 the readers'
-- entries, 3 both.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge(), unlist() and inbox()
-- (queue.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local value = redis.call('GET', KEYS[1])
local key, readers = redis.call('DEL', KEYS[1]), redis.call('DEL', KEYS[2])
if key + readers == 0 then
  return 0
end
local channel, message = ARGV[1], value or 'readers'
if redis.call('EXISTS', KEYS[4]) == 1 then
  purge(KEYS[3], KEYS[4], KEYS[5], now_ms())
  local holder = redis.call('HGET', KEYS[5], HOLDER)
  if holder then
    unlist(KEYS[3], KEYS[4], KEYS[5], holder)
  end
  local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  local writer = inbox(first)
  if writer then
    channel, message = writer, first .. ' left:forced'
  end
end
-- pcall: an announcement refused (an ACL without the channel) undoes no release
redis.pcall('PUBLISH', channel, message)
return key + 2 * readers
