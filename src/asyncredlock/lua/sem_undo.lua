-- Give back what a semaphore attempt took on one master: every slot holding its
-- value but the one kept (the slot its holder was granted by a quorum), and, when
-- the attempt's outcome here is unknown, leave a marker that refuses it should it
-- still arrive. A slot given back is announced on its channel when the slots'
-- channels are passed: an interrupted attempt's (cancelled, or its client closing),
-- which a quorum may have granted, as a release (its value): a waiter of another
-- client refused for that slot meanwhile would sleep with it free; a failed
-- attempt's, or one a granted attempt got besides the slot it keeps, as an undo
-- ('undo <value>'): it wakes a waiter only as a lock's undo does, or once a quorum
-- of masters has the slot free for it (see _wakeup.py).
-- KEYS[1..n] the semaphore's slot keys, KEYS[n + 1] the attempt's undo marker
-- ARGV[1] the attempt's value, ARGV[2] the marker's ttl in ms ('0': no marker),
-- ARGV[3] the slot kept (1-based; '0': none); ARGV[4..n + 3] each slot's channel
-- (absent: nothing is announced), ARGV[n + 4] '1' to announce an undo
-- Returns how many slots it gave back.
local n = #KEYS - 1
local keep = tonumber(ARGV[3])
local announce = #ARGV >= 3 + n
local message = ARGV[1]
if ARGV[4 + n] == '1' then
  message = 'undo ' .. ARGV[1]
end
local given = 0
for slot = 1, n do
  if slot ~= keep and redis.call('GET', KEYS[slot]) == ARGV[1] then
    redis.call('DEL', KEYS[slot])
    given = given + 1
    if announce then
      -- pcall: an announcement refused (an ACL without the channel) undoes nothing
      redis.pcall('PUBLISH', ARGV[3 + slot], message)
    end
  end
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[n + 1], '1', 'PX', ARGV[2])
end
return given
