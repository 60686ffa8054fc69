-- Attach or history read: ARGV = base (lib.lua), subject, mode ('attach' or
-- 'read'), age limit ms, a fresh epoch, since epoch ('' for none), since
-- offset, limit, byte limit, the master's replication id ('' = none;
-- lib.lua, "failover": a read renews a stream from before a failover);
-- and for an attach that joins the subject's presence: node id, member
-- id, user ('' = none), info ('' = none), most members, lease ms. A join
-- refused by the cap answers the error "presence_full" and changes
-- nothing.
-- An attach creates the subject's stream if Redis has none (its node has
-- just subscribed to the channel) and keeps it from expiring; a read of an
-- unknown subject answers with the fresh epoch at offset 0, which no stream
-- will share.
-- Returns {epoch, offset, recovered (-1 none asked, 0, 1), bytes, messages,
-- evictions, subjects, entries...}.
local s, mode, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4])
local since_epoch, since_offset = ARGV[6], tonumber(ARGV[7])
local limit, max_cost = tonumber(ARGV[8]), tonumber(ARGV[9])
local replid = ARGV[10]
local now = now_ms()
local epoch, offset
if mode == 'attach' and ARGV[11] then
  local joined = presence_join(s, ARGV[11], ARGV[12], ARGV[13], ARGV[14],
    tonumber(ARGV[15]), now, tonumber(ARGV[16]))
  if not joined then return redis.error_reply('presence_full') end
end
if mode == 'attach' then
  epoch, offset = stream(s, ARGV[5], ttl, replid)
  redis.call('PERSIST', meta_key(s))
else
  epoch = redis.call('HGET', meta_key(s), 'e')
  if not epoch then
    local flag = -1
    if since_epoch ~= '' then flag = 0 end
    return {ARGV[5], 0, flag, settle()}
  end
  epoch = renew_if_moved(s, epoch, redis.call('HGET', meta_key(s), 'r'), ARGV[5], replid)
end
if ttl > 0 then expire(s, now, ttl, false) end
offset = tonumber(redis.call('HGET', meta_key(s), 'o'))
local flag, entries = -1, {}
if since_epoch ~= '' then
  flag, entries = recover(s, epoch, offset, since_epoch, since_offset, limit, max_cost)
elseif mode == 'read' and limit > 0 then
  entries = redis.call('LRANGE', hist_key(s), -limit, -1)
end
local b, m, e, n = settle()
local reply = {epoch, offset, flag, b, m, e, n}
for _, entry in ipairs(entries) do reply[#reply + 1] = entry end
return reply
