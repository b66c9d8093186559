-- wrk script: POST /v1/chat/completions with a ~1 KiB user prompt.
-- Env: STREAM=1 for "stream": true; MAX_TOKENS (default 16); MODEL (default moongate-sim);
-- AUTH_KEY: sent as `Authorization: Bearer <key>` (a gateway with client keys);
-- UNIQUE=1: a different prompt each request; ROUTE: another route with the same text instead
-- (`embeddings`, `classify`, `tokenize`, `responses`: as `input` or `prompt`; `rerank`: as
-- the first of two documents; `score`: as the one item).
local stream = os.getenv("STREAM") == "1"
local max_tokens = tonumber(os.getenv("MAX_TOKENS") or "16")
local model = os.getenv("MODEL") or "moongate-sim"
local prompt = string.rep("The quick brown fox jumps over the lazy dog. ", 23) -- 1035 bytes
wrk.method = "POST"
local route = os.getenv("ROUTE") or ""
local paths = {
  embeddings = "/v1/embeddings", rerank = "/v1/rerank", classify = "/v1/classify",
  score = "/v1/score", tokenize = "/v1/tokenize", responses = "/v1/responses",
}
wrk.path = paths[route] or "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
local key = os.getenv("AUTH_KEY")
if key and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end
local function body(content)
  local m = '{"model":"' .. model .. '",'
  if route == "embeddings" or route == "classify" or route == "responses" then
    return m .. '"input":"' .. content .. '"}'
  elseif route == "tokenize" then
    return m .. '"prompt":"' .. content .. '"}'
  elseif route == "rerank" then
    return m .. '"query":"a quick fox","documents":["' .. content .. '","a lazy dog"]}'
  elseif route == "score" then
    return m .. '"query":"a quick fox","items":["' .. content .. '"],"label_token_ids":[1,2]}'
  end
  return m .. '"messages":[{"role":"user","content":"' .. content ..
    '"}],"max_tokens":' .. max_tokens .. ',"stream":' .. (stream and "true" or "false") .. '}'
end
wrk.body = body(prompt)
-- UNIQUE=1: every request's prompt ends with its own number (no two prompts alike, in
-- this run or an earlier one: the numbers start from the clock).
if os.getenv("UNIQUE") == "1" then
  local run, n = tostring(os.time()), 0
  request = function()
    n = n + 1
    return wrk.format(nil, nil, nil, body(prompt .. run .. "-" .. n))
  end
end

-- One machine-readable line at the end (latencies in ms).
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT %d %.1f %.3f %.3f %d\n',
    summary.requests, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.connect + e.read + e.write + e.status + e.timeout))
end
