// A small client for `bridge serve` (docs/feeds.md), for browsers and
// Node 18+ (fetch). It keeps a Map of rows by key for one filtered feed:
//
//   const rows = new Map();
//   const stop = follow("http://127.0.0.1:8090", {
//     tables: "public.orders",
//     where: { and: [{ eq: ["tenant_id", 42] }, { in: ["status", ["open", "paid"]] }] },
//     columns: "id,status,total",
//   }, {
//     onChange: (c) => apply(rows, c),
//     onUpToDate: () => render(rows),
//     onRefetch: async () => { rows.clear(); /* re-read your snapshot here */ },
//   });
//
// The token travels with the client: any server of the fleet can answer
// the next poll, and nothing is missed or repeated.

export function feedURL(base, filter, token) {
  const q = new URLSearchParams();
  if (filter.tables) q.set("tables", filter.tables);
  if (filter.ops) q.set("ops", filter.ops);
  if (filter.columns) q.set("columns", filter.columns);
  if (filter.where) q.set("where", JSON.stringify(filter.where));
  q.set("token", token || "now");
  return `${base}/v1/feed?${q}`;
}

// apply folds one change into a Map keyed by the row's key.
export function apply(rows, c) {
  const key = JSON.stringify(c.key);
  if (c.op === "delete") rows.delete(key);
  else rows.set(key, { ...(rows.get(key) || {}), ...c.after });
}

// follow long-polls until stop() is called. A 409 (must-refetch) calls
// onRefetch, then starts again from the position the server returned.
export function follow(base, filter, { onChange, onUpToDate, onRefetch, token } = {}) {
  let stopped = false;
  let ctl = new AbortController();
  (async () => {
    let backoff = 250;
    while (!stopped) {
      try {
        const res = await fetch(feedURL(base, filter, token), { signal: ctl.signal });
        if (res.status === 409) {
          const body = await res.json();
          if (onRefetch) await onRefetch(body.reason);
          token = body.position;
          continue;
        }
        if (res.status === 429 || res.status === 503) {
          const s = Number(res.headers.get("Retry-After") || 1);
          await sleep(s * 1000);
          continue;
        }
        if (!res.ok) throw new Error(`${res.status}: ${await res.text()}`);
        const batch = await res.json();
        for (const c of batch.changes) onChange && onChange(c);
        token = batch.token; // resume after this batch, on any server
        if (batch.up_to_date && onUpToDate) onUpToDate(token);
        backoff = 250;
      } catch (err) {
        if (stopped) return;
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
      }
    }
  })();
  return () => { stopped = true; ctl.abort(); };
}

// stream is the same over server-sent events (browsers only: EventSource).
// EventSource resends the last event id itself when it reconnects, so a
// dropped or "slow" connection resumes without loss.
export function stream(base, filter, { onChange, onUpToDate, onRefetch, token } = {}) {
  const url = feedURL(base, filter, token) + "&sse=1";
  const es = new EventSource(url);
  es.addEventListener("changes", (ev) => {
    for (const c of JSON.parse(ev.data).changes) onChange && onChange(c);
  });
  es.addEventListener("up-to-date", (ev) => onUpToDate && onUpToDate(ev.lastEventId));
  es.addEventListener("must-refetch", async (ev) => {
    es.close();
    const body = JSON.parse(ev.data);
    if (onRefetch) await onRefetch(body.reason);
    stream(base, filter, { onChange, onUpToDate, onRefetch, token: body.position });
  });
  return () => es.close();
}

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }
