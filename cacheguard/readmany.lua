-- Read one field (a representation) of several values hashes in one call
-- (GetMany on a single server: one command instead of a pipeline of HGETs).
-- KEYS: the values hashes   ARGV[1]: the field
-- Returns one string, so that the reply costs the client one allocation, not
-- two per key: for each key "-" when absent, else the value's length in
-- decimal, ":" and the value.
local out = {}
for _, k in ipairs(KEYS) do
  local v = redis.call('HGET', k, ARGV[1])
  if v then
    out[#out + 1] = #v .. ':'
    out[#out + 1] = v
  else
    out[#out + 1] = '-'
  end
end
return table.concat(out)
