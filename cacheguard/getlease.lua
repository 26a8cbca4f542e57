-- Return the cached value, or take the fill lease when the value is absent, not
-- fresh enough or unreadable and no other fill is running: one round trip, atomic,
-- so a fill that completes between a miss and the lease can never be loaded twice.
-- KEYS[1] value (envelope)   KEYS[2] fill lease (token, PX)
-- ARGV: token, lease ms, after (unix ms: a value fresh until later than this is
--       returned as it is), force (1 = the caller could not decode the value:
--       never return it as fresh)
-- Returns {0, value} for a fresh value, {1} when the lease is this caller's,
-- {2, pttl ms, holder's token} when another fill holds it (its wake-up will name
-- that token: see fill.lua).
-- Idempotent under client retries: a lease already holding this token counts as granted.
local v = redis.call('GET', KEYS[1])
-- Envelope header: 'c' 'g' version(1) flags, fresh-until ms (8 bytes, big-endian), ...
if v and ARGV[4] ~= '1' and string.len(v) >= 24 and string.sub(v, 1, 2) == 'cg' and string.byte(v, 3) == 1 then
  local fresh = 0
  for i = 5, 12 do fresh = fresh * 256 + string.byte(v, i) end
  if fresh > tonumber(ARGV[3]) then
    return {0, v}
  end
end
local cur = redis.call('GET', KEYS[2])
if cur == false then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {1}
elseif cur == ARGV[1] then
  return {1}
end
local pttl = redis.call('PTTL', KEYS[2])
if pttl < 0 then pttl = 0 end
return {2, pttl, cur}
