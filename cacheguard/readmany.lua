-- Read one field (a representation) of several values hashes in one call
-- (GetMany on a single server: one command instead of a pipeline of HGETs).
-- KEYS: the values hashes   ARGV[1]: the field
-- Returns each value in KEYS' order, false (nil) when absent. (Building one
-- string of them, lengths and values, cost the server more than the client
-- saved by reading one reply: 100 keys, 74-163 us against 58-95 us.)
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('HGET', k, ARGV[1])
end
return out
