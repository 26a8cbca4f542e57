-- Read one field (a representation) of several values hashes in one call
-- (GetMany on a single server: one command instead of a pipeline of HGETs).
-- KEYS: the values hashes   ARGV[1]: the field
-- Returns one string, so that the reply costs the client one allocation, not
-- two per key: for each key its value's length as 4 bytes, big-endian, then
-- the value; 0xFFFFFFFF alone when absent. (struct.pack, not a decimal
-- length: turning numbers into text cost the server a third of the call.)
local out, n = {}, 0
for _, k in ipairs(KEYS) do
  local v = redis.call('HGET', k, ARGV[1])
  if v then
    out[n + 1] = struct.pack('>I4', #v)
    out[n + 2] = v
    n = n + 2
  else
    n = n + 1
    out[n] = '\255\255\255\255'
  end
end
return table.concat(out)
