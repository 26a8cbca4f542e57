-- Return the cached value of each key, or take its fill lease when the value
-- is absent, not fresh enough, of an older generation or unreadable and no
-- other fill of this generation is running: one round trip, atomic, so a
-- fill that completes between a miss and the lease can never be loaded
-- twice. Every key of one call is in one hash slot.
-- For key i: KEYS[4i-3] its values (a hash: one envelope per representation),
-- KEYS[4i-2] its fill lease ("<generation> <token>", PX), KEYS[4i-1] its
-- generation (created here when absent), KEYS[4i] the tokens whose request
-- for that lease was given back (see release.lua); ARGV[2i+2] its representation's
-- field in the values hash, ARGV[2i+3] after (unix ms: a value fresh until
-- later than this is returned as it is; a huge number when the caller could
-- not decode the value).
-- ARGV[1] token, ARGV[2] lease ms, ARGV[3] ttl ms of a generation created here.
-- Returns one reply per key: {0, value, generation} for a fresh value of the
-- current generation, {1, generation} when the lease is this caller's,
-- {2, pttl ms, holder's token, generation} when another fill of the current
-- generation holds it (its wake-up will name that token: see fill.lua). A
-- lease granted under an older generation is void: an invalidation came
-- after it, so it is taken over. Idempotent under client retries: a lease
-- already holding this token counts as granted. A token given back is never
-- granted: its request reached Redis after its caller gave up on it (written
-- into a stall, or retried by go-redis on another connection), and nobody
-- would fill the lease; it is answered as if that token held the lease.
local out = {}
for i = 1, #KEYS / 4 do
  local kv, kl, kg, kt = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local field, after = ARGV[2 * i + 2], tonumber(ARGV[2 * i + 3])
  local g = counterRead(kg, ARGV[3]) -- created from the clock when absent
  -- Envelope header: 'c' 'g' version(3) flags, fresh-until ms (8 bytes,
  -- big-endian) at 5, ..., generation (8 bytes, big-endian) at 25, ...
  local v = redis.call('HGET', kv, field)
  if v and string.len(v) >= 40 and string.sub(v, 1, 2) == 'cg' and string.byte(v, 3) == 3 then
    local fresh, vg = 0, 0
    for j = 5, 12 do fresh = fresh * 256 + string.byte(v, j) end
    for j = 25, 32 do vg = vg * 256 + string.byte(v, j) end
    if vg == tonumber(g) and fresh > after then
      out[i] = {0, v, g}
    end
  end
  if not out[i] then
    local mine = g .. ' ' .. ARGV[1]
    local cur = redis.call('GET', kl)
    if cur and cur ~= mine then
      local sp = string.find(cur, ' ', 1, true)
      if sp and string.sub(cur, 1, sp - 1) == g then
        local pttl = redis.call('PTTL', kl)
        if pttl < 0 then pttl = 0 end
        out[i] = {2, pttl, string.sub(cur, sp + 1), g}
      end
    end
  end
  if not out[i] and redis.call('ZSCORE', kt, ARGV[1]) then
    out[i] = {2, 0, ARGV[1], g}
  end
  if not out[i] then
    redis.call('SET', kl, g .. ' ' .. ARGV[1], 'PX', ARGV[2])
    -- The generation outlives the lease granted under it.
    local gt = redis.call('PTTL', kg)
    if gt >= 0 and gt < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', kg, ARGV[2])
    end
    out[i] = {1, g}
  end
end
return out
