-- Compare-and-delete on one master, announcing the release to waiters.
-- KEYS, four per resource: lock key, the attempt's undo marker, the resource's queue
-- (waiter id -> arrival score) and its expiries (waiter id -> server time in ms when
-- the entry lapses)
-- ARGV[1] the holder's value, ARGV[2] marker ttl in ms (0: leave no marker),
-- ARGV[3..] per resource, the channel waiters listen on
-- Deletes every resource that holds the value and announces each: when the first
-- waiter of its queue is a writer, to that writer's client, on the inbox channel named
-- in its id ('w:<client>:<random>'; the message is the id, a space and the value:
-- only that writer goes, once it heard it from a quorum of masters), else to
-- everyone on the lock's channel (the message is the value: readers queued first all
-- go together, and waiters that never queued try again). Returns 1 when all of them
-- were held, else 0.
-- The markers are left when the outcome of the SET is unknown (its call failed):
-- should that SET still arrive later, the acquire scripts see them and refuse it.
if redis.replicate_commands then
  redis.replicate_commands()
end
local n = #KEYS / 4
local held = 0
local now
for i = 0, n - 1 do
  if redis.call('GET', KEYS[4 * i + 1]) == ARGV[1] then
    redis.call('DEL', KEYS[4 * i + 1])
    local channel, message = ARGV[i + 3], ARGV[1]
    local queue, expiries = KEYS[4 * i + 3], KEYS[4 * i + 4]
    if redis.call('EXISTS', expiries) == 1 then
      if not now then
        local time = redis.call('TIME')
        now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
      end
      for _, gone in ipairs(redis.call('ZRANGEBYSCORE', expiries, '-inf', now)) do
        redis.call('ZREM', queue, gone)
        redis.call('ZREM', expiries, gone)
      end
      local first = redis.call('ZRANGE', queue, 0, 0)[1]
      local client = first and string.match(first, '^w:(%w+):')
      if client then
        channel, message = 'asyncredlock:inbox:' .. client, first .. ' ' .. ARGV[1]
      end
    end
    redis.call('PUBLISH', channel, message)
    held = held + 1
  end
end
if held == n then
  return 1
end
local marker_ttl = tonumber(ARGV[2])
if marker_ttl > 0 then
  for i = 0, n - 1 do
    redis.call('SET', KEYS[4 * i + 2], '1', 'PX', marker_ttl)
  end
end
return 0
