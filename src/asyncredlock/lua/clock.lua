-- The server's clock, shared by the scripts that read it (prepended by _scripts.py).
-- The server's time in ms.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
