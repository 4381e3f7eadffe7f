// node demo.mjs http://127.0.0.1:8090 '{"eq":["tenant_id",42]}'
// Prints the rows of one filtered feed as they change.
import { follow, apply } from "./feed.js";

const [base = "http://127.0.0.1:8090", where] = process.argv.slice(2);
const rows = new Map();
follow(base, { where: where ? JSON.parse(where) : undefined }, {
  onChange: (c) => { apply(rows, c); console.log(c.op, JSON.stringify(c.key), c.moved || ""); },
  onUpToDate: (token) => console.log(`up to date at ${token}: ${rows.size} rows`),
  onRefetch: (reason) => { console.log(`must refetch (${reason})`); rows.clear(); },
});
