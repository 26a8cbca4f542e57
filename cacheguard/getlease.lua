-- Return the cached value, or take the fill lease when the value is absent, not
-- fresh enough, of an older generation or unreadable and no other fill of this
-- generation is running: one round trip, atomic, so a fill that completes
-- between a miss and the lease can never be loaded twice.
-- KEYS[1] value (envelope)   KEYS[2] fill lease ("<generation> <token>", PX)
-- KEYS[3] generation of the cache key (created here when absent)
-- ARGV: token, lease ms, after (unix ms: a value fresh until later than this is
--       returned as it is), force (1 = the caller could not decode the value:
--       never return it as fresh), ttl ms of a generation created here
-- Returns {0, value, generation} for a fresh value of the current generation,
-- {1, generation} when the lease is this caller's, {2, pttl ms, holder's token,
-- generation} when another fill of the current generation holds it (its
-- wake-up will name that token: see fill.lua). A lease granted under an older
-- generation is void: an invalidation came after it, so it is taken over.
-- Idempotent under client retries: a lease already holding this token counts as granted.
local g = redis.call('GET', KEYS[3])
if not g then
  -- A generation never seen before for this key (µs of the server's clock;
  -- invalidate.lua only ever moves it forward).
  local t = redis.call('TIME')
  g = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('SET', KEYS[3], g, 'PX', ARGV[5])
end
local v = redis.call('GET', KEYS[1])
-- Envelope header: 'c' 'g' version(2) flags, fresh-until ms (8 bytes,
-- big-endian) at 5, ..., generation (8 bytes, big-endian) at 25.
if v and ARGV[4] ~= '1' and string.len(v) >= 32 and string.sub(v, 1, 2) == 'cg' and string.byte(v, 3) == 2 then
  local fresh, vg = 0, 0
  for i = 5, 12 do fresh = fresh * 256 + string.byte(v, i) end
  for i = 25, 32 do vg = vg * 256 + string.byte(v, i) end
  if vg == tonumber(g) and fresh > tonumber(ARGV[3]) then
    return {0, v, g}
  end
end
local mine = g .. ' ' .. ARGV[1]
local cur = redis.call('GET', KEYS[2])
if cur == mine then
  return {1, g}
end
if cur then
  local sp = string.find(cur, ' ', 1, true)
  if sp and string.sub(cur, 1, sp - 1) == g then
    local pttl = redis.call('PTTL', KEYS[2])
    if pttl < 0 then pttl = 0 end
    return {2, pttl, string.sub(cur, sp + 1), g}
  end
end
redis.call('SET', KEYS[2], mine, 'PX', ARGV[2])
-- The generation outlives the lease granted under it.
local gt = redis.call('PTTL', KEYS[3])
if gt >= 0 and gt < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return {1, g}
