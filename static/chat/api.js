// The /api/v1 client: same-origin fetch with the session cookie and Django's CSRF token.

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

export class ApiError extends Error {
  // `retryAfter`: seconds from a 429's Retry-After header, else null.
  constructor(status, code, message, body, retryAfter = null) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
    this.body = body;
    this.retryAfter = retryAfter;
  }
}

// A body that is not JSON (a proxy's error page, or none) reads as null.
async function jsonOrNull(response) {
  try {
    return await response.json();
  } catch {
    return null;
  }
}

// `keepalive`: the request outlives the page (a delete sent as the tab closes).
async function request(method, path, { query, body, signal, headers, keepalive } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
  }
  const init = { method, credentials: "same-origin", signal, keepalive, headers: { Accept: "application/json", ...headers } };
  if (method !== "GET") init.headers["X-CSRFToken"] = csrfToken();
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(url, init);
  if (response.status === 204) return null;
  const data = await jsonOrNull(response);
  if (!response.ok) {
    const err = (data && data.error) || {};
    const retryAfter = Number.parseInt(response.headers.get("Retry-After") || "", 10);
    throw new ApiError(response.status, err.code, err.message, data, Number.isNaN(retryAfter) ? null : retryAfter);
  }
  return data;
}

export const api = {
  sessions: (cursor) => request("GET", "/api/v1/chat/sessions", { query: { cursor, limit: 20 } }),
  createSession: (body) => request("POST", "/api/v1/chat/sessions", { body }),
  session: (id) => request("GET", `/api/v1/chat/sessions/${id}`),
  renameSession: (id, title) => request("PATCH", `/api/v1/chat/sessions/${id}`, { body: { title } }),
  updateSession: (id, body) => request("PATCH", `/api/v1/chat/sessions/${id}`, { body }),
  deleteSession: (id, { keepalive = false } = {}) => request("DELETE", `/api/v1/chat/sessions/${id}`, { keepalive }),
  history: (sessionId, params) =>
    request("GET", "/api/v1/chat/history", { query: { session_id: sessionId, render: "html", ...params } }),
  // Message search, newest first; `before`: the previous page's `next_cursor`.
  search: (params, signal) => request("GET", "/api/v1/chat/search", { query: params, signal }),
  turns: (sessionId, cursor) =>
    request("GET", "/api/v1/chat/history/turns", { query: { session_id: sessionId, cursor, limit: 200 } }),
  // JSON: answers once the reply is finished; the socket carries its events meanwhile.
  regenerate: (body) => request("POST", "/api/v1/chat/regenerate", { body }),
  truncate: (sessionId, messageId) =>
    request("POST", "/api/v1/chat/truncate", { body: { session_id: sessionId, message_id: messageId } }),
  context: (sessionId) => request("GET", `/api/v1/chat/sessions/${sessionId}/context`, { query: { snapshots_limit: 1 } }),
  // The compaction history, newest first; `before`: the previous page's `next_before`.
  snapshots: (sessionId, before) =>
    request("GET", `/api/v1/chat/sessions/${sessionId}/snapshots`, { query: { before, limit: 20 } }),
  compact: (sessionId) => request("POST", `/api/v1/chat/sessions/${sessionId}/compact`, { body: {} }),
  agents: () => request("GET", "/api/v1/agents"),
  agent: (id) => request("GET", `/api/v1/agents/${id}`),
  createAgent: (body) => request("POST", "/api/v1/agents", { body }),
  updateAgent: (id, body) => request("PATCH", `/api/v1/agents/${id}`, { body }),
  deleteAgent: (id) => request("DELETE", `/api/v1/agents/${id}`),
  dailyNote: (agentId, date) => request("GET", `/api/v1/agents/${agentId}/memory/daily`, { query: { date } }),
  memoryEntries: (agentId, q) => request("GET", `/api/v1/agents/${agentId}/memory/entries`, { query: { q } }),
  updateEntry: (agentId, name, content) =>
    request("PATCH", `/api/v1/agents/${agentId}/memory/entries/${encodeURIComponent(name)}`, { body: { content } }),
  deleteEntry: (agentId, name) =>
    request("DELETE", `/api/v1/agents/${agentId}/memory/entries/${encodeURIComponent(name)}`),
  remember: (agentId, content, messageId) =>
    request("POST", `/api/v1/agents/${agentId}/memory/entries`, {
      body: { content, source_message_id: messageId },
    }),
};

// POST with `Accept: text/event-stream`: the REST fallback of the WebSocket (same events).
export async function streamPost(path, body, onEvent, signal) {
  const response = await fetch(path, {
    method: "POST",
    credentials: "same-origin",
    signal,
    headers: { "Content-Type": "application/json", Accept: "text/event-stream", "X-CSRFToken": csrfToken() },
    body: JSON.stringify(body),
  });
  if (!response.ok || !response.body) {
    const data = await jsonOrNull(response);
    const err = (data && data.error) || {};
    throw new ApiError(response.status, err.code, err.message, data);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let split;
    while ((split = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, split);
      buffer = buffer.slice(split + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (data) onEvent(JSON.parse(data));
    }
  }
}
