-- A deliberately broken lock for negative controls (never use it): takes
-- the lock with SET PX, with NX unless ARGV[3] is '0', and a fence from INCR.
-- KEYS[1] lock, KEYS[2] fence counter. ARGV: token, lease ms, nx (1/0).
-- Returns the fence, or 0 when refused.
local ok
if ARGV[3] == '1' then
  ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
else
  ok = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if not ok then return 0 end
return redis.call('INCR', KEYS[2])
