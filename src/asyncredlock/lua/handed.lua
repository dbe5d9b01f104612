-- The reply of the acquire scripts to an attempt of the waiter a release already
-- handed the key to (see release.lua), prepended by _scripts.py.
-- {0, the key's PTTL, 0, 4, count, ahead}: count is the fence counter, which nothing
-- counts on while the key is held, so the count the release handed it ('0' when
-- ``block`` is '0': no fencing); ahead is 1 when an earlier waiter than it is queued
-- here since (its attempts came after the release: the key went to the wrong one, and
-- a waiter handed it by fewer than a quorum gives it back). The waiter that missed the
-- announcement takes the lease from a quorum of these.
local function handed_already(key, fence, block, ahead)
  local count = '0'
  if block ~= '0' then
    count = redis.call('GET', fence) or '0'
  end
  return {0, redis.call('PTTL', key), 0, 4, count, ahead and 1 or 0}
end
