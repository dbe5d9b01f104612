-- Remove a reader's entry on one master; when it was the last reader, announce it
-- (a writer may be waiting for the readers to leave): to the first waiter of the queue
-- when that is a writer, on its client's inbox channel (named in its id
-- 'w:<client>:<random>'; the message is the id and the reader's value), else to
-- everyone on the lock's channel.
-- KEYS[1] the readers (value -> server time in ms when the entry lapses), KEYS[2] the
-- attempt's undo marker, KEYS[3] the queue, KEYS[4] the queue's expiries, KEYS[5] the
-- queued waiters' hand-over terms (the lapsed waiters' terms go with their entries)
-- ARGV[1] the reader's value, ARGV[2] marker ttl in ms (0: leave no marker), ARGV[3]
-- the channel waiters listen on, ARGV[4] '1' for an attempt's undo (announced on the
-- lock's channel as 'undo <value>': see _wakeup.py)
-- Returns 1 when the entry was there and had not lapsed, else 0. The marker is left
-- when the outcome of the acquisition was unknown (its call failed): should it still
-- arrive later, acquire_rw.lua sees the marker and refuses it.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() and inbox() (queue.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local now = now_ms()
local lapses = redis.call('ZSCORE', KEYS[1], ARGV[1])
if lapses then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('EXISTS', KEYS[1]) == 0 then
    local channel, message = ARGV[3], ARGV[1]
    if ARGV[4] == '1' then
      message = 'undo ' .. ARGV[1]
    end
    purge(KEYS[3], KEYS[4], KEYS[5], now)
    local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    local writer = inbox(first)
    if writer then
      channel, message = writer, first .. ' ' .. ARGV[1]
    end
    -- pcall: an announcement refused (an ACL without the channel) undoes no release
    redis.pcall('PUBLISH', channel, message)
  end
  if tonumber(lapses) > now then
    return 1
  end
  return 0
end
local marker_ttl = tonumber(ARGV[2])
if marker_ttl > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', marker_ttl)
end
return 0
