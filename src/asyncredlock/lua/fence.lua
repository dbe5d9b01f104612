-- A resource's fence counter, shared by the scripts that count it up (prepended by
-- _scripts.py).
-- Count ``fence`` up by ``block`` and return the new count. A missing counter (new
-- resource, or a master that lost its data) starts from the server's clock in
-- microseconds, far above any count kept before. INCRBY's reply passes through a Lua
-- number: exact below 2^53 (microseconds until the year 2255, less 64 per
-- acquisition).
-- A count equal to the block means the counter was missing (or 0, which a counter
-- that starts from the clock never is): it is then raised by the clock as well.
local function fence_count(fence, block)
  local count = redis.call('INCRBY', fence, block)
  if count == tonumber(block) then
    local time = redis.pcall('TIME')
    if time.err then
      -- TIME refused (an ACL): a counter that did not start from the clock must not
      -- stay, or later tokens would count up from the block, below earlier ones.
      redis.call('DEL', fence)
      error(time)  -- the refusal, as the script's error reply (the DEL stays)
    end
    count = redis.call('INCRBY', fence, time[1] .. string.format('%06d', tonumber(time[2])))
  end
  return count
end
