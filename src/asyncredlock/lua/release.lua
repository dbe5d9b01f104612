-- Compare-and-delete on one master, announcing the release to waiters.
-- KEYS, two per resource: lock key, the attempt's undo marker
-- ARGV[1] the holder's value, ARGV[2] marker ttl in ms (0: leave no marker),
-- ARGV[3..] per resource, the channel waiters listen on (published the value when
-- deleted)
-- Deletes every resource that holds the value. Returns 1 when all of them did,
-- else 0. The markers are left when the outcome of the SET is unknown (its call
-- failed): should that SET still arrive later, acquire.lua sees them and refuses it.
local n = #KEYS / 2
local held = 0
for i = 0, n - 1 do
  if redis.call('GET', KEYS[2 * i + 1]) == ARGV[1] then
    redis.call('DEL', KEYS[2 * i + 1])
    redis.call('PUBLISH', ARGV[i + 3], ARGV[1])
    held = held + 1
  end
end
if held == n then
  return 1
end
local marker_ttl = tonumber(ARGV[2])
if marker_ttl > 0 then
  for i = 0, n - 1 do
    redis.call('SET', KEYS[2 * i + 2], '1', 'PX', marker_ttl)
  end
end
return 0
