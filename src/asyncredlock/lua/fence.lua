-- A resource's fence counter, shared by the scripts that count it up (prepended by
-- _scripts.py).
-- Count ``fence`` up by ``block`` and return the new count, never less than the
-- server's clock in whole seconds (as microseconds: the clock floor). A missing
-- counter (new resource, or a master that lost its data) starts from the clock in
-- microseconds. The floor also lifts a counter that was set back (a failover to a
-- replica that had missed the last counts) above the tokens of earlier seconds; it
-- is whole seconds so that masters counting at about the same time return the same
-- count (a fenced acquisition then needs no commit round). INCRBY's reply passes
-- through a Lua number: exact below 2^53 (microseconds until the year 2255).
-- A count equal to the block means the counter was missing (or 0, which a counter
-- that starts from the clock never is).
local function fence_count(fence, block)
  local time = redis.pcall('TIME')
  if time.err then
    -- TIME refused (an ACL): the refusal, as the script's error reply, before the
    -- counter is touched (a counter counted without the clock could go back).
    error(time)
  end
  local count = redis.call('INCRBY', fence, block)
  if count == tonumber(block) then
    return redis.call('INCRBY', fence, time[1] .. string.format('%06d', tonumber(time[2])))
  end
  local floor = time[1] .. '000000'
  if count < tonumber(floor) then
    redis.call('SET', fence, floor)
    return tonumber(floor)
  end
  return count
end
