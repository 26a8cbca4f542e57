-- Read one field (a representation) of several values hashes in one call
-- (GetMany on a single server: one command instead of a pipeline of HGETs).
-- KEYS: the values hashes   ARGV[1]: the field
-- Returns the values, false where absent.
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('HGET', k, ARGV[1])
end
return out
