"""The Lua scripts of the Redis / Valkey backend: every fenced operation is one of these.

Each script runs atomically on the server, so checking a receipt and acting on
it cannot be split by another client's command. A receipt names a stream entry,
the consumer that was given it and the delivery count it was given with
(``ARGV`` triples ``id, owner, count``); ``XPENDING key group id id 1`` inside
the script says who holds the entry now and how often it was delivered. If
either differs (or the entry is gone), that entry's result is 0 and nothing is
changed for it. (A receipt naming a fresh consumer ``c.fMS`` is honoured for an
entry ``c`` holds: a renewal moved it there, and the count still fences it.)
A bare ``XACK`` does not fence: it returns 1 for an entry some other consumer
holds now.

The lease is the entry's idle time. An entry read new is read by a *fresh*
consumer named for the lease (``consumer.fMS``): its idle time is 0 at delivery
and the lease ends when it reaches MS, with no further command; the next
receive's sweep takes it back then (``XCLAIM ... MS``, counting a delivery). A
renewal, or a receive that takes an entry back, sets the idle time to
``threshold - duration`` with ``XCLAIM ... IDLE ... JUSTID`` (which leaves the
delivery count alone) and hands the entry to the driver's own consumer, so its
idle time reaches the group's reclaim threshold exactly when the lease ends, and
the next receive's ``XAUTOCLAIM`` with that threshold takes it back.

Keys (all under one ``{hash tag}``, so a cluster keeps a queue on one slot):
``KEYS[1]`` the stream, ``KEYS[2]`` the delayed set (score: due time, ms),
``KEYS[3]`` the delayed messages' data (a hash), ``KEYS[4]`` the checkpoints
(a hash by entry id), ``KEYS[5]`` the time-to-live set (score: end, ms),
``KEYS[6]`` the reclaim cursor and when it last moved (a hash), ``KEYS[7]``
the dead-letter stream.
"""

from __future__ import annotations

__all__ = [
    "ABANDON",
    "CHECKPOINT",
    "CLOSE",
    "COMPLETE",
    "DEAD_LETTER",
    "HAS_ACKDEL",
    "RECEIVE",
    "RENEW",
    "SEND",
    "STATS",
]

#: Shared by every script: the server's time in ms, the stream's type check
#: (``NOQUEUE``/``WRONGTYPE`` errors name the key), the fence, and dropping an
#: entry with everything kept beside it.
_PRELUDE = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function stream_or_error(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'stream' then return nil end
  if kind == 'none' then return redis.error_reply('NOQUEUE no stream at ' .. key) end
  return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. kind .. ', not a stream')
end
-- A fresh consumer (``base.fMS``) holds entries read new, leased for MS from their
-- delivery; renewing one moves it to the base consumer, so a receipt naming a fresh
-- consumer is honoured for an entry its base holds (the count still fences it).
local function base_of(owner)
  return string.match(owner, '^(.*)%.f%d+$') or owner
end
local function held(s, g, ttl, id, owner, count, now)
  local p = redis.call('XPENDING', s, g, id, id, 1)[1]
  if not p or p[4] ~= tonumber(count) or (p[2] ~= owner and p[2] ~= base_of(owner)) then
    return false
  end
  if ttl then
    local ends = redis.call('ZSCORE', ttl, id)
    if ends and tonumber(ends) <= now then return false end
  end
  return true
