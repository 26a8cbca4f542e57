-- getlease.lua for several keys of one slot, in one call: for key i, KEYS[3i-2]
-- is its values hash, KEYS[3i-1] its fill lease, KEYS[3i] its generation, and
-- ARGV[5+i] its representation's field. ARGV: token, lease ms, after (unix
-- ms), ttl ms of a generation created here, force (1: every value unusable).
-- Returns one reply per key, shaped as getlease.lua's.
local out = {}
for i = 1, #KEYS / 3 do
  local kv, kl, kg, field = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[5 + i]
  local g = redis.call('GET', kg)
  if not g then
    local t = redis.call('TIME')
    g = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
    redis.call('SET', kg, g, 'PX', ARGV[4])
  end
  local done = false
  local v = redis.call('HGET', kv, field)
  if v and ARGV[5] ~= '1' and string.len(v) >= 32 and string.sub(v, 1, 2) == 'cg' and string.byte(v, 3) == 2 then
    local fresh, vg = 0, 0
    for j = 5, 12 do fresh = fresh * 256 + string.byte(v, j) end
    for j = 25, 32 do vg = vg * 256 + string.byte(v, j) end
    if vg == tonumber(g) and fresh > tonumber(ARGV[3]) then
      out[i] = {0, v, g}
      done = true
    end
  end
  if not done then
    local mine = g .. ' ' .. ARGV[1]
    local cur = redis.call('GET', kl)
    if cur == mine then
      out[i] = {1, g}
    else
      local held = false
      if cur then
        local sp = string.find(cur, ' ', 1, true)
        if sp and string.sub(cur, 1, sp - 1) == g then
          local pttl = redis.call('PTTL', kl)
          if pttl < 0 then pttl = 0 end
          out[i] = {2, pttl, string.sub(cur, sp + 1), g}
          held = true
        end
      end
      if not held then
        redis.call('SET', kl, mine, 'PX', ARGV[2])
        local gt = redis.call('PTTL', kg)
        if gt >= 0 and gt < tonumber(ARGV[2]) then
          redis.call('PEXPIRE', kg, ARGV[2])
        end
        out[i] = {1, g}
      end
    end
  end
end
return out
