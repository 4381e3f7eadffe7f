#!/bin/sh
# The compose quickstart's sample writer: waits until the bridge streams
# from its slot, creates public.orders, then commits an INSERT and an UPDATE
# of the previous row per transaction, every INTERVAL seconds, forever (or
# ITERATIONS times). Connection settings come from the PG* variables.
set -eu

SLOT="${SLOT:-bridge_shop}"
INTERVAL="${INTERVAL:-1}"
ITERATIONS="${ITERATIONS:-0}"   # 0: forever

q() { psql -v ON_ERROR_STOP=1 -qtAX "$@"; }

until [ "$(q -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$SLOT' AND active" 2>/dev/null || true)" = "1" ]; do
  echo "writer: waiting for the bridge to stream from slot $SLOT"
  sleep 1
done

q <<'SQL'
CREATE TABLE IF NOT EXISTS public.orders (
  id         bigserial PRIMARY KEY,
  customer   text NOT NULL,
  total      numeric(10,2) NOT NULL,
  status     text NOT NULL DEFAULT 'new',
  updated_at timestamptz NOT NULL DEFAULT now()
);
SQL
echo "writer: writing to public.orders"

i=0
while [ "$ITERATIONS" -eq 0 ] || [ "$i" -lt "$ITERATIONS" ]; do
  i=$((i + 1))
  q <<SQL
BEGIN;
UPDATE public.orders SET status = 'paid', updated_at = now()
 WHERE id = (SELECT max(id) FROM public.orders) AND status = 'new';
INSERT INTO public.orders (customer, total) VALUES ('customer-$i', $i.50);
COMMIT;
SQL
  echo "writer: transaction $i committed"
  sleep "$INTERVAL"
done