end
local function before(a, b)
  -- Stream id order ('ms-seq', numbers of any length).
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end
local function fence(s, g, life, text, now)
  -- One XPENDING per owner over its receipts' first..last id (a receive's batch
  -- is a run of ids, in order): an id it holds is looked up there; one it does
  -- not is looked up alone unless that range was complete and held the id.
  local rid, rcount, rowner, spans, n = {}, {}, {}, {}, 0
  for id, count, owner in string.gmatch(text, '(%d+-%d+)/(%d+)/([^\\n]+)') do
    n = n + 1
    rid[n], rcount[n], rowner[n] = id, tonumber(count), owner
    local span = spans[owner]
    if not span then
      spans[owner] = {1, id, id}
    else
      span[1] = span[1] + 1
      span[3] = id
    end
  end
  local function rows_of(owner, span)
    local lo, hi = span[2], span[3]
    if before(hi, lo) then lo, hi = hi, lo end
    local limit = span[1] * 2 + 8
    local rows = redis.call('XPENDING', s, g, lo, hi, limit, owner)
    local mine = {}
    for _, p in ipairs(rows) do mine[p[1]] = p[4] end
    return {mine, #rows < limit, lo, hi}
  end
  local function within(got, id)
    return not before(id, got[3]) and not before(got[4], id)
  end
  local found, moved = {}, {}
  for owner, span in pairs(spans) do found[owner] = rows_of(owner, span) end
  local ids, owners, flags, lost = {}, {}, {}, 0
  for i = 1, n do
    local id, owner = rid[i], rowner[i]
    local got = found[owner]
    local c = got[1][id]
    if c == nil then
      local base, whole = base_of(owner), got[2]
      if base ~= owner then
        -- Renewed: its base holds it now (looked up over the same range, once).
        local m = moved[owner]
        if not m then
          m = rows_of(base, spans[owner])
          moved[owner] = m
        end
        c = m[1][id]
        whole = whole and m[2]
      end
      -- Not in a complete range that spans it: look it up alone.
      if c == nil and not (whole and within(got, id)) then
        local p = redis.call('XPENDING', s, g, id, id, 1)[1]
        if p and (p[2] == owner or p[2] == base) then c = p[4] end
      end
    end
    local ok = c == rcount[i]
    if ok and life then
      local ends = redis.call('ZSCORE', life, id)
      ok = not (ends and tonumber(ends) <= now)
    end
    if ok then
      ids[#ids + 1] = id
      owners[#ids] = owner
      flags[i] = '1'
    else
      flags[i] = '0'
      lost = lost + 1
    end
  end
  if lost == 0 then return ids, owners, string.rep('1', n) end
  return ids, owners, table.concat(flags)
end
local function claim(s, g, ids, owners, idle, to)
  local by = {}
  for i, id in ipairs(ids) do
    local o = to or base_of(owners[i])
    local list = by[o]
    if not list then
      list = {'XCLAIM', s, g, o, 0}
      by[o] = list
    end
    list[#list + 1] = id
  end
  for _, list in pairs(by) do
    list[#list + 1] = 'IDLE'
    list[#list + 1] = idle
    list[#list + 1] = 'JUSTID'
    redis.call(unpack(list))
  end
end
local function lives(ttl)
  if redis.call('EXISTS', ttl) == 1 then return ttl end
  return nil
end
local function drop(s, g, cp, ttl, id)
  redis.call('XACK', s, g, id)
  redis.call('XDEL', s, id)
  if cp then redis.call('HDEL', cp, id) end
  if ttl then redis.call('ZREM', ttl, id) end
end
"""

#: ARGV: count, then per message ``delay_ms, ttl_ms (-1: none), id (for a
#: delayed one), body, properties ('' : none)``. Returns the ids, in order.
SEND = (
    _PRELUDE
    + """
local s, delayed, data, ttl = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local err = stream_or_error(s)
if err then return err end
local now = now_ms()
local out = {}
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local delay, life, id, body, props =
    tonumber(ARGV[2 + i * 5]), tonumber(ARGV[3 + i * 5]), ARGV[4 + i * 5],
    ARGV[5 + i * 5], ARGV[6 + i * 5]
  if delay > 0 then
    redis.call('ZADD', delayed, now + delay, id)
    redis.call('HSET', data, id .. ':b', body, id .. ':t', now)
    if props ~= '' then redis.call('HSET', data, id .. ':p', props) end
    if life >= 0 then redis.call('HSET', data, id .. ':x', now + life) end
    out[i + 1] = id
  else
    local sid
    if props ~= '' then
      sid = redis.call('XADD', s, '*', 'b', body, 'p', props)
    else
      sid = redis.call('XADD', s, '*', 'b', body)
    end
    if life >= 0 then redis.call('ZADD', ttl, now + life, sid) end
    out[i + 1] = sid
  end
end
return out
"""
)

#: ARGV: group, consumer, max, idle (threshold - lease, ms), threshold (ms),
#: most delayed messages to move and expired ones to drop per call, how often
#: (ms) a receive that fills its batch with new entries looks for lapsed ones,
#: the fresh consumer (``consumer.fMS``, MS the lease) that reads new entries.
#: Returns two strings (a client parses a few bulk strings much faster than an
#: array per message): the headers, ten words per message joined by spaces —
#: ``entry count id sent dcount len(body) len(props) len(checkpoint)
#: len(reason) owner`` (``id``/``sent``: a delayed message's own id and send
#: time; ``dcount``/reason: a dead letter's; ``-`` or -1 where missing; owner
#: ``f``: the fresh consumer, ``b``: the consumer) — and every message's body,
#: properties, checkpoint and reason, concatenated.
#: With no message: ``!last-entry-id due-in-ms`` (see the driver's long poll).
RECEIVE = (
    _PRELUDE
    + """
local s, delayed, data, cp, ttl, cursor_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local g, me, want, idle, threshold, chores, fresh =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]),
  ARGV[8]
local err = stream_or_error(s)
if err then return err end
local now = now_ms()
-- Delayed messages that are due join the stream (keeping their id and send time).
local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, chores)
for _, id in ipairs(due) do
  local v = redis.call('HMGET', data, id .. ':b', id .. ':p', id .. ':t', id .. ':x')
  redis.call('ZREM', delayed, id)
  redis.call('HDEL', data, id .. ':b', id .. ':p', id .. ':t', id .. ':x')
  if v[1] and not (v[4] and tonumber(v[4]) <= now) then
    local sid
    if v[2] then
      sid = redis.call('XADD', s, '*', 'b', v[1], 'i', id, 't', v[3], 'p', v[2])
    else
      sid = redis.call('XADD', s, '*', 'b', v[1], 'i', id, 't', v[3])
    end
    if v[4] then redis.call('ZADD', ttl, v[4], sid) end
  end
end
-- Messages whose time-to-live passed go, leased or not.
local gone = redis.call('ZRANGEBYSCORE', ttl, '-inf', now, 'LIMIT', 0, chores)
for _, id in ipairs(gone) do drop(s, g, cp, ttl, id) end
-- Lapsed leases (idle reached the threshold), from the kept cursor, wrapping
-- once: at most every ARGV[7] ms, and whenever new entries do not fill the batch.
local taken, counts, new = {}, {}, {}
-- Entries read new wait with their fresh consumer (``me.fMS``): leased for MS from
-- their delivery, in delivery order, so a fresh consumer's oldest entries lapse
-- first. Take back the lapsed ones (counting a delivery); drop fresh consumers
-- that hold nothing (they come back with their next read).
local function sweep()
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', s, g)) do
    if #taken >= want then return end
    local name, holds = c[2], c[4]
    local d = tonumber(string.match(name, '%.f(%d+)$'))
    if d and holds == 0 then
      if name ~= fresh then redis.call('XGROUP', 'DELCONSUMER', s, g, name) end
    elseif d then
      local ids = {}
      for _, p in ipairs(redis.call('XPENDING', s, g, '-', '+', want - #taken, name)) do
        if p[3] < d then break end
        ids[#ids + 1] = p[1]
      end
      if #ids > 0 then
        for _, e in ipairs(redis.call('XCLAIM', s, g, me, d, unpack(ids))) do
          if e then taken[#taken + 1] = e end
        end
      end
    end
  end
end
local function reclaim()
  local cursor = redis.call('HGET', cursor_key, 'cursor') or '0-0'
  local start = cursor
  local first = #taken + 1
  for pass = 1, 2 do
    local r = redis.call('XAUTOCLAIM', s, g, me, threshold, cursor, 'COUNT', want - #taken)
    cursor = r[1]
    for _, e in ipairs(r[2]) do
      if e then taken[#taken + 1] = e end
    end
    if #taken >= want or cursor ~= '0-0' or start == '0-0' then break end
    start = '0-0'
  end
  redis.call('HSET', cursor_key, 'cursor', cursor, 'at', now)
  sweep()
  for i = first, #taken do
    counts[i] = redis.call('XPENDING', s, g, taken[i][1], taken[i][1], 1)[1][4]
  end
end
local reclaimed = false
if now - tonumber(redis.call('HGET', cursor_key, 'at') or '0') >= tonumber(ARGV[7]) then
  reclaim()
  reclaimed = true
end
if #taken < want then
  local r = redis.call('XREADGROUP', 'GROUP', g, fresh, 'COUNT', want - #taken, 'STREAMS', s, '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      taken[#taken + 1] = e
      counts[#taken] = 1
      new[#taken] = true
    end
  end
end
if #taken < want and not reclaimed then reclaim() end
if #taken == 0 then
  -- Nothing: say where the stream ends (a blocking XREAD from there wakes on the
  -- next send) and when the next delayed message is due (ms from now, -1: none).
  local last = redis.call('XREVRANGE', s, '+', '-', 'COUNT', 1)[1]
  local next_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')[2]
  local due_in = -1
  if next_due then due_in = math.max(0, tonumber(next_due) - now) end
  return '!' .. (last and last[1] or '0-0') .. ' ' .. due_in
end
-- Taken back entries get their lease as an idle time (XCLAIM ... IDLE ... JUSTID
-- counts no delivery); new ones have it already: idle 0 with their fresh consumer.
local ids, args, n = {}, {'XCLAIM', s, g, me, 0}, 5
for i, e in ipairs(taken) do
  ids[i] = e[1]
  if not new[i] then
    n = n + 1
    args[n] = e[1]
  end
end
if n > 5 then
  args[n + 1], args[n + 2], args[n + 3] = 'IDLE', idle, 'JUSTID'
  redis.call(unpack(args))
end
local points = {}
if redis.call('EXISTS', cp) == 1 then points = redis.call('HMGET', cp, unpack(ids)) end
local heads, out, k = {}, {}, 0
for i, e in ipairs(taken) do
  local f, point = e[2], points[i]
  local owner = new[i] and 'f' or 'b'
  if #f == 2 and f[1] == 'b' and not point then
    -- The common case: a body and nothing else.
    local body = f[2]
    heads[i] = e[1] .. ' ' .. counts[i] .. ' - - - ' .. #body .. ' -1 -1 -1 ' .. owner
    k = k + 1
    out[k] = body
  else
    local body, props, mid, sent, reason, dcount = '', nil, '-', '-', nil, '-'
    for j = 1, #f, 2 do
      local key = f[j]
      if key == 'b' then body = f[j + 1]
      elseif key == 'p' then props = f[j + 1]
      elseif key == 'i' then mid = f[j + 1]
      elseif key == 't' then sent = f[j + 1]
      elseif key == 'r' then reason = f[j + 1]
      elseif key == 'c' then dcount = f[j + 1]
      end
    end
    heads[i] = e[1] .. ' ' .. counts[i] .. ' ' .. mid .. ' ' .. sent .. ' ' .. dcount .. ' '
      .. #body .. ' ' .. (props and #props or -1) .. ' ' .. (point and #point or -1) .. ' '
      .. (reason and #reason or -1) .. ' ' .. owner
    k = k + 1
    out[k] = body
    if props then k = k + 1; out[k] = props end
    if point then k = k + 1; out[k] = point end
    if reason then k = k + 1; out[k] = reason end
  end
end
return {table.concat(heads, ' '), table.concat(out)}
"""
)

# Every fenced script below takes ARGV: group, the operation's own values, then
# the receipts as one text (``id/count/owner`` lines; the client checked their
# form), and returns one character per receipt: ``1`` (done) or ``0`` (stale,
# gone or expired). The held entries are then acted on together: one XCLAIM
# per owner, one XACK and one XDEL per batch. XCLAIM IDLE JUSTID sets the idle
# time (the lease) without counting a delivery.

#: ARGV[2]: the idle time that ends the lease when wanted (ms).
RENEW = (
    _PRELUDE
    + """
local s, ttl = KEYS[1], KEYS[5]
local err = stream_or_error(s)
if err then return err end
local ids, owners, flags = fence(s, ARGV[1], lives(ttl), ARGV[3], now_ms())
claim(s, ARGV[1], ids, owners, ARGV[2], nil)
return flags
"""
)

#: ARGV[2]: the parked consumer that holds abandoned messages; ARGV[3]: the
#: idle time that makes them reclaimable when the delay ends (ms).
ABANDON = (
    _PRELUDE
    + """
local s, ttl = KEYS[1], KEYS[5]
local err = stream_or_error(s)
if err then return err end
local ids, owners, flags = fence(s, ARGV[1], lives(ttl), ARGV[4], now_ms())
claim(s, ARGV[1], ids, owners, ARGV[3], ARGV[2])
return flags
"""
)

#: ARGV[2]: 1 to use XACKDEL (Redis >= 8.2), else XACK + XDEL.
COMPLETE = (
    _PRELUDE
    + """
local s, cp, ttl = KEYS[1], KEYS[4], KEYS[5]
local err = stream_or_error(s)
if err then return err end
local g, life = ARGV[1], lives(ttl)
local ids, owners, flags = fence(s, g, life, ARGV[3], now_ms())
if #ids > 0 then
  if ARGV[2] == '1' then
    redis.call('XACKDEL', s, g, 'IDS', #ids, unpack(ids))
  else
    redis.call('XACK', s, g, unpack(ids))
    redis.call('XDEL', s, unpack(ids))
  end
  if redis.call('EXISTS', cp) == 1 then redis.call('HDEL', cp, unpack(ids)) end
  if life then redis.call('ZREM', ttl, unpack(ids)) end
end
return flags
"""
)

#: ARGV[2]: the idle time (ms); then quads ``id, owner, count, data``.
CHECKPOINT = (
    _PRELUDE
    + """
local s, cp, ttl = KEYS[1], KEYS[4], KEYS[5]
local err = stream_or_error(s)
if err then return err end
local g, idle, now, out = ARGV[1], ARGV[2], now_ms(), {}
local life = lives(ttl)
for i = 3, #ARGV, 4 do
  local id, owner = ARGV[i], ARGV[i + 1]
  if held(s, g, life, id, owner, ARGV[i + 2], now) then
    redis.call('HSET', cp, id, ARGV[i + 3])
    redis.call('XCLAIM', s, g, base_of(owner), 0, id, 'IDLE', idle, 'JUSTID')
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""
)

#: ARGV: group, id, owner, count, reason. Moves the entry (its fields plus
#: ``i`` id, ``t`` send time, ``c`` delivery count, ``r`` reason) to the
#: dead-letter stream and drops it, in one step. Returns 1, or 0 if stale.
DEAD_LETTER = (
    _PRELUDE
    + """
local s, cp, ttl, dead = KEYS[1], KEYS[4], KEYS[5], KEYS[7]
local err = stream_or_error(s)
if err then return err end
local g, id, owner, count, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not held(s, g, ttl, id, owner, count, now_ms()) then return 0 end
local entry = redis.call('XRANGE', s, id, id)[1]
if not entry then
  drop(s, g, cp, ttl, id)
  return 0
end
local fields = {}
local have = {}
for j = 1, #entry[2], 2 do
  local k = entry[2][j]
  if k == 'b' or k == 'p' or k == 'i' or k == 't' then
    fields[#fields + 1] = k
    fields[#fields + 1] = entry[2][j + 1]
    have[k] = true
  end
end
if not have['i'] then
  fields[#fields + 1] = 'i'
  fields[#fields + 1] = id
end
if not have['t'] then
  fields[#fields + 1] = 't'
  fields[#fields + 1] = string.match(id, '^(%d+)')
end
redis.call('XADD', dead, '*', 'c', count, 'r', reason, unpack(fields))
drop(s, g, cp, ttl, id)
return 1
"""
)

#: ARGV: group, parked consumer, threshold (ms). Returns ``{stream length,
#: pending, pending lapsed, parked, parked lapsed, delayed, dead letters}``
#: after dropping messages whose time-to-live passed.
STATS = (
    _PRELUDE
    + """
local s, delayed, cp, ttl, dead = KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[7]
local err = stream_or_error(s)
if err then return err end
local g, parked, threshold = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
for _, id in ipairs(redis.call('ZRANGEBYSCORE', ttl, '-inf', now)) do drop(s, g, cp, ttl, id) end
local summary = redis.call('XPENDING', s, g)
local pending, parked_total = summary[1], 0
if summary[4] then
  for _, c in ipairs(summary[4]) do
    if c[1] == parked then parked_total = tonumber(c[2]) end
  end
end
local lapsed, parked_lapsed = 0, 0
if pending > 0 then
  lapsed = #redis.call('XPENDING', s, g, 'IDLE', threshold, '-', '+', pending)
  -- A fresh consumer's entries lapse at the lease in its name (those past the
  -- threshold too are counted above).
  for _, c in ipairs(summary[4]) do
    local d = tonumber(string.match(c[1], '%.f(%d+)$'))
    if d then
      local rows = redis.call('XPENDING', s, g, 'IDLE', d, '-', '+', tonumber(c[2]), c[1])
      for _, p in ipairs(rows) do
        if p[3] < tonumber(threshold) then lapsed = lapsed + 1 end
      end
    end
  end
  if parked_total > 0 then
    parked_lapsed = #redis.call('XPENDING', s, g, 'IDLE', threshold, '-', '+', parked_total, parked)
  end
end
local dl = redis.call('XLEN', dead)
return {redis.call('XLEN', s), pending, lapsed, parked_total, parked_lapsed,
  redis.call('ZCARD', delayed), dl}
"""
)

#: ARGV: group, consumers. Deletes each consumer from the group if it holds
#: nothing (XGROUP DELCONSUMER would drop the entries it holds). Returns how
#: many were deleted.
CLOSE = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then return 0 end
local n = 0
for i = 2, #ARGV do
  local ok, held = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[i])
  if ok and #held == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[i])
    n = n + 1
  end
end
return n
"""

#: ARGV: group. 1 if the server has XACKDEL (Redis >= 8.2, Valkey >= 9.2), else
#: 0; the probe acknowledges entry 0-1, which no stream holds.
HAS_ACKDEL = """
local ok = pcall(redis.call, 'XACKDEL', KEYS[1], ARGV[1], 'IDS', 1, '0-1')
if ok then return 1 end
return 0
"""
