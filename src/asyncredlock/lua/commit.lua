-- Second phase of a fenced acquisition: commit token t on one master.
-- KEYS[1] lock key, KEYS[2] fence counter
-- ARGV[1] the holder's value, ARGV[2] t, the largest counter the first phase returned
-- Succeeds (returns 1) only if this master still holds the lock for the value and
-- its counter is <= t; the counter is then raised to t, so any later first phase
-- here counts past it. Returns 0 when the lock is not held for the value here,
-- -1 when the counter is already past t.
-- a <= b for canonical non-negative decimal strings, exactly: Lua numbers are
-- doubles (exact to 2^53) and string order depends on the server's locale, so
-- compare lengths, then at most 15 digits at a time as numbers.
local function le(a, b)
  if #a ~= #b then
    return #a < #b
  end
  while #a > 15 do
    local ha, hb = tonumber(string.sub(a, 1, 15)), tonumber(string.sub(b, 1, 15))
    if ha ~= hb then
      return ha < hb
    end
    a, b = string.sub(a, 16), string.sub(b, 16)
  end
  return tonumber(a) <= tonumber(b)
end

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local counter = redis.call('GET', KEYS[2])
local t = ARGV[2]
if counter and not le(counter, t) then
  return -1
end
redis.call('SET', KEYS[2], t)
return 1
