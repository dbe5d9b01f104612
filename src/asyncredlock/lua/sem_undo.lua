-- Give back what a semaphore attempt took on one master: every slot holding its
-- value but the one kept (the slot its holder was granted by a quorum), and, when
-- the attempt's outcome here is unknown, leave a marker that refuses it should it
-- still arrive. A failed attempt's give-back is announced nowhere: a slot given back
-- was held by an attempt that did not get it, not by a holder (announcing it would
-- wake waiters whose own attempts, given back in turn, would wake others: a storm).
-- An interrupted attempt's (cancelled, or its client closing), which a quorum may
-- have granted, is announced as a release (its value, on the slot's channel): a
-- waiter of another client refused for that slot meanwhile would sleep with it free.
-- KEYS[1..n] the semaphore's slot keys, KEYS[n + 1] the attempt's undo marker
-- ARGV[1] the attempt's value, ARGV[2] the marker's ttl in ms ('0': no marker),
-- ARGV[3] the slot kept (1-based; '0': none); an interrupted attempt's: ARGV[4..]
-- each slot's channel (absent: nothing is announced)
-- Returns how many slots it gave back.
local n = #KEYS - 1
local keep = tonumber(ARGV[3])
local announce = #ARGV >= 3 + n
local given = 0
for slot = 1, n do
  if slot ~= keep and redis.call('GET', KEYS[slot]) == ARGV[1] then
    redis.call('DEL', KEYS[slot])
    given = given + 1
    if announce then
      -- pcall: an announcement refused (an ACL without the channel) undoes nothing
      redis.pcall('PUBLISH', ARGV[3 + slot], ARGV[1])
    end
  end
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[n + 1], '1', 'PX', ARGV[2])
end
return given
