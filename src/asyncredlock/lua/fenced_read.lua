-- Fenced read of one record of a FencedStore, for a read-modify-write: the reader's
-- token becomes the record's fence, so that from now on a holder of an older token
-- can neither write the record nor read it this way. Without it, an older holder
-- that read before a newer one could still write between the newer one's read and
-- its write, and one of the two updates would be lost.
-- KEYS[1] the record: a hash with the fields 'value', 'fence' and 'writer'
-- ARGV[1] the reader's fencing token, a canonical non-negative decimal string
-- Returns {0, fence} when refused (the record's fence is greater than the token);
-- else {1, value, writer}: the value (false if none) and the token that wrote it
-- ('writer', or 'fence' for a record written before 'writer' existed).
-- le(a, b) comes from decimal.lua, prepended by _scripts.py.
local token = ARGV[1]
local fence = redis.call('HGET', KEYS[1], 'fence')
if fence and not le(fence, token) then
  return {0, fence}
end
local value = redis.call('HGET', KEYS[1], 'value')
local writer = redis.call('HGET', KEYS[1], 'writer') or fence or false
redis.call('HSET', KEYS[1], 'fence', token)
return {1, value, writer}
