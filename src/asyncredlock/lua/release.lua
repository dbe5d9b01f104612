-- Compare-and-delete on one master, announcing the release to waiters.
-- KEYS[1] lock key, KEYS[2] the attempt's undo marker
-- ARGV[1] the holder's value, ARGV[2] marker ttl in ms (0: leave no marker),
-- ARGV[3] the channel waiters listen on (published the value when deleted)
-- Returns 1 when the key held the value and was deleted, else 0.
-- The marker is left when the outcome of the SET is unknown (its call failed):
-- should that SET still arrive later, acquire.lua sees the marker and refuses it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], ARGV[1])
  return 1
end
local marker_ttl = tonumber(ARGV[2])
if marker_ttl > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', marker_ttl)
end
return 0
