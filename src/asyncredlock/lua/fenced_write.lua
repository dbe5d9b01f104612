-- Fenced write or delete of one record of a FencedStore.
-- KEYS[1] the record: a hash with the fields 'value', 'fence' (the newest token that
--         wrote, deleted or read it fenced) and 'writer' (the token that wrote the value)
-- ARGV[1] the writer's fencing token, a canonical non-negative decimal string
-- ARGV[2] the new value; absent for a delete, which removes the value but keeps the
--         fence (a tombstone), so that an older writer cannot write after it
-- Returns {1} when the write took effect, {0, fence} when it was refused because the
-- record's fence is greater than the token.
-- le(a, b) comes from decimal.lua, prepended by _scripts.py.
local token = ARGV[1]
local fence = redis.call('HGET', KEYS[1], 'fence')
if fence and not le(fence, token) then
  return {0, fence}
end
if #ARGV >= 2 then
  redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', token, 'writer', token)
else
  redis.call('HDEL', KEYS[1], 'value', 'writer')
  redis.call('HSET', KEYS[1], 'fence', token)
end
return {1}
