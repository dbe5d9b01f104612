-- The reply of the acquire scripts to an attempt of the waiter a release already
-- handed the key to (see release.lua), prepended by _scripts.py.
-- {0, the key's PTTL, 0, 4, count}: count is the fence counter, which nothing counts
-- on while the key is held, so the count the release handed it ('0' when ``block``
-- is '0': no fencing). The waiter that missed the announcement takes the lease from
-- a quorum of these.
local function handed_already(key, fence, block)
  local count = '0'
  if block ~= '0' then
    count = redis.call('GET', fence) or '0'
  end
  return {0, redis.call('PTTL', key), 0, 4, count}
end
