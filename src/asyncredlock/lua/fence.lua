-- A resource's fence counter, shared by the scripts that count it up (prepended by
-- _scripts.py).
-- Count ``fence`` up by ``block`` and return the new count. A missing counter (new
-- resource, or a master that lost its data) starts from the server's clock in
-- microseconds, far above any count kept before. INCRBY's reply passes through a Lua
-- number: exact below 2^53 (microseconds until the year 2255, less 64 per
-- acquisition).
local function fence_count(fence, block)
  if redis.call('EXISTS', fence) == 0 then
    local time = redis.call('TIME')
    redis.call('SET', fence, time[1] .. string.format('%06d', tonumber(time[2])))
  end
  return redis.call('INCRBY', fence, block)
end
