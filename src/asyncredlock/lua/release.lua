-- Compare-and-delete on one master, announcing the release to waiters, or handing the
-- lock straight to the first of them.
-- KEYS, seven per resource: lock key, the attempt's undo marker, the resource's queue
-- (waiter id -> arrival score), its expiries (waiter id -> server time in ms when the
-- entry lapses), the queued waiters' hand-over terms (waiter id -> 'value px block
-- attempt'), the readers of its read-write lock, its fence counter
-- ARGV[1] the holder's value, ARGV[2] marker ttl in ms (0: leave no marker),
-- ARGV[3..] per resource, the channel waiters listen on; after them, the waiter id
-- the holder was queued as ('' if none; an attempt's undo sends none): its entry,
-- still listed (a granted or handed waiter stays listed), leaves the queue first;
-- then '1' for an attempt's undo (announced on the lock's channel as 'undo <value>')
-- Deletes every resource that holds the value. When the first waiter of its queue is a
-- writer that left hand-over terms and no reader holds the resource, the key is set at
-- once to that waiter's value for px ms (with fencing, the fence counted up by block),
-- the waiter stays listed, and its client's inbox channel (named in its id,
-- 'w:<client>:<random>') gets the id, 'handed:', the attempt whose terms these were,
-- and the count. A first waiter without terms is announced there with the released
-- value (it tries at once). Else everyone on the lock's channel gets the value
-- (readers queued first all go together; waiters that never queued try again).
-- Returns 1 when all of them were held, else 0. The markers are left when the outcome
-- of the SET is unknown (its call failed): should that SET still arrive later, the
-- acquire scripts see them and refuse it.
-- Prepended by _scripts.py: now_ms() (clock.lua), purge() and inbox() (queue.lua),
-- fence_count() (fence.lua).
if redis.replicate_commands then
  redis.replicate_commands()
end
local n = #KEYS / 7
local held = 0
local now
local holder = ARGV[3 + n]
for i = 0, n - 1 do
  local key = KEYS[7 * i + 1]
  if holder ~= '' then
    unlist(KEYS[7 * i + 3], KEYS[7 * i + 4], KEYS[7 * i + 5], holder)
  end
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    local channel, message = ARGV[i + 3], ARGV[1]
    if ARGV[4 + n] == '1' then
      message = 'undo ' .. ARGV[1]
    end
    local queue, expiries, terms = KEYS[7 * i + 3], KEYS[7 * i + 4], KEYS[7 * i + 5]
    if redis.call('EXISTS', expiries) == 1 then
      now = now or now_ms()
      purge(queue, expiries, terms, now)
      local first = redis.call('ZRANGE', queue, 0, 0)[1]
      local writer = inbox(first)
      if writer then
        channel, message = writer, first .. ' ' .. ARGV[1]
        local readers = KEYS[7 * i + 6]
        redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
        local term = redis.call('HGET', terms, first)
        if term and redis.call('EXISTS', readers) == 0 then
          local value, px, block, attempt = string.match(term, '^(%S+) (%S+) (%S+) (%S+)$')
          redis.call('SET', key, value, 'PX', px)
          local count = '0'
          if block ~= '0' then
            -- '%.0f' keeps every digit of the count
            count = string.format('%.0f', fence_count(KEYS[7 * i + 7], block))
          end
          -- it stays listed (its release takes it out): should it wait for a quorum
          -- in vain, the waiters behind it know who came first (see dequeue.lua)
          redis.call('HDEL', terms, first)
          note_holder(terms, expiries, first)
          message = first .. ' handed:' .. attempt .. ' ' .. count
        end
      end
    end
    -- pcall: an announcement refused (an ACL without the channel) undoes no release
    redis.pcall('PUBLISH', channel, message)
    held = held + 1
  end
end
if held == n then
  return 1
end
local marker_ttl = tonumber(ARGV[2])
if marker_ttl > 0 then
  for i = 0, n - 1 do
    redis.call('SET', KEYS[7 * i + 2], '1', 'PX', marker_ttl)
  end
end
return 0
