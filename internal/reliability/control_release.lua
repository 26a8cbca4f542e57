-- The broken lock's release: deletes the lock only when it holds the caller's
-- token, unless ARGV[2] is '0' (the control without the token check).
-- KEYS[1] lock. ARGV: token, check (1/0). Returns 1 when deleted, 0 otherwise.
if ARGV[2] == '1' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
