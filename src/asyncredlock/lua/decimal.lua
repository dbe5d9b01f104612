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
