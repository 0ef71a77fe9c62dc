-- taskq schema v2: the trace context of the enqueuing request (e.g. a W3C `traceparent`),
-- so the handler's span can be linked to it.
ALTER TABLE taskq_tasks ADD COLUMN trace_context VARCHAR(512) NULL AFTER idempotency_key;
